"""One functional SGD / Adam step, shared by every estimator that simulates training; per-layer
parameter groups of a ``torch.optim`` optimizer that keep the user's own groups.

``k_step_gain`` runs many stacked training runs, ADS probes the path of a few full-batch steps,
and the structural masks replay Adam's update for re-activated units. All of them need the same
update rule, written once here on plain dicts of tensors (no ``torch.optim`` object, so the
parameters can be stacked, vmapped or indexed freely).

.. math::
    m_t = β_1 m_{t-1} + (1-β_1) g, \\quad v_t = β_2 v_{t-1} + (1-β_2) g^2, \\quad
    Δ_t = η \\frac{m_t / (1-β_1^t)}{\\sqrt{v_t / (1-β_2^t)} + ε}

and ``Δ = η g`` for SGD; the parameters move by ``-Δ``.

:func:`split_param_groups` / :func:`restore_param_groups` turn a ``torch.optim`` optimizer's own
parameter groups (the user's: a head at one rate, a body with weight decay, ...) into one group
per *(slot, user group)* pair — a slot is a layer — and back, on the same optimizer object, so
its per-parameter state (momentum buffers, Adam moments, keyed by parameter) is kept. A built
group copies every setting of its user group (weight decay, momentum, nesterov, betas, eps, ...)
and gets the rate ``r_g · f_k``: the user group's ``lr`` (or one common ``base``) times the slot's
factor. Restoring gives back the same groups, in the same order, with the same settings and the
same parameters in their original order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["OPTIMIZERS", "AdamState", "ParamGroupSplit", "adam_update", "functional_step", "restore_param_groups",
           "split_param_groups"]

OPTIMIZERS = ("sgd", "adam")


class AdamState:
    """Adam's first and second moments for a dict of tensors, with a shared step count.

    Example:
        >>> state = AdamState({"w": torch.zeros(2)})
        >>> state.step, sorted(state.first)
        (0, ['w'])
    """

    def __init__(self, like: Mapping[str, torch.Tensor], *, betas=(0.9, 0.999), eps: float = 1e-8,
                 step: int = 0):
        self.first = {name: torch.zeros_like(t) for name, t in like.items()}
        self.second = {name: torch.zeros_like(t) for name, t in like.items()}
        self.betas = tuple(betas)
        self.eps = float(eps)
        self.step = int(step)


def adam_update(first: torch.Tensor, second: torch.Tensor, step, lr: float, betas, eps: float
                ) -> torch.Tensor:
    """``η m̂ / (√v̂ + ε)`` from Adam's moments after ``step`` updates (``step`` may be a tensor
    of per-entry counts that broadcasts against the moments).

    Example:
        >>> adam_update(torch.tensor([0.1]), torch.tensor([0.001]), 1, 0.5, (0.9, 0.999), 0.0)
        tensor([0.5000])
    """
    beta1, beta2 = betas
    denom = (second / (1 - beta2 ** step)).sqrt().add_(eps)
    return lr * (first / (1 - beta1 ** step)) / denom


def functional_step(params: dict, grads: Mapping[str, torch.Tensor], lr: float, *,
                    optimizer: str = "sgd", state: AdamState | None = None,
                    in_place: bool = True) -> dict:
    """One SGD or Adam step on ``params`` (a dict of tensors) with gradients ``grads``.

    Returns the update ``Δ`` per name (the parameters move by ``-Δ``). With ``in_place=True`` the
    tensors of ``params`` are updated in place; otherwise ``params`` is left alone and the caller
    applies ``Δ``. Adam needs ``state`` (:class:`AdamState`), whose moments and step count advance.

    Example:
        >>> p = {"w": torch.tensor([1.0])}
        >>> functional_step(p, {"w": torch.tensor([2.0])}, 0.25)["w"], p["w"]
        (tensor([0.5000]), tensor([0.5000]))
        >>> s = AdamState(p)
        >>> functional_step(p, {"w": torch.tensor([-3.0])}, 0.1, optimizer="adam", state=s)["w"]
        tensor([-0.1000])
    """
    if optimizer == "sgd":
        updates = {name: lr * g for name, g in grads.items()}
    elif optimizer == "adam":
        if state is None:
            raise ValueError("optimizer='adam' needs state=AdamState(params)")
        state.step += 1
        beta1, beta2 = state.betas
        updates = {}
        for name, g in grads.items():
            state.first[name].mul_(beta1).add_(g, alpha=1 - beta1)
            state.second[name].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            updates[name] = adam_update(state.first[name], state.second[name], state.step, lr,
                                        state.betas, state.eps)
    else:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if in_place:
        for name, update in updates.items():
            params[name].sub_(update)
    return updates


# --------------------------------------------------------------------------------------------
# per-slot parameter groups over the user's own groups


@dataclass
class ParamGroupSplit:
    """What :func:`split_param_groups` did, for :func:`restore_param_groups`.

    ``user_groups``: the optimizer's groups before the split, each ``(settings, params)`` (every
    key but ``params``, and the parameters in their order). ``built``: per group of the split
    optimizer, in its order, ``(user group index, slot or None, factor, lr set)``; ``None`` is the
    slot of parameters outside every slot (factor 1).
    """

    user_groups: list[tuple[dict, list]]
    built: list[tuple[int, int | None, float, object]] = field(default_factory=list)
    names: dict[int, str] | None = None  # id(param) -> name, for an optimizer on named parameters

    def rates(self) -> list[float]:
        """The ``lr`` of every built group, in the optimizer's order."""
        return [float(lr) for *_, lr in self.built]


