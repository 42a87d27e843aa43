"""Per-layer logit changes for ADS: the layer groups (fan-in = architecture term) and the
Jacobian-vector products ``J_ℓ(x) u_ℓ`` of every group, stacked in one vmapped ``torch.func.jvp``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import jvp, vmap

from avalanche_plugins.core.calls import (
    eval_mode,
    iterate_batches,
    math_attention,
    split_params,
    stateless_forward,
    task_groups,
)
from avalanche_plugins.core.checks import check_inputs
from avalanche_plugins.core.layers import LayerMap

__all__ = ["UNASSIGNED", "LayerGroup", "layer_groups", "layer_logit_changes"]


UNASSIGNED = "(unassigned)"
_GROUPS_PER_CALL = 4  # consecutive layer groups per vmapped JVP call (layer_logit_changes)




@dataclass(frozen=True)
class LayerGroup:
    """Trainable parameters of one layer (or of no layer) and the group's architecture term."""

    name: str
    fan_in: int
    params: tuple[str, ...]



def _fan_in(layer) -> int:
    """``n_{ℓ−1}``: the weight's fan-in for Linear/Conv (``in_channels/groups × kernel``), else
    the layer map's ``in_units``."""
    weight = getattr(layer.module, "weight", None)
    if layer.kind in ("linear", "conv") and isinstance(weight, torch.Tensor) and weight.dim() >= 2:
        return int(weight[0].numel())
    return max(1, int(layer.in_units))



def layer_groups(model: nn.Module, layer_map: LayerMap) -> list[LayerGroup]:
    """Partition the trainable parameters into per-layer groups (module docstring rules).

    Example:
        >>> from avalanche_plugins.core.layers import discover_layers
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> [(g.name, g.fan_in, g.params) for g in layer_groups(net, discover_layers(net, torch.randn(2, 4)))]
        [('0', 4, ('0.weight', '0.bias')), ('2', 8, ('2.weight', '2.bias'))]
    """
    index_of, leftovers = layer_map.attach_parameters()
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise ValueError(f"model {type(model).__name__} has no trainable parameters "
                         "(every parameter has requires_grad=False)")
    groups = []
    for layer in layer_map:
        names = tuple(n for n in trainable if index_of.get(n) == layer.index)
        if names:
            groups.append(LayerGroup(layer.name, _fan_in(layer), names))
    rest = tuple(n for n in trainable if n in leftovers or n not in index_of)
    if rest:
        groups.append(LayerGroup(UNASSIGNED, 1, rest))
    if not groups:
        raise ValueError("no trainable parameter belongs to a layer of the model")
    return groups



