"""Ground truth for ADS: the realised shift of old-task logits between two models.

.. math:: \\text{shift} = \\frac{1}{N}\\sum_{a=1}^{N} \\big\\| z_\\text{after}(x_a) - z_\\text{before}(x_a) \\big\\|_2
"""

from __future__ import annotations

import torch
from torch import nn

from avalanche_plugins.core.calls import eval_mode, iterate_batches, model_forward, task_groups
from avalanche_plugins.core.checks import check_inputs, check_int
from avalanche_plugins.core.stats import mean_row_norm

__all__ = ["logit_shift", "model_outputs", "output_shift"]


def model_outputs(model: nn.Module, inputs: torch.Tensor, task_labels, chunk_size: int | None) -> torch.Tensor:
    """Outputs of ``model`` on ``inputs`` in eval mode without gradients, batched, each sample with
    its own task label (samples grouped by task for multi-task models). When task heads differ in
    width the result has the widest head's columns and the other rows are padded with NaN.

    Example:
        >>> model_outputs(nn.Linear(3, 2), torch.zeros(4, 3), None, 2).shape
        torch.Size([4, 2])
    """
    if chunk_size is not None:
        check_int("chunk_size", chunk_size)
    parts = []
    with eval_mode(model), torch.no_grad():
        for label, idx in task_groups(model, inputs.shape[0], task_labels):
            xs = inputs if idx is None else inputs[idx]
            z = torch.cat([model_forward(model, xs[s], label) for s in iterate_batches(xs.shape[0], chunk_size)])
            if idx is None:
                return z
            parts.append((idx, z))
    widths = {z.shape[1:] for _, z in parts}
    if len(widths) == 1:
        out = torch.empty((inputs.shape[0], *parts[0][1].shape[1:]), dtype=parts[0][1].dtype,
                          device=parts[0][1].device)
        for idx, z in parts:
            out[idx] = z
        return out
    if any(z.dim() != 2 for _, z in parts):
        raise ValueError(f"task heads give outputs of different shapes {sorted(tuple(w) for w in widths)}; "
                         "only (N, C) logits of different widths can be combined")
    width = max(z.shape[1] for _, z in parts)
    out = torch.full((inputs.shape[0], width), float("nan"), dtype=parts[0][1].dtype, device=parts[0][1].device)
    for idx, z in parts:
        out[idx, : z.shape[1]] = z
    return out


def output_shift(before: torch.Tensor, after: torch.Tensor) -> float:
    """Mean per-sample L2 norm of ``after − before`` (outputs of :func:`model_outputs`); the NaN
    padding of narrower task heads counts as no change. ``ValueError`` when the shapes differ."""
    if before.shape != after.shape:
        raise ValueError(f"the models' outputs differ in shape: {tuple(before.shape)} vs {tuple(after.shape)}")
    return mean_row_norm(torch.nan_to_num(after - before, nan=0.0))


def logit_shift(model_before: nn.Module, model_after: nn.Module, inputs: torch.Tensor, *,
                task_labels=None, chunk_size: int | None = 1024) -> float:
    """Ground truth: mean L2 norm of the logit change on ``inputs`` (eval mode, no gradient).

    .. math:: \\mathrm{shift} = \\frac1N \\sum_a \\lVert z_\\text{after}(x_a) - z_\\text{before}(x_a) \\rVert_2

    Multi-task models: each sample goes through its own task's head; heads may differ in width.

    Example:
        >>> a = nn.Linear(2, 2)
        >>> b = nn.Linear(2, 2)
        >>> b.load_state_dict(a.state_dict())
        <All keys matched successfully>
        >>> with torch.no_grad():
        ...     _ = b.bias.add_(torch.tensor([3.0, 4.0]))
        >>> round(logit_shift(a, b, torch.randn(10, 2)), 6)
        5.0
    """
    check_inputs(inputs, name="inputs")
    if chunk_size is not None:
        check_int("chunk_size", chunk_size)
    before = model_outputs(model_before, inputs, task_labels, chunk_size)
    after = model_outputs(model_after, inputs, task_labels, chunk_size)
    return output_shift(before, after)
