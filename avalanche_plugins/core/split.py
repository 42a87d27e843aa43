"""Cutting a model after a layer into "everything up to it" and "the rest".

:func:`split_model` returns ``(early, late)`` with ``late(early(x)) == model(x)`` exactly; transport
keys and stitching (:mod:`avalanche_plugins.transport`) use it to put a key between the two parts.
Models returning a tuple or a dict take ``output_transform`` (:mod:`avalanche_plugins.core.outputs`):
then ``late(early(x)) == output_transform(model(x))``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from avalanche_plugins.core.calls import eval_mode, first_tensor
from avalanche_plugins.core.checks import check_model_inputs
from avalanche_plugins.core.outputs import OutputTransform, logits_of

__all__ = ["Reshape", "split_model", "split_points"]




def _chain(model: nn.Module, x: torch.Tensor, transform=None):
    """Return ``([(name, child, input_shape)], last_transformed)`` if ``model``'s forward is exactly
    ``child_k(... child_1(x))`` with at most reshaping between them, else ``None``.

    With a ``transform``, the model's output is compared through it: with the last child's output
    through it too when that is of the same type as the model's (a head returning the tuple; then
    ``last_transformed``), else as it is (a forward that packs the last child's logits into a
    tuple or dict)."""
    children = dict(model.named_children())
    if not children:
        return None
    calls: list[tuple[str, torch.Tensor, object]] = []
    handles = [
        child.register_forward_hook(
            lambda mod, inp, out, n=name: calls.append((n, first_tensor(inp), out))
        )
        for name, child in children.items()
    ]
    try:
        with torch.no_grad():
            y = model(x)
    finally:
        for h in handles:
            h.remove()
    raw = y
    if transform is not None:
        y = logits_of(y, transform)
    if not calls or len({n for n, _, _ in calls}) != len(calls) or not isinstance(y, torch.Tensor):
        return None
    last_transformed = transform is not None and type(calls[-1][2]) is type(raw)
    try:
        calls = [(n, inp, logits_of(out, transform) if i == len(calls) - 1 and last_transformed else first_tensor(out))
                 for i, (n, inp, out) in enumerate(calls)]
    except (ValueError, TypeError, KeyError, IndexError):  # the transform does not fit the last child's output
        return None

    def same(a, b):
        return (
            a is not None
            and b is not None
            and a.numel() == b.numel()
            and torch.equal(a.reshape(b.shape), b)
        )

    prev = x
    for _, inp, out in calls:
        if not same(prev, inp):
            return None
        prev = out
    if not same(prev, y):
        return None
    return [(n, children[n], tuple(inp.shape[1:])) for n, inp, _ in calls], last_transformed


class Reshape(nn.Module):
    """Reshape every sample to ``shape`` (the batch dimension is kept)."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.shape = tuple(shape)

    def forward(self, x):
        return x.reshape(x.shape[0], *self.shape)

    def extra_repr(self) -> str:
        return f"shape={self.shape}"


@dataclass
class _Entry:
    path: str
    module: nn.Module
    in_shape: tuple
    out_shape: tuple


def _flat_chain(model: nn.Module, x: torch.Tensor, prefix: str = "", transform=None) -> list[_Entry]:
    """Expand chain-like containers recursively into atomic entries (``transform`` applies to
    ``model``'s output: it goes down to the last child, and an atomic entry gets it wrapped in)."""
    found = _chain(model, x, transform)
    if found is None:
        with torch.no_grad():
            y = logits_of(model(x), transform)
        module = model if transform is None else OutputTransform(model, transform)
        return [_Entry(prefix, module, tuple(x.shape[1:]), tuple(y.shape[1:]))]
    chain, last_transformed = found
    entries: list[_Entry] = []
    h = x
    for i, (name, child, in_shape) in enumerate(chain):
        path = f"{prefix}.{name}" if prefix else name
        h = h.reshape(h.shape[0], *in_shape)
        last = transform if i == len(chain) - 1 and last_transformed else None
        entries.extend(_flat_chain(child, h, path, last))
        with torch.no_grad():
            h = child(h) if last is None else logits_of(child(h), last)
    return entries


