"""Which later layer consumes a layer's output units, and which of its input features each unit feeds.

:func:`find_consumer` answers, for the output units of one module of a model (the neurons of a
``Linear``, the channels of a ``Conv``, or those of the BatchNorm after it), two questions a
structural edit needs: *which* later parametrised layer of the layer map
(:func:`~avalanche_plugins.core.layers.discover_layers`) is the first to see them, and *which of its
input features* (columns of a ``Linear``, input channels of a ``Conv``) each unit feeds. It is
measured, not read off the code, so whatever runs in between is handled: activations, pooling,
``Flatten`` after a conv (one block of ``H·W`` columns per channel), CReLU (two columns per unit),
channel shuffles and concatenations.

What it computes (one forward pass in eval mode, no gradients): unit ``i`` *feeds* input feature
``f`` of a later layer if adding ``+s`` or ``-s`` (``s = 1e4``, a step large enough to pass ReLU,
tanh or CReLU on one side) to unit ``i`` alone changes feature ``f`` (at any position) by more
than ``1e-4·(1 + |base|)``. The *consumer* is the first later layer, in execution order, with a
fed feature; the forward stops there. The result :class:`Consumer` holds, per input feature of
the consumer, the one unit that feeds it, :data:`NONE` or :data:`SEVERAL`.

How (cost independent of the unit count times the depth): instead of one perturbed copy per unit
and sign (``2n+1`` rows), units are perturbed in groups by the bits of their index: for each bit
``b`` of ``k = ⌈log₂ n⌉`` and value ``v ∈ {0, 1}``, one row perturbs every unit whose bit ``b`` is
``v``, once with ``+s`` and once with ``-s``: ``1 + 4k`` rows (45 for 1,280 units). A feature fed
by one unit ``i`` changes in exactly the rows that hold ``i``, so the rows of value ``v`` that
change spell out ``i``'s bits; a feature fed by two units or more changes in both rows of a bit
where they differ, and is reported as :data:`SEVERAL`. Between a layer and its consumer run only
operations outside the layer map; where they act on each unit on its own (activations,
BatchNorm, pooling, reshapes, permutations, concatenations) a group row gives a feature fed by one
unit the very value that unit's own row would, so the result is that of one copy per unit and
sign; features that an operation mixes (a softmax over units, a sum) are :data:`SEVERAL` either
way.

The copies are made as late as possible: one batch of one sample runs up to the probed module,
whose output is broadcast against the ``1 + 4k`` perturbations; later modules that see a batch
of one do not depend on it. Where a model cannot broadcast (a concatenation with a branch that
does not depend on the probed module, an in-place residual add into it), the copies start at the
input of the innermost enclosing module that works, and as a last resort at the model's input
(:func:`probe_starts`). Broadcast copies that run and reach no later layer are settled by copies
from the model's input (an enclosing start would broadcast the same values).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from avalanche_plugins.core.calls import eval_mode
from avalanche_plugins.core.layers import LayerInfo

__all__ = ["NONE", "SEVERAL", "Consumer", "find_consumer", "probe_patterns", "probe_starts"]

NONE = -1  # no unit feeds the feature
SEVERAL = -2  # more than one unit feeds the feature
STEP = 1e4  # ± a large step: passes ReLU / tanh / CReLU on one side
_FAILED = object()  # the broadcast copies did not run
_UNREACHED = object()  # the broadcast copies ran and reached no later layer


@dataclass(eq=False)
class Consumer:
    """The first later layer that a module's units feed.

    Attributes:
        layer: the consuming layer (an entry of the layer map).
        sources: ``(features,)`` long, per input feature of the consumer (dim 1 of its input; the
            last dim for a ``Linear``) the one unit that feeds it, :data:`NONE` or :data:`SEVERAL`.
        n_units: the number of units probed.
    """

    layer: LayerInfo
    sources: torch.Tensor
    n_units: int

    def columns(self) -> torch.Tensor | None:
        """``(units, k)`` input features fed by each unit (ascending), when every unit feeds the same
        number ``k > 0`` of features and no feature is fed by several units; else None."""
        if bool((self.sources == SEVERAL).any()):
            return None
        fed = (self.sources >= 0).nonzero().reshape(-1)
        counts = torch.bincount(self.sources[fed], minlength=self.n_units)
        if int(counts[0]) == 0 or not bool((counts == counts[0]).all()):
            return None
        order = torch.argsort(self.sources[fed], stable=True)
        return fed[order].reshape(self.n_units, int(counts[0]))


class _Stop(Exception):
    """Stops the probe's forward pass at the first later layer the probes reach."""


class _Mismatch(Exception):
    """A later layer saw a batch that is neither 1 nor the probes': the broadcast is unusable."""


def probe_patterns(n_units: int) -> torch.Tensor:
    """``(2k, n_units)`` 0/1 rows, row ``2b + v`` holding the units whose index has bit ``b`` equal
    to ``v`` (``k = max(1, ⌈log₂ n⌉)``).

    Example:
        >>> probe_patterns(3).long().tolist()
        [[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]]
    """
    k = max(1, (n_units - 1).bit_length())
    bits = (torch.arange(n_units)[None, :] >> torch.arange(k)[:, None]) & 1  # (k, n)
    return torch.stack([bits == 0, bits == 1], 1).reshape(2 * k, n_units).float()


