"""Picking units by score: which units a prune removes and a grow recruits (the policy; the mask
type that applies it is :class:`~avalanche_plugins.structural.masks.UnitMasks`)."""

from __future__ import annotations

import torch

__all__ = ["highest_masked", "lowest_active"]


def _check_scores(scores: torch.Tensor) -> None:
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("unit scores have NaN or Inf values: the ranking of units would be arbitrary "
                         "(check the model's weights, activations or gradients)")


def lowest_active(scores: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the ``n`` lowest-scoring active units (``mask`` True); ties: lower index first.

    Example:
        >>> lowest_active(torch.tensor([0.5, 0.1, 0.9, 0.1]), torch.tensor([True, True, True, False]), 2)
        tensor([0, 1])
    """
    _check_scores(scores)
    active = mask.nonzero().reshape(-1)
    if n > active.numel():
        raise ValueError(f"cannot remove {n} units: only {active.numel()} are active")
    order = torch.sort(scores[active].float(), stable=True).indices[:n]
    return active[order].sort().values



def highest_masked(scores: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the ``n`` highest-scoring masked units (``mask`` False); ties: lower index first.

    Example:
        >>> highest_masked(torch.tensor([0.5, 0.1, 0.9, 0.3]), torch.tensor([False, False, True, False]), 2)
        tensor([0, 3])
    """
    _check_scores(scores)
    masked = (~mask).nonzero().reshape(-1)
    if n > masked.numel():
        raise ValueError(f"cannot recruit {n} units: only {masked.numel()} are masked")
    order = torch.sort(-scores[masked].float(), stable=True).indices[:n]
    return masked[order].sort().values
