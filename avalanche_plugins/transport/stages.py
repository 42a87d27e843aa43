"""Stitching stages chosen from the model: what ``TransportKeyMetric(stages="auto")`` uses.

The probe runs on a deep copy of the model, in eval mode, with its forward hooks removed and no
gradient: choosing stages never changes the model (parameters, BatchNorm running statistics,
mode), never runs another plugin's hooks and draws no random numbers.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

__all__ = ["AUTO", "auto_stages", "example_inputs"]

AUTO = "auto"  # TransportKeyMetric(stages=AUTO): the metric chooses its stages on the model it sees


def _detached_copy(model: nn.Module) -> nn.Module:
    """A deep copy in eval mode without the hooks other code registered on ``model``'s modules."""
    probe = copy.deepcopy(model).eval()
    for module in probe.modules():
        for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                     "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called"):
            hooks = getattr(module, name, None)
            if hooks is not None:
                hooks.clear()
    return probe


def auto_stages(model: nn.Module, x: torch.Tensor, task_labels: torch.Tensor | None = None,
                max_stages: int = 3) -> list[str]:
    """Up to ``max_stages`` stitching stages, evenly spread: for every parametrised layer after the
    first (the layer map's order), the outermost module that can cut the model
    (:func:`~avalanche_plugins.core.split.split_points`) and finishes right before that layer
    starts. ``model`` is left untouched (the probe runs on a copy; module docstring)."""
    from avalanche_plugins.core.calls import model_forward
    from avalanche_plugins.core.layers import discover_layers
    from avalanche_plugins.core.split import split_points

    probe = _detached_copy(model)
    if task_labels is None:
        task_labels = torch.zeros(len(x), dtype=torch.long, device=x.device)

    class OneTask(nn.Module):  # a plain forward(x) for multi-task models
        def __init__(self):
            super().__init__()
            self.m = probe

        def forward(self, inputs):
            return model_forward(self.m, inputs, task_labels)

    wrapped = OneTask()
    layers = [layer.name for layer in discover_layers(wrapped, x)]
    try:
        points = set(split_points(wrapped, x))
    except TypeError:  # a multi-task model cannot be cut as a whole: its trunk can
        points = set()
        for name, child in probe.named_children():
            try:
                points |= {f"m.{name}", *(f"m.{name}.{p}" for p in split_points(child, x))}
            except (TypeError, RuntimeError, ValueError):
                continue
    events, hooks = [], []
    for name, module in wrapped.named_modules():
        if name:
            hooks.append(module.register_forward_pre_hook(lambda *_, n=name: events.append(("start", n))))
            hooks.append(module.register_forward_hook(lambda *_, n=name: events.append(("end", n))))
    try:
        with torch.no_grad():
            wrapped(x)
    finally:
        for hook in hooks:
            hook.remove()
    stages: list[str] = []
    for layer in layers[1:]:
        before = [n for kind, n in events[:events.index(("start", layer))] if kind == "end" and n in points]
        if before and before[-1][2:] not in stages:
            stages.append(before[-1][2:])
    if len(stages) > max_stages:
        stages = [stages[i] for i in dict.fromkeys(np.linspace(0, len(stages) - 1, max_stages).round().astype(int))]
    if not stages:
        raise ValueError(f"TransportKeyMetric: found no stage to stitch at in {type(model).__name__}; "
                         "give stages=[...] (submodule names)")
    return stages


def example_inputs(dataset, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, task labels)`` of the first ``n`` samples of a dataset (its eval transforms when it has
    them; task 0 for ``(x, y)`` samples)."""
    data = dataset.eval() if hasattr(dataset, "eval") else dataset
    items = [data[i] for i in range(min(n, len(data)))]
    x = torch.stack([torch.as_tensor(item[0]) for item in items])
    t = torch.as_tensor([int(item[-1]) if len(item) > 2 else 0 for item in items])
    return x, t