def layer_logit_changes(model: nn.Module, old_inputs: torch.Tensor, direction: Mapping[str, torch.Tensor],
                        groups: Sequence[LayerGroup], *, task_labels=None, chunk_size: int | None = None
                        ) -> dict[str, torch.Tensor]:
    """``J_ℓ(x_a) u_ℓ`` for every group ``ℓ`` and old input ``x_a``: one ``torch.func.jvp`` per group
    (tangent ``u_ℓ`` on the group's parameters, zero elsewhere), chunked over the inputs.

    The groups' tangents are stacked and pushed through one ``torch.func.vmap``-ed JVP, so the
    groups share the primal forward pass and the per-call overhead (small models and small
    calibration sets are overhead-bound). With ``chunk_size`` a call pushes at most ``chunk_size``
    (input, group) tangents: runs of up to 4 consecutive groups (a run's tangents start at its
    first layer; on a CIFAR ResNet-18 on CPU, 2–7 groups per call cost the same within 10 %,
    1 group 1.5× and all 21 2.5× more) on chunks of ``max(1, chunk_size // groups per call)``
    inputs. None: all inputs and all groups in one call.

    Returns ``{group name: (N, *output_shape) tensor}``; their sum over groups is ``J(x_a) u``.
    Multi-task inputs whose heads differ in width are zero-padded to the widest head.
    """
    check_inputs(old_inputs, name="old_inputs")
    params, consts = split_params(model)
    tasks = task_groups(model, old_inputs.shape[0], task_labels)
    groups = list(groups)
    pieces: dict[str, list] = {g.name: [] for g in groups}
    with eval_mode(model), math_attention():
        per_call = len(groups) if chunk_size is None else max(1, min(_GROUPS_PER_CALL, len(groups), chunk_size))
        inputs_per_call = None if chunk_size is None else max(1, chunk_size // per_call)
        for label, idx in tasks:
            xs = old_inputs if idx is None else old_inputs[idx]
            for s in iterate_batches(xs.shape[0], inputs_per_call):
                xc = xs[s]
                for first in range(0, len(groups), per_call):
                    batch = groups[first:first + per_call]
                    for group, values in zip(batch, _stacked_jvp(model, params, consts, direction, batch, xc, label)):
                        pieces[group.name].append((idx, s, values))
    out = {}
    for name, parts in pieces.items():
        if len(parts) == 1:
            out[name] = parts[0][2]
            continue
        shapes = {tuple(values.shape[1:]) for _, _, values in parts}
        if len(shapes) > 1 and any(len(shape) != 1 for shape in shapes):
            raise ValueError(f"task heads give outputs of different shapes {sorted(shapes)}; only (N, C) "
                             "logits of different widths can be combined")
        width = max(shapes)
        # task heads of different widths: zero-pad the narrower ones (no change in absent classes)
        full = torch.zeros((old_inputs.shape[0], *width), dtype=parts[0][2].dtype, device=old_inputs.device)
        for idx, s, values in parts:
            rows = s if idx is None else idx[s]
            full[(rows, *[slice(0, n) for n in values.shape[1:]])] = values
        out[name] = full
    return out



def _stacked_jvp(model, params, consts, direction, groups, inputs, label) -> list[torch.Tensor]:
    """``J_g(inputs) u_g`` for each group ``g`` of ``groups`` (disjoint), from one ``vmap``-ed JVP."""
    names = [n for g in groups for n in g.params]
    primal = {n: params[n] for n in names}
    rest = {n: p for n, p in params.items() if n not in primal}

    def f(p):
        return stateless_forward(model, {**rest, **consts, **p}, inputs, label)

    try:
        if len(groups) == 1:
            return [jvp(f, (primal,), ({n: direction[n].to(params[n].dtype) for n in names},))[1].detach()]
        tangents = {n: torch.zeros((len(groups), *params[n].shape), dtype=params[n].dtype, device=params[n].device)
                    for n in names}
        for i, group in enumerate(groups):
            for n in group.params:
                tangents[n][i] = direction[n].to(params[n].dtype)
        return list(vmap(lambda t: jvp(f, (primal,), (t,))[1])(tangents).detach().unbind(0))
    except (NotImplementedError, RuntimeError):
        # an operation without a forward-mode derivative (mkldnn LSTM kernels, fused kernels) or
        # without a vmap rule: the same products by double-vjp, one group at a time
        return [jvp_by_double_vjp(f, primal, {n: direction[n].to(params[n].dtype) if n in group.params
                                              else torch.zeros_like(primal[n]) for n in names}).detach()
                for group in groups]


def jvp_by_double_vjp(f, primal: dict, tangent: dict) -> torch.Tensor:
    """``J_f(primal) · tangent`` for a function ``f`` of a parameter dict returning one tensor, by
    reverse mode only: ``u ↦ vjp(u) = Jᵀu`` is linear in ``u``, and the vjp of that map at any
    ``u`` with cotangent ``tangent`` is ``J · tangent``. Needs twice-differentiable operations
    instead of forward-mode derivatives (which ``nn.LSTM``'s mkldnn kernel lacks).

    >>> from torch.func import jvp
    >>> w = {"w": torch.randn(3, 2)}
    >>> t = {"w": torch.randn(3, 2)}
    >>> f = lambda p: torch.tanh(torch.ones(4, 3) @ p["w"])
    >>> torch.allclose(jvp_by_double_vjp(f, w, t), jvp(f, (w,), (t,))[1], atol=1e-6)
    True
    """
    out, pullback = torch.func.vjp(f, primal)
    _, pullback_of_pullback = torch.func.vjp(lambda u: pullback(u)[0], torch.zeros_like(out))
    return pullback_of_pullback(tangent)[0]
