"""Unit scores for Grow / Prune, and picking units by score.

Scores (:func:`unit_scores`), all per unit of each masked layer, larger is better:

* ``weight_norm``: ``‖W_in[u]‖₂`` (incoming weight row, bias excluded);
* ``activation``: fraction of inputs (samples × spatial positions) with ``φ(z_u) > threshold``,
  where ``z_u`` is the unit's (post-BN) output *as if unmasked*: the hook sees the value before
  multiplying by the mask, and unmasking one unit changes nothing else in its layer;
* ``gradient``: ``‖∂L/∂W_out[:, u]‖`` — the gradient a unit's outgoing weights would receive if
  it were inserted with zero outgoing weights (function-preserving, so the rest of the network is
  unchanged; GradMax / NeurOps). The gradient through the mask itself is useless here: a masked
  ReLU unit sits at ``relu'(0) = 0``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from avalanche_plugins.core.calls import eval_mode, model_forward, stateless_forward
from avalanche_plugins.core.checks import check_choice
from avalanche_plugins.structural.selection import highest_masked, lowest_active

if TYPE_CHECKING:  # annotations only: masks imports this module
    from avalanche_plugins.structural.masks import UnitMasks

__all__ = ["SCORES", "check_compactness", "highest_masked", "layer_counts", "lowest_active", "unit_scores"]


SCORES = ("weight_norm", "activation", "gradient")



def unit_scores(masks: UnitMasks, kind: str, x: torch.Tensor | None = None, y: torch.Tensor | None = None,
                *, loss_fn: Callable | None = None, threshold: float = 0.0,
                task_labels=None) -> dict[str, torch.Tensor]:
    """Per-unit scores ``{layer name: (units,)}`` of every masked layer (module docstring).

    ``weight_norm`` needs nothing else; ``activation`` needs inputs ``x``; ``gradient`` needs
    ``x``, targets ``y`` and ``loss_fn``. Data-dependent scores run the model in eval mode
    without changing parameters, buffers or masks.

    Example:
        >>> from torch import nn
        >>> from avalanche_plugins.structural import UnitMasks
        >>> net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [3.0, 4.0]]))
        ...     _ = net[0].bias.zero_()
        >>> masks = UnitMasks(net, torch.randn(2, 2))
        >>> unit_scores(masks, "weight_norm")["0"]
        tensor([1., 1., 5.])
        >>> x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [-1.0, 0.0], [1.0, 1.0]])
        >>> unit_scores(masks, "activation", x, threshold=0.5)["0"]
        tensor([0.7500, 0.2500, 0.7500])
    """
    check_choice("score", kind, SCORES)
    if kind == "weight_norm":
        return {name: layer.module.weight.detach().reshape(layer.size, -1).norm(dim=1)
                for name, layer in masks.layers.items()}
    if x is None:
        raise ValueError(f"score={kind!r} needs inputs x")
    if kind == "activation":
        if not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise ValueError(f"threshold must be a finite number, got {threshold!r}")
        masks.record_outputs(True)
        try:
            with torch.no_grad(), eval_mode(masks.model):
                model_forward(masks.model, x, task_labels)
            outputs = masks.pop_outputs()
        finally:
            masks.record_outputs(False)
        out = {}
        for name, layer in masks.layers.items():
            z = torch.cat(outputs[name]) if len(outputs[name]) > 1 else outputs[name][0]
            fired = (masks.activation(z) > threshold).movedim(layer.hook.unit_dim, 0)
            out[name] = fired.reshape(layer.size, -1).float().mean(1)
        return out
    if y is None or loss_fn is None:
        raise ValueError("score='gradient' needs targets y and loss_fn")
    return _gradient_scores(masks, x, y, loss_fn, task_labels)



def _gradient_scores(masks, x, y, loss_fn, task_labels):
    names = {id(p): n for n, p in masks.model.named_parameters()}
    out = {}
    with eval_mode(masks.model):
        for name, layer in masks.layers.items():
            if layer.outgoing is None:
                raise ValueError(f"score='gradient' needs the consumer of layer {name!r}, which "
                                 "was not found (non-sequential model)")
            weight = layer.outgoing.tensor
            off = (~layer.hook.mask).nonzero().reshape(-1)
            probe = weight.detach().clone()
            probe.index_fill_(1, layer.outgoing.indices(off), 0.0)  # function-preserving
            probe.requires_grad_(True)
            saved = layer.hook.mask.clone()
            layer.hook.mask.fill_(True)  # every unit of this layer on, outgoing zero if masked
            try:
                output = stateless_forward(masks.model, {names[id(weight)]: probe}, x, task_labels)
                (grad,) = torch.autograd.grad(loss_fn(output, y), probe)
            finally:
                layer.hook.mask.copy_(saved)
            cols = layer.outgoing.columns  # (units, k)
            per_column = grad.detach().pow(2).movedim(1, 0).reshape(grad.shape[1], -1).sum(1)
            out[name] = per_column[cols].sum(1).sqrt()
    return out



def check_compactness(name: str, value) -> None:
    """``value`` in (0, 1], with a message naming the argument."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")



def layer_counts(sizes: Mapping[str, int], fraction: float) -> dict[str, int]:
    """``max(1, round(fraction·units))`` per layer.

    Example:
        >>> layer_counts({"a": 10, "b": 3}, 0.3)
        {'a': 3, 'b': 1}
    """
    return {name: max(1, int(round(fraction * n))) for name, n in sizes.items()}