def split_param_groups(optimizer: torch.optim.Optimizer, slot_of: Mapping[int, int], factors: Sequence[float], *,
                       base=None) -> ParamGroupSplit:
    """Replace ``optimizer``'s groups by one group per (slot, user group) pair, in place.

    A parameter ``p`` of user group ``g`` (lr ``r_g``) goes to slot ``k = slot_of[id(p)]`` and
    trains at ``lr = b_g · factors[k]`` with ``b_g = r_g`` (``base=None``) or ``b_g = base``; a
    parameter absent from ``slot_of`` stays at ``b_g`` in the last group of its user group. Every
    other setting of the user group is copied. Groups are ordered by slot, then by user group, the
    unslotted ones last; empty pairs are not built. The per-parameter state is untouched.

    Example:
        >>> a, b, c = (torch.nn.Parameter(torch.zeros(1)) for _ in range(3))
        >>> opt = torch.optim.SGD([{"params": [a, b], "weight_decay": 0.1}, {"params": [c], "lr": 1.0}], lr=0.5)
        >>> split = split_param_groups(opt, {id(a): 0, id(b): 1, id(c): 1}, [0.25, 1.0])
        >>> [(g["lr"], g["weight_decay"], len(g["params"])) for g in opt.param_groups]
        [(0.125, 0.1, 1), (0.5, 0.1, 1), (1.0, 0, 1)]
        >>> restore_param_groups(opt, split)
        []
        >>> [(g["lr"], g["weight_decay"], len(g["params"])) for g in opt.param_groups]
        [(0.5, 0.1, 2), (1.0, 0, 1)]
    """
    user_groups = [({k: v for k, v in group.items() if k not in _PER_PARAM}, list(group["params"]))
                   for group in optimizer.param_groups]
    names = _param_names(optimizer.param_groups)
    if names is not None and any(id(p) not in names for _, params in user_groups for p in params):
        raise ValueError("the optimizer's param_names do not line up with its params in every group: "
                         "build it on model.named_parameters() for every group, or on parameters only")
    n_slots = len(factors)
    members: dict[tuple[int, int], list] = {}  # (slot or n_slots for the unslotted, user group) -> params
    for g, (_, params) in enumerate(user_groups):
        for param in params:
            slot = slot_of.get(id(param))
            if slot is not None and not 0 <= slot < n_slots:
                raise ValueError(f"slot_of maps a parameter to slot {slot}, outside the {n_slots} factors")
            members.setdefault((n_slots if slot is None else slot, g), []).append(param)
    split = ParamGroupSplit(user_groups, names=names)
    optimizer.param_groups.clear()
    for slot, g in sorted(members):
        settings, params = user_groups[g][0], members[slot, g]
        factor = 1.0 if slot == n_slots else float(factors[slot])
        lr = (settings["lr"] if base is None else base) * factor
        named = {} if names is None else {"param_names": [names[id(p)] for p in params]}
        optimizer.add_param_group({**settings, "params": params, **named, "lr": lr})
        split.built.append((g, None if slot == n_slots else slot, factor, lr))
    return split