def _traced_entries(model: nn.Module, example_input, output_transform=None) -> tuple[list[_Entry], tuple]:
    if not isinstance(example_input, torch.Tensor):
        raise TypeError(
            f"example_input must be a single tensor for splitting, got {type(example_input).__name__}"
        )
    with eval_mode(model), torch.no_grad():
        out_shape = tuple(logits_of(model(example_input), output_transform).shape[1:])
        return _flat_chain(model, example_input, transform=output_transform), out_shape


def _build(entries: list[_Entry], in_shape: tuple, out_shape: tuple | None) -> nn.Sequential:
    modules: list[nn.Module] = []
    shape = in_shape
    for entry in entries:
        if entry.in_shape != shape:
            modules.append(Reshape(entry.in_shape))
        modules.append(entry.module)
        shape = entry.out_shape
    if out_shape is not None and out_shape != shape:
        modules.append(Reshape(out_shape))
    return nn.Sequential(*modules)


def _covers(at: str, path: str) -> bool:
    return path == at or path.startswith(at + ".")


def split_points(model: nn.Module, example_input: torch.Tensor, *, output_transform=None) -> list[str]:
    """Names at which :func:`split_model` can cut ``model``, in forward order (e.g. the items of
    an ``nn.Sequential``, or torchvision ResNet's ``conv1 ... layer1 ... layer4, avgpool``).
    The last module is excluded: cutting there leaves nothing for the late part.
    ``output_transform`` as in :func:`split_model`."""
    entries, _ = _traced_entries(model, example_input, output_transform)
    points = []
    for i, entry in enumerate(entries[:-1]):
        parts = entry.path.split(".")
        for k in range(len(parts)):
            name = ".".join(parts[: k + 1])
            # an ancestor is a split point only if its last entry is entry i
            if not any(_covers(name, e.path) for e in entries[i + 1 :]):
                points.append(name)
    return list(dict.fromkeys(points))


def split_model(
    model: nn.Module, at: str, example_input: torch.Tensor, *, output_transform=None
) -> tuple[nn.Sequential, nn.Sequential]:
    """Cut ``model`` after the module named ``at`` into ``(early, late)`` with
    ``late(early(x)) == model(x)`` exactly (``== output_transform(model(x))`` with a transform).

    Works for models whose forward is a chain of submodules with at most reshaping between
    them (``nn.Sequential``, Avalanche's ``SimpleMLP``, torchvision's ResNet whose forward is
    ``conv1, bn1, relu, maxpool, layer1..layer4, avgpool, flatten, fc``), recursing into nested
    chains. The returned modules share parameters with ``model`` (no copy), so the early part of
    one model can feed the late part of another model of the same architecture.

    Args:
        model: the model to cut.
        at: module path (as in ``model.named_modules()``) after which to cut.
        example_input: one example batch (a tensor) used to trace the forward pass.
        output_transform: for models returning a tuple or a dict, a function from the model's
            output to its logits tensor (e.g. ``lambda out: out[0]``); the late part ends with it
            (:func:`~avalanche_plugins.core.outputs.logits_of`). Without it such a model raises a
            ``ValueError`` naming ``output_transform``.

    Raises:
        ValueError: ``at`` names no submodule, sits inside a block whose forward is not a
            chain (a residual block's ``conv1``), or is the last module; the message lists the
            valid split points.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> early, late = split_model(net, "1", torch.randn(2, 4))
        >>> x = torch.randn(5, 4)
        >>> torch.equal(late(early(x)), net(x))
        True
    """
    if isinstance(example_input, torch.Tensor):  # anything else gets the "single tensor" error below
        check_model_inputs(model, example_input, "example_input")
    if at == "" or at not in dict(model.named_modules()):
        raise ValueError(f"at={at!r} names no submodule of {type(model).__name__}")
    entries, out_shape = _traced_entries(model, example_input, output_transform)
    covered = [i for i, e in enumerate(entries) if _covers(at, e.path)]
    if not covered or covered[-1] == len(entries) - 1:
        reason = (
            "it is the last module, so nothing would remain in the late part"
            if covered
            else "it sits inside a block whose forward is not a chain (e.g. a residual block)"
        )
        raise ValueError(
            f"cannot split at {at!r}: {reason}; valid split points: "
            f"{split_points(model, example_input, output_transform=output_transform)}"
        )
    cut = covered[-1] + 1
    in_shape = tuple(example_input.shape[1:])
    early = _build(entries[:cut], in_shape, None)
    late = _build(entries[cut:], entries[cut - 1].out_shape, out_shape)
    return early, late
