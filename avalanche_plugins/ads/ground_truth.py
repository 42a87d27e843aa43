"""Ground truth for ADS: the realised shift of old-task logits between two models.

.. math:: \text{shift} = \frac{1}{N}\\sum_{a=1}^{N} \big\\| z_\text{after}(x_a) - z_\text{before}(x_a) \big\\|_2
"""

from __future__ import annotations

import torch
from torch import nn

from avalanche_plugins.core.calls import eval_mode, iterate_batches, model_forward, task_groups
from avalanche_plugins.core.checks import check_inputs, check_int
from avalanche_plugins.core.stats import mean_row_norm

__all__ = ["logit_shift", "model_outputs"]


def model_outputs(model: nn.Module, inputs: torch.Tensor, task_labels, chunk_size: int | None) -> torch.Tensor:
    """Outputs of ``model`` on ``inputs`` in eval mode without gradients, batched, each sample with
    its own task label (samples grouped by task for multi-task models)."""
    tasks = task_groups(model, inputs.shape[0], task_labels)
    out = None
    with eval_mode(model), torch.no_grad():
        for label, idx in tasks:
            xs = inputs if idx is None else inputs[idx]
            z = torch.cat([model_forward(model, xs[s], label) for s in iterate_batches(xs.shape[0], chunk_size)])
            if idx is None:
                return z
            if out is None:
                out = torch.empty((inputs.shape[0], *z.shape[1:]), dtype=z.dtype, device=z.device)
            out[idx] = z
    return out


def logit_shift(model_before: nn.Module, model_after: nn.Module, inputs: torch.Tensor, *,
                task_labels=None, chunk_size: int | None = 1024) -> float:
    """Ground truth: mean L2 norm of the logit change on ``inputs`` (eval mode, no gradient).

    .. math:: \\mathrm{shift} = \\frac1N \\sum_a \\lVert z_\\text{after}(x_a) - z_\\text{before}(x_a) \\rVert_2

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
    if before.shape != after.shape:
        raise ValueError(f"the models' outputs differ in shape: {tuple(before.shape)} vs {tuple(after.shape)}")
    return mean_row_norm(after - before)
