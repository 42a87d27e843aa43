"""Transport-key stages chosen per model: what ``TransportKeyMetric`` gets for ``stages: auto``."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["auto_stages", "example_batch"]


def auto_stages(model: nn.Module, x: torch.Tensor, task_labels: torch.Tensor, max_stages: int = 3) -> list[str]:
    """Up to ``max_stages`` stitching stages, evenly spread: for every parametrised layer after the
    first (the layer map's order), the outermost module that can cut the model
    (``split_points``) and finishes right before that layer starts."""
    from avalanche.models import avalanche_forward

    from avalanche_plugins.core.layers import discover_layers
    from avalanche_plugins.core.split import split_points

    class OneTask(nn.Module):  # a plain forward(x) for multi-task models
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, inputs):
            return avalanche_forward(self.m, inputs, task_labels)

    wrapped = OneTask()
    layers = [layer.name for layer in discover_layers(wrapped, x)]
    try:
        points = set(split_points(wrapped, x))
    except TypeError:  # a multi-task model cannot be cut as a whole: its trunk can
        points = set()
        for name, child in model.named_children():
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
                         "give metrics[...].kwargs.stages")
    return stages


def example_batch(stream, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, task labels)`` of the first ``n`` training samples of a ``Stream`` (for a model probe)."""
    data = stream.benchmark.train_stream[0].dataset
    items = [data[i] for i in range(min(n, len(data)))]
    x = torch.stack([item[0] for item in items])
    t = torch.as_tensor([int(item[-1]) if len(item) > 2 else 0 for item in items])
    return x, t
