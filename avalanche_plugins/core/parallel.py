"""Data-parallel training (``torch.distributed``, ``torchrun``) as the estimators see it (torch only).

* :func:`unwrap_model` — the model inside a ``DistributedDataParallel`` / ``DataParallel`` wrapper:
  every ``torch.func`` path and every measurement runs on it (the wrapper's forward cannot pass
  ``torch.func``, and outside the training step it would start collectives).
* :func:`world_size`, :func:`rank` — of the default process group (1 and 0 without one).
* :func:`global_count` — a per-rank count of training samples as the whole group's: under a
  ``DistributedSampler`` every rank trains minibatches of the same sizes, so ``W`` ranks train
  ``W`` times a rank's count per step.
* :func:`sum_over_ranks` — integer counts summed over the group (an all-reduce; exact below 2**53).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["global_count", "rank", "sum_over_ranks", "unwrap_model", "world_size"]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside a data-parallel wrapper (``DistributedDataParallel``, Avalanche's
    ``DistributedHelper.wrap_model`` included, or ``DataParallel``: its ``.module``), else ``model``.

    With ``find_unused_parameters=True`` (Avalanche's wrapper) DDP routes its outputs through
    ``_DDPSink``, an autograd Function ``torch.func`` cannot pass; the wrapped module holds the same
    parameters, so estimators, hooks and penalties read it.

    >>> net = nn.Linear(2, 1)
    >>> unwrap_model(nn.DataParallel(net)) is net, unwrap_model(net) is net
    (True, True)
    """
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module
    return model


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def world_size() -> int:
    """Processes in the default group (1 without one).

    >>> world_size()
    1
    """
    return torch.distributed.get_world_size() if _initialized() else 1


def rank() -> int:
    """This process's rank in the default group (0 without one)."""
    return torch.distributed.get_rank() if _initialized() else 0


def global_count(n: int) -> int:
    """``W · n``: a rank's count of training samples (or minibatch size) as the group's.

    >>> global_count(32)  # one process
    32
    """
    return int(n) * world_size()


def sum_over_ranks(counts: list[int]) -> list[int]:
    """``counts`` summed elementwise over the group's ranks (every rank must call it with as many
    entries, in the same order); the counts themselves without a group.

    >>> sum_over_ranks([3, 4])
    [3, 4]
    """
    if not _initialized():
        return [int(c) for c in counts]
    device = torch.device("cpu")
    if torch.distributed.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    total = torch.tensor([float(c) for c in counts], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(total)
    return [int(round(v)) for v in total.tolist()]
