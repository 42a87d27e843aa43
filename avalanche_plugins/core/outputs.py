"""The logits of a model whose forward returns more than a tensor.

Models that return a tuple (``(logits, features)``, ``(logits, aux_logits)``) or a dict
(``{"logits": ..., "features": ...}``) need an ``output_transform``: a function from the model's
output to its logits tensor (e.g. ``lambda out: out[0]`` or ``lambda out: out["logits"]``).
:func:`logits_of` applies it, and without one refuses non-tensor outputs with a ``ValueError``
naming ``output_transform`` instead of failing later on ``'tuple' object has no attribute 'shape'``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import torch
from torch import nn

__all__ = ["OutputTransform", "check_output_transform", "describe_output", "logits_of", "transformed_output"]


def describe_output(output) -> str:
    """A short description of a model output for error messages.

    >>> describe_output((torch.zeros(2, 3), torch.zeros(2, 5)))
    'a tuple of 2 (Tensor(2, 3), Tensor(2, 5))'
    """
    def one(item):
        if isinstance(item, torch.Tensor):
            return f"Tensor{tuple(item.shape)}".replace(",)", ")")
        return type(item).__name__

    if isinstance(output, Mapping):
        return f"a {type(output).__name__} with keys {list(output)[:6]}"
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} of {len(output)} ({', '.join(one(o) for o in output[:4])}" \
               f"{', ...' if len(output) > 4 else ''})"
    return f"a {type(output).__name__}"


def logits_of(output, output_transform: Callable | None = None) -> torch.Tensor:
    """The logits tensor of a model ``output``: ``output_transform(output)`` when a transform is
    given, else ``output`` itself, which must then be a tensor.

    Raises:
        ValueError: ``output`` is a tuple, dict or anything but a tensor and no
            ``output_transform`` is given (the message suggests one), or the transform returns
            something other than a tensor.
        TypeError: ``output_transform`` is not callable.

    Example:
        >>> logits_of(torch.zeros(2, 3)).shape
        torch.Size([2, 3])
        >>> logits_of({"logits": torch.zeros(2, 3)}, lambda out: out["logits"]).shape
        torch.Size([2, 3])
        >>> logits_of((torch.zeros(2, 3), torch.zeros(2, 5)))
        Traceback (most recent call last):
        ...
        ValueError: the model returned a tuple of 2 (Tensor(2, 3), Tensor(2, 5)), not a tensor: pass output_transform=, a function from the model's output to its logits tensor (e.g. output_transform=lambda out: out[0])
    """
    if output_transform is not None:
        if not callable(output_transform):
            raise TypeError(f"output_transform must be callable (model output -> logits tensor), "
                            f"got {type(output_transform).__name__}")
        logits = output_transform(output)
        if not isinstance(logits, torch.Tensor):
            raise ValueError(f"output_transform must return the logits tensor, got {describe_output(logits)} "
                             f"from the model's output ({describe_output(output)})")
        return logits
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        key = next((k for k in ("logits", "out", "output") if k in output), next(iter(output), "logits"))
        example = f"lambda out: out[{key!r}]"
    elif isinstance(output, (tuple, list)):
        example = "lambda out: out[0]"
    else:
        example = "lambda out: out.logits"
    raise ValueError(f"the model returned {describe_output(output)}, not a tensor: pass output_transform=, a "
                     f"function from the model's output to its logits tensor (e.g. output_transform={example})")


class OutputTransform(nn.Module):
    """``logits_of(module(x), transform)`` as a module (it owns ``module``: parameters are shared,
    not copied)."""

    def __init__(self, module: nn.Module, transform: Callable):
        super().__init__()
        self.module = module
        self.transform = transform

    def forward(self, *args, **kwargs):
        return logits_of(self.module(*args, **kwargs), self.transform)


_ACTIVE = "_avalanche_plugins_output_transformed"


@contextlib.contextmanager
def transformed_output(model: nn.Module, transform: Callable | None):
    """Inside the block, ``model(x)`` returns ``logits_of(model's output, transform)``: a forward
    hook on ``model`` itself, removed on exit. Parameter and module names stay those of ``model``
    (unlike :class:`OutputTransform`, which nests it), so estimators keyed by parameter name, the
    layer map and ``torch.func.functional_call`` see the same model. ``transform`` None: nothing
    changes (a non-tensor output then fails in :func:`logits_of` where the caller checks it).
    Nested blocks on the same model apply the transform once (the outermost one).

    >>> class Pair(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = nn.Linear(2, 3)
    ...     def forward(self, x):
    ...         return self.fc(x), x
    >>> pair = Pair()
    >>> with transformed_output(pair, lambda out: out[0]):
    ...     pair(torch.zeros(1, 2)).shape
    torch.Size([1, 3])
    >>> type(pair(torch.zeros(1, 2))).__name__
    'tuple'
    """
    if transform is None or getattr(model, _ACTIVE, False):  # nested blocks transform once
        yield model
        return
    if not callable(transform):
        raise TypeError(f"output_transform must be callable (model output -> logits tensor), "
                        f"got {type(transform).__name__}")
    handle = model.register_forward_hook(lambda module, args, output: logits_of(output, transform))
    object.__setattr__(model, _ACTIVE, True)
    try:
        yield model
    finally:
        handle.remove()
        object.__delattr__(model, _ACTIVE)


def check_output_transform(output_transform) -> None:
    """``TypeError`` unless ``output_transform`` is None or callable (the constructors' check)."""
    if output_transform is not None and not callable(output_transform):
        raise TypeError(f"output_transform must be None or a callable (model output -> logits tensor), "
                        f"got {type(output_transform).__name__}")
