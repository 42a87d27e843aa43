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


# --------------------------------------------------------------------------------------------
# estimator entry checks: the batch, the labels, the model against its inputs

# losses whose 1-D targets are class indices (their float targets are class probabilities (N, C, ...))
_CLASS_INDEX_LOSSES = (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)
_CLASS_INDEX_FUNCTIONS = (torch.nn.functional.cross_entropy, torch.nn.functional.nll_loss)


def check_nonempty(x, name: str = "inputs") -> None:
    """``TypeError`` unless ``x`` is a tensor, ``ValueError`` when it holds no sample (``x.shape[0] == 0``
    or a 0-d tensor)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dim() == 0 or x.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}): at least one sample is needed")


def check_not_meta(x: torch.Tensor, name: str = "inputs") -> None:
    """``ValueError`` for a tensor on the ``meta`` device: it has a shape but no values to compute with.

    >>> check_not_meta(torch.zeros(2, device="meta"), "u")
    Traceback (most recent call last):
    ...
    ValueError: u is on the meta device: it holds no values; pass real data
    """
    if x.device.type == "meta":
        raise ValueError(f"{name} is on the meta device: it holds no values; pass real data")


def check_labels(targets, n_classes: int | None = None, *, name: str = "targets",
                 ignore_index: int | None = None) -> None:
    """Class-index labels: a tensor of an integer dtype (``TypeError`` for float, bool or complex
    labels), every value ``>= 0`` and ``< n_classes`` when the number of model outputs is known
    (``ValueError``, naming the offending values). ``ignore_index`` (e.g. ``CrossEntropyLoss``'s
    -100) is allowed anywhere.

    >>> check_labels(torch.tensor([0, 2]), 3)
    >>> check_labels(torch.tensor([0, 3]), 3)
    Traceback (most recent call last):
    ...
    ValueError: targets must be class indices in [0, 3) for a model with 3 outputs; got values [3]
    """
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of class indices, got {type(targets).__name__}")
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise TypeError(f"{name} must be class indices of an integer dtype (torch.long), got {targets.dtype}; "
                        f"convert with {name}.long() (class probabilities need shape (N, n_classes))")
    if targets.numel() == 0 or targets.device.type == "meta":
        return
    counted = targets if ignore_index is None else targets[targets != ignore_index]
    if counted.numel() == 0:
        return
    bad = counted < 0 if n_classes is None else (counted < 0) | (counted >= n_classes)
    if bool(bad.any()):
        expected = ">= 0" if n_classes is None else f"in [0, {n_classes}) for a model with {n_classes} outputs"
        raise ValueError(f"{name} must be class indices {expected}; got values {torch.unique(counted[bad]).tolist()[:5]}")


def _takes_class_indices(loss_fn) -> bool:
    return isinstance(loss_fn, _CLASS_INDEX_LOSSES) or loss_fn in _CLASS_INDEX_FUNCTIONS


def check_model_inputs(model: torch.nn.Module, x, name: str = "inputs") -> None:
    """The model can run on ``x``: ``x`` a non-empty tensor (:func:`check_nonempty`), neither on the
    ``meta`` device (``ValueError``: no data to compute with), floating inputs of a dtype the
    model's floating parameters have (``TypeError``, e.g. float32 inputs to a float64 model), on a
    device the parameters are on (``ValueError``). Integer inputs (token ids) are not dtype-checked;
    a model without parameters only gets the input checks."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_nonempty(x, name)
    tensors = [*model.parameters(), *model.buffers()]
    on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if on_meta:
        raise ValueError(f"model has parameters or buffers on the meta device ({on_meta[:3]}"
                         f"{' ...' if len(on_meta) > 3 else ''}): they hold no values; materialise the model "
                         "first (model.to_empty(device=...) and load its weights)")
    check_not_meta(x, name)
    devices = {t.device for t in tensors}
    if devices and x.device not in devices:
        raise ValueError(f"{name} is on {x.device} but the model's parameters are on "
                         f"{', '.join(sorted(map(str, devices)))}; move one of them (e.g. {name}.to(device))")
    dtypes = {p.dtype for p in model.parameters() if p.dtype.is_floating_point}
    if x.dtype.is_floating_point and dtypes and x.dtype not in dtypes:
        model_dtypes = ", ".join(sorted(map(str, dtypes)))
        raise TypeError(f"{name} has dtype {x.dtype} but the model's parameters are {model_dtypes}; convert "
                        f"one of them (e.g. {name}.to({model_dtypes.split(', ')[0]}) or model.to({x.dtype}))")


