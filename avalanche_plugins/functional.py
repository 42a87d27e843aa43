"""Calling a model (plain or Avalanche multi-task) statelessly, for ``torch.func`` transforms."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.func import functional_call

__all__ = ["is_multitask", "model_forward", "stateless_forward", "iterate_batches", "eval_mode"]


def is_multitask(model: nn.Module) -> bool:
    """Avalanche ``MultiTaskModule`` protocol (duck-typed so this module does not import avalanche)."""
    return hasattr(model, "forward_single_task")


def _task_arg(task_labels):
    """Label 0 when none is given; a single int when the whole batch has one task (Avalanche's
    fast path, which also avoids in-place scatter under ``torch.func`` transforms)."""
    if task_labels is None:
        return 0
    if isinstance(task_labels, torch.Tensor):
        if task_labels.numel() == 0:
            return 0
        first = task_labels.reshape(-1)[0]
        if bool((task_labels == first).all()):
            return int(first)
    return task_labels


def model_forward(model: nn.Module, x: torch.Tensor, task_labels=None) -> torch.Tensor:
    """``model(x)``, or ``model(x, task_labels)`` for multi-task models (label 0 when none given)."""
    if is_multitask(model):
        return model(x, _task_arg(task_labels))
    return model(x)


def stateless_forward(model: nn.Module, params_and_buffers: dict, x: torch.Tensor, task_labels=None):
    """:func:`model_forward` with the given parameters/buffers (``torch.func.functional_call``)."""
    args = (x, _task_arg(task_labels)) if is_multitask(model) else (x,)
    return functional_call(model, params_and_buffers, args)


def iterate_batches(n: int, batch_size: int | None):
    """Contiguous index slices covering ``range(n)``; one slice when ``batch_size`` is None."""
    step = n if batch_size is None else batch_size
    for start in range(0, n, step):
        yield slice(start, min(start + step, n))


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """Evaluate ``model`` in eval mode inside the block; restore every submodule's previous
    train/eval flag (``model.train(was_training)`` would overwrite the submodules' own flags,
    e.g. a frozen snapshot held in eval mode inside a wrapper)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training
