"""Shared plumbing of the readiness estimators: gradient norms and minibatch draws."""

from __future__ import annotations

import torch

from avalanche_plugins.core.calls import iterate_batches


def _take(tensor, index):
    return tensor if index is None else tensor[index]


def _sq_norms(grads: dict) -> torch.Tensor:
    """Row-wise squared norms (float64) of a dict of batched gradients ``{name: (m, *shape)}``."""
    total = 0
    for g in grads.values():
        flat = g.reshape(g.shape[0], -1)
        total = total + torch.einsum("ij,ij->i", flat, flat).double()  # no (m, P) temporary
    return total


def _draw_batches(n: int, batch_size: int, n_batches: int, generator: torch.Generator) -> torch.Tensor:
    """``(n_batches, batch_size)`` indices: each row a uniform random subset of ``range(n)``
    (without replacement within a row, rows independent). Uses only ``generator``."""
    if batch_size == 1:
        return torch.randint(n, (n_batches, 1), generator=generator)
    rows_per_block = max(1, (1 << 20) // n)
    blocks = []
    for s in iterate_batches(n_batches, rows_per_block):
        keys = torch.rand(s.stop - s.start, n, generator=generator)
        blocks.append(keys.topk(batch_size, dim=1).indices)
    return torch.cat(blocks, dim=0)