def _n_outputs(model: torch.nn.Module, x: torch.Tensor, task_label) -> int | None:
    """Output columns (dim 1) of ``model`` on one sample, in eval mode without gradients and with the
    submodules' train flags restored (the model is not changed); None for non-tensor or 1-d
    outputs. Avalanche multi-task models (duck-typed as in ``core.calls``) get ``task_label``."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            out = model(x[:1], task_label) if hasattr(model, "forward_single_task") else model(x[:1])
    finally:
        for module, training in modes:
            module.training = training
    return int(out.shape[1]) if isinstance(out, torch.Tensor) and out.dim() >= 2 else None


def check_targets(model: torch.nn.Module, inputs: torch.Tensor, targets, *, loss_fn=None, task_labels=None,
                  name: str = "targets") -> None:
    """Targets of a loss on ``model(inputs)``: integer targets are class indices (:func:`check_labels`,
    against the model's output columns, found with a one-sample forward per task); with a loss
    that takes class indices (``CrossEntropyLoss``, ``NLLLoss``) 1-d float targets are an error
    (``TypeError``). Other float targets (regression, class probabilities) pass; their shapes are
    the loss's business (:func:`check_output_targets`)."""
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(targets).__name__}")
    class_loss = _takes_class_indices(loss_fn)
    if targets.dtype.is_floating_point or targets.dtype.is_complex:
        if class_loss and targets.dim() <= 1:
            check_labels(targets, name=name)  # raises: class indices of a float dtype
        return
    ignore = getattr(loss_fn, "ignore_index", None) if class_loss else None
    if inputs.shape[0] != targets.shape[0]:
        return  # check_inputs reports the mismatch
    check_labels(targets[:0], name=name)  # the dtype, before running the model
    multitask = hasattr(model, "forward_single_task")
    if multitask and isinstance(task_labels, torch.Tensor) and task_labels.numel() == targets.shape[0]:
        labels = task_labels.reshape(-1).to(targets.device)
        for task in torch.unique(labels).tolist():
            rows = (labels == task).to(inputs.device)
            check_labels(targets[rows.to(targets.device)], _n_outputs(model, inputs[rows], int(task)),
                         name=name, ignore_index=ignore)
        return
    task = int(task_labels) if isinstance(task_labels, int) else 0
    check_labels(targets, _n_outputs(model, inputs, task), name=name, ignore_index=ignore)


def check_estimator_inputs(model: torch.nn.Module, inputs, targets=None, *, loss_fn=None, task_labels=None,
                           name: str = "inputs", targets_name: str = "targets") -> None:
    """The entry check of every estimator taking a model and a batch: :func:`check_model_inputs`
    on ``inputs`` and, when given, :func:`check_targets` on ``targets``. One error style:
    ``ValueError`` / ``TypeError`` naming the argument and what was expected.

    >>> net = torch.nn.Linear(3, 2)
    >>> check_estimator_inputs(net, torch.zeros(4, 3), torch.tensor([0, 1, 1, 0]), loss_fn=torch.nn.CrossEntropyLoss())
    >>> check_estimator_inputs(net, torch.zeros(4, 3, dtype=torch.float64))
    Traceback (most recent call last):
    ...
    TypeError: inputs has dtype torch.float64 but the model's parameters are torch.float32; convert one of them (e.g. inputs.to(torch.float32) or model.to(torch.float64))
    """
    check_model_inputs(model, inputs, name)
    if targets is not None:
        check_targets(model, inputs, targets, loss_fn=loss_fn, task_labels=task_labels, name=targets_name)