_PER_PARAM = ("params", "param_names")  # a group's per-parameter lists; every other key is a setting


def _param_names(groups) -> dict[int, str] | None:
    """``id(param) -> name`` of an optimizer built on named parameters (torch's ``param_names``),
    from the groups whose names line up with their parameters; None for an unnamed optimizer."""
    if not any("param_names" in group for group in groups):
        return None
    return {id(p): name for group in groups if len(group.get("param_names", ())) == len(group["params"])
            for p, name in zip(group["params"], group["param_names"])}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and bool(torch.equal(a, b))
    return a == b


def _scale(now, set_to) -> float:
    """``now / set_to`` of a group's ``lr`` (1 for 0 -> 0, inf for 0 -> non-zero)."""
    now, set_to = float(now), float(set_to)
    if set_to == 0:
        return 1.0 if now == 0 else math.inf
    return now / set_to


def _restored_settings(saved: dict, built: list[tuple[dict, object]]) -> tuple[dict, list[str]]:
    """A user group's settings after the split: a setting changed alike on all of its built groups
    (``lr`` by one common factor, e.g. a scheduler's step) is kept, one changed unevenly is not
    (its saved value, and its name in the second value returned)."""
    settings, uneven = dict(saved), []
    for key, value in saved.items():
        if key == "lr":
            scales = [_scale(group["lr"], lr) for group, lr in built]
            if all(math.isclose(s, 1.0, rel_tol=1e-9) for s in scales):
                continue
            if all(math.isfinite(s) and math.isclose(s, scales[0], rel_tol=1e-9) for s in scales):
                settings["lr"] = value * scales[0]
            else:
                uneven.append("lr")
            continue
        values = [group.get(key, value) for group, _ in built]
        if all(_same(v, value) for v in values):
            continue
        if all(_same(v, values[0]) for v in values):
            settings[key] = values[0]
        else:
            uneven.append(key)
    return settings, uneven


def restore_param_groups(optimizer: torch.optim.Optimizer, split: ParamGroupSplit) -> list[tuple[int, str]]:
    """Give ``optimizer`` back the user groups ``split`` replaced, in place: the same groups in the
    same order, their settings, and their parameters in their original order.

    What changed on the optimizer since the split is followed: a parameter swapped into or added
    to a built group since (Avalanche's ``make_optimizer`` mid-experience) joins that group's user
    group, after the user group's own parameters; a parameter no longer in any group is left out;
    a setting changed alike on every built group of a user group is kept (``lr``: by a common
    factor). A setting changed unevenly cannot be mapped back: the user group gets its value from
    before the split, and the returned list names it as ``(user group index, setting)``. Groups
    added since the split are kept, after the user groups.
    """
    position = {id(p): (g, i) for g, (_, params) in enumerate(split.user_groups) for i, p in enumerate(params)}
    n_built = len(split.built)
    current, added = optimizer.param_groups[:n_built], optimizer.param_groups[n_built:]
    kept: list[list[tuple[int, object]]] = [[] for _ in split.user_groups]
    joined: list[list] = [[] for _ in split.user_groups]
    built_of: list[list[tuple[dict, object]]] = [[] for _ in split.user_groups]
    for group, (owner, _, _, lr) in zip(current, split.built):
        built_of[owner].append((group, lr))
        for param in group["params"]:
            g, i = position.get(id(param), (None, None))
            if g is None:
                joined[owner].append(param)
            else:
                kept[g].append((i, param))
    uneven: list[tuple[int, str]] = []
    names = None if split.names is None else {**split.names, **(_param_names(current) or {})}
    optimizer.param_groups.clear()
    for g, (saved, _) in enumerate(split.user_groups):
        settings, changed = _restored_settings(saved, built_of[g]) if built_of[g] else (dict(saved), [])
        params = [p for _, p in sorted(kept[g], key=lambda item: item[0])] + joined[g]
        group = {**settings, "params": params}
        if names is not None:
            if all(id(p) in names for p in params):
                group["param_names"] = [names[id(p)] for p in params]
            else:  # a parameter added since the split without a name: the group cannot say every name
                changed.append("param_names")
        uneven.extend((g, key) for key in changed)
        optimizer.param_groups.append(group)
    optimizer.param_groups.extend(added)
    return uneven
