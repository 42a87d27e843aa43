"""This package's components under Avalanche's distributed training (``avalanche.distributed``).

Avalanche 0.6 trains across processes after ``DistributedHelper.init_distributed(seed)`` (one
process per rank, started by ``torchrun``): its template gives the train and eval loaders a
``DistributedSampler`` (each rank trains and evaluates on its share) but leaves the model as the
user built it; the user wraps it (``DistributedHelper.wrap_model(model)``, a
``DistributedDataParallel`` with ``find_unused_parameters=True``, or plain ``DDP(model)``), else
the ranks train different models. Avalanche checks only ``strategy.plugins`` for a
``supports_distributed`` flag, and only warns.

Every plugin and metric of the package declares ``supports_distributed`` and calls
:func:`check_distributed` before training (plugins and metrics alike, metrics at their first
callback): under a process group it refuses, before any iteration, a component that does not
support it (:class:`DistributedTrainingError` naming the component, why and what to do) and a
model left unwrapped. A component that supports it:

* reads the model inside the wrapper (:func:`plain_model`,
  :func:`~avalanche_plugins.core.parallel.unwrap_model`) for every ``torch.func`` path, hook and
  penalty;
* counts steps and samples for the whole group (``W`` ranks each train a minibatch per step:
  :func:`~avalanche_plugins.core.parallel.global_count`, :func:`global_batch_size`), so a 2-rank
  run with minibatches of ``B`` means what one process with minibatches of ``2B`` means;
* takes data-dependent state (Fisher, ``s_ℓ``, scores, anchors) from the whole experience through
  its own non-distributed loader, the same samples in the same order on every rank, with the
  group's minibatch size where the minibatch matters (the batched Fisher), so the state is
  bit-identical across ranks;
* evaluates either on the whole test experience through its own loader (identical on every rank),
  or counts the rank's share of the strategy's evaluation minibatches and sums the counts over
  the ranks (:func:`~avalanche_plugins.core.parallel.sum_over_ranks`), leaving out the samples the
  ``DistributedSampler`` repeats to even out the shares (:func:`shared_samples`).

Loggers: Avalanche allows a logger on the main process only; :func:`check_logger_rank` raises
this package's message on the others.
"""

from __future__ import annotations

import torch

from avalanche_plugins.core.parallel import rank, unwrap_model, world_size

__all__ = ["DistributedTrainingError", "check_distributed", "check_logger_rank", "global_batch_size",
           "is_distributed", "plain_model", "shared_samples"]

WRAP_HINT = ("wrap the model before building the strategy: model = DistributedHelper.wrap_model(model) "
             "(from avalanche.distributed import DistributedHelper) or torch.nn.parallel.DistributedDataParallel(model)")


class DistributedTrainingError(RuntimeError):
    """A component refused Avalanche's distributed training before any iteration."""


def is_distributed() -> bool:
    """Whether a default process group is up (Avalanche's ``DistributedHelper.is_distributed``)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def plain_model(strategy) -> torch.nn.Module:
    """``strategy.model`` without its data-parallel wrapper (the model itself when unwrapped)."""
    return unwrap_model(strategy.model)


def global_batch_size(strategy) -> int:
    """The group's training minibatch: ``train_mb_size`` per rank times the world size."""
    return int(strategy.train_mb_size) * world_size()


def check_distributed(owner, strategy, component: str | None = None) -> None:
    """Under a process group, refuse ``owner`` before training when it does not support distributed
    training (its ``supports_distributed`` is False, or its ``distributed_refusal()`` names a
    setting that does not), and refuse a model left unwrapped. A no-op in one process, and after
    the first pass for a given model.

    :raises DistributedTrainingError: naming the component, the reason and the fix.
    """
    if not is_distributed() or getattr(owner, "_distributed_checked", None) == id(strategy.model):
        return
    component = component or type(owner).__name__
    where = f"(rank {rank()} of {world_size()})"
    refusal = getattr(owner, "distributed_refusal", None)
    reason = refusal() if callable(refusal) else None
    if reason is None and not getattr(owner, "supports_distributed", False):
        reason = "it does not declare supports_distributed=True"
    if reason is not None:
        raise DistributedTrainingError(f"{component} refuses distributed training before training {where}: {reason}")
    if not isinstance(strategy.model, torch.nn.parallel.DistributedDataParallel):
        raise DistributedTrainingError(
            f"{component} refuses distributed training before training {where}: strategy.model "
            f"({type(strategy.model).__name__}) is not wrapped in DistributedDataParallel, so every rank would "
            f"train its own model (Avalanche shards the data but leaves the model as given); {WRAP_HINT}")
    owner._distributed_checked = id(strategy.model)


def check_logger_rank(component: str) -> None:
    """Refuse building a logger on a non-main rank (Avalanche allows loggers on rank 0 only).

    :raises DistributedTrainingError: naming the logger and how to build it on rank 0 only.
    """
    if is_distributed() and rank() != 0:
        raise DistributedTrainingError(
            f"{component}: built on rank {rank()} of {world_size()}, but under distributed training only the main "
            f"process logs (Avalanche refuses loggers elsewhere; every rank's metric values are equal): build it on "
            f"rank 0 only, e.g. loggers=[{component}(...)] if DistributedHelper.is_main_process else []")


def shared_samples(strategy, seen: int, n: int) -> torch.Tensor:
    """Which of the ``n`` evaluation samples after the ``seen`` ones of this rank's share are the
    experience's own: a ``DistributedSampler`` gives rank ``r`` of ``W`` the positions ``r, r+W,
    ...`` of the (shuffled) index list padded by repeating its head to a multiple of ``W``; the
    positions past the dataset's length are repeats, counted once by the rank they came from.
    All True in one process.

    >>> class S: adapted_dataset = range(5)
    >>> shared_samples(S(), 0, 3).tolist()
    [True, True, True]
    """
    local = torch.arange(seen, seen + n)
    return local * world_size() + rank() < len(strategy.adapted_dataset)
