"""Argument checks shared by every estimator, so all of them fail the same way."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def check_choice(name: str, value, choices: Iterable) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_positive(name: str, value, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        expected = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def check_int(name: str, value, *, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_finite(name: str, tensor: torch.Tensor) -> None:
    """``ValueError`` when a floating-point tensor holds NaN or ±Inf (one policy for every estimator:
    non-finite data gives non-finite results, so it is rejected up front, naming the argument)."""
    if tensor.is_floating_point() or tensor.is_complex():
        bad = ~torch.isfinite(tensor)
        if bool(bad.any()):
            raise ValueError(f"{name} has {int(bad.sum())} non-finite values (NaN or Inf); "
                             "every estimator needs finite data")


def check_inputs(inputs, targets=None, *, name: str = "inputs") -> None:
    """Non-empty, finite tensors with matching first dimension."""
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(inputs).__name__}")
    if inputs.dim() == 0 or inputs.shape[0] == 0:
        raise ValueError(f"{name} is empty: at least one sample is needed")
    check_finite(name, inputs)
    if targets is not None:
        if not isinstance(targets, torch.Tensor):
            raise TypeError(f"targets must be a tensor, got {type(targets).__name__}")
        if targets.shape[0] != inputs.shape[0]:
            raise ValueError(
                f"targets has {targets.shape[0]} samples but {name} has {inputs.shape[0]}"
            )
        check_finite("targets", targets)


def check_output_targets(outputs: torch.Tensor, targets: torch.Tensor, loss_fn=None) -> None:
    """For torch's elementwise losses (MSE, L1, smooth L1, Huber, BCE), targets must have the outputs'
    shape: ``(N,)`` targets against ``(N, 1)`` outputs broadcast to ``(N, N)`` and give a wrong loss
    silently. Other losses (cross-entropy, custom callables) define their own shapes."""
    elementwise = (torch.nn.MSELoss, torch.nn.L1Loss, torch.nn.SmoothL1Loss, torch.nn.HuberLoss,
                   torch.nn.BCELoss, torch.nn.BCEWithLogitsLoss)
    if isinstance(loss_fn, elementwise) and targets.shape != outputs.shape:
        raise ValueError(f"targets have shape {tuple(targets.shape)} but the model outputs "
                         f"{tuple(outputs.shape)}: {type(loss_fn).__name__} would broadcast them silently; "
                         "reshape the targets to the outputs' shape")


def check_finite_loss(loss: torch.Tensor, where: str) -> None:
    if not torch.isfinite(loss).all():
        raise ValueError(f"loss is {loss.item() if loss.numel() == 1 else loss} {where}; "
                         "the model or data produce non-finite values")


def check_no_recurrent(model: torch.nn.Module, where: str) -> None:
    """``TypeError`` naming the first recurrent layer (``nn.RNN``/``LSTM``/``GRU``) of ``model``:
    ``where`` vmaps per-sample gradients or uses forward-mode AD, which torch's recurrent kernels
    do not support (GRU under ``vmap``, LSTM under ``jvp``), so it refuses up front instead of
    failing inside torch."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.RNNBase):
            raise TypeError(f"{where} does not support recurrent layers: {name or 'the model'!r} is a "
                            f"{type(module).__name__} (torch.func's vmap / forward-mode AD cannot run "
                            "it); layer_top_eigenvalues and batched_fisher do support it")