def _decode(changed: torch.Tensor, n_units: int) -> torch.Tensor:
    """Per-feature source unit from ``changed`` ``(2, 2k, features)`` (signs × pattern rows)."""
    rows = (changed[0] | changed[1]).reshape(-1, 2, changed.shape[-1])  # (k, value, features)
    zero, one = rows[:, 0], rows[:, 1]
    fed = (zero | one).any(0)
    weights = 2 ** torch.arange(rows.shape[0], device=rows.device)
    unit = (one.long() * weights[:, None]).sum(0)
    single = (zero ^ one).all(0) & (unit < n_units)
    return torch.where(fed, torch.where(single, unit, torch.full_like(unit, SEVERAL)), torch.full_like(unit, NONE))


def probe_starts(model: nn.Module, point: nn.Module) -> list:
    """Where the probe copies may start, tried in order: at ``point``'s output (None), at the input
    of each module enclosing ``point`` from the innermost, at the model's input (``model``)."""
    path = next((n for n, m in model.named_modules() if m is point), "")
    parts = path.split(".") if path else []
    enclosing = [model.get_submodule(".".join(parts[:i])) for i in range(len(parts) - 1, 0, -1)]
    return [None, *enclosing, model]


@torch.no_grad()
def find_consumer(model: nn.Module, point: nn.Module, *, n_units: int, unit_dim: int,
                  later: Sequence[LayerInfo], run: Callable[[torch.Tensor], object],
                  x: torch.Tensor) -> Consumer | None:
    """The first layer of ``later`` that the units of ``point``'s output feed (module docstring).

    Args:
        model: the network, run in eval mode.
        point: the module whose output holds the units (a layer, or the BatchNorm after it).
        n_units: size of ``point``'s output along ``unit_dim``.
        unit_dim: the unit dimension of ``point``'s output (``-1`` for a ``Linear``, 1 for a ``Conv``).
        later: the candidate consumers, the layers of the layer map after the probed one.
        run: ``run(batch)`` calls ``model`` on an input batch (supplying task labels if any).
        x: one input sample, batch of one.

    Returns:
        The :class:`Consumer`, or None when the units reach no layer of ``later``.

    Example:
        >>> from avalanche_plugins.core.layers import discover_layers
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3))
        >>> x = torch.randn(1, 1, 4, 4)
        >>> found = find_consumer(net, net[0], n_units=2, unit_dim=1, later=list(discover_layers(net, x))[1:],
        ...                       run=net, x=x)
        >>> found.layer.name, found.columns().tolist()
        ('3', [[0, 1, 2, 3], [4, 5, 6, 7]])
    """
    starts = probe_starts(model, point)
    for start in starts:
        found = _probe(model, point, n_units, unit_dim, later, run, x, start)
        if found is _UNREACHED:  # an earlier start would broadcast the same: settle it with whole copies
            return _probe(model, point, n_units, unit_dim, later, run, x, model)
        if found is not _FAILED:
            return found
    return None


def _probe(model, point, n_units, unit_dim, later, run, x, start):
    """:class:`Consumer` of one forward whose copies start at ``start`` (:func:`probe_starts`); None
    when no later layer is fed; for broadcast copies (``start`` not the model), ``_FAILED`` when they
    do not run and ``_UNREACHED`` when they reach no later layer."""
    patterns = probe_patterns(n_units).to(x.device)
    probes = torch.cat([torch.zeros(1, n_units, device=x.device), STEP * patterns, -STEP * patterns])
    rows = probes.shape[0]
    broadcast = start is not model
    hit: list = []

    def perturb(module, inputs, out):
        shape = [1] * out.dim()
        shape[unit_dim if unit_dim >= 0 else out.dim() + unit_dim] = -1
        return out + probes.to(out.dtype).view(rows, *shape[1:])

    def expand(module, inputs):
        first = inputs[0]
        if isinstance(first, torch.Tensor) and first.shape[0] == 1:
            return (first.expand(rows, *first.shape[1:]), *inputs[1:])
        return None

    def reached(module, inputs, info):
        inp = inputs[0].detach()
        if broadcast and inp.shape[0] == 1:
            return  # does not depend on the probed module (not broadcast to the probes)
        if broadcast and inp.shape[0] != rows:
            raise _Mismatch
        feature_dim = inp.dim() - 1 if info.kind == "linear" else 1
        diff = (inp[1:] - inp[:1]).abs() > 1e-4 * (1 + inp[:1].abs())
        reduce = [d for d in range(1, diff.dim()) if d != feature_dim]
        changed = diff.any(dim=reduce) if reduce else diff  # (rows - 1, features)
        if changed.any():
            hit.append(Consumer(info, _decode(changed.reshape(2, rows // 2, -1), n_units), n_units))
            raise _Stop  # the first layer reached: the rest of the forward is not needed

    handles = [info.module.register_forward_pre_hook(lambda m, inp, info=info: reached(m, inp, info))
               for info in later]
    handles.append(point.register_forward_hook(perturb))
    if broadcast and start is not None:
        handles.append(start.register_forward_pre_hook(expand))
    try:
        with eval_mode(model):
            run(x if broadcast else x.expand(rows, *x.shape[1:]))
    except _Stop:
        return hit[0]
    except (_Mismatch, RuntimeError, ValueError):
        if not broadcast:
            raise
        return _FAILED
    finally:
        for handle in handles:
            handle.remove()
    return _UNREACHED if broadcast else None
