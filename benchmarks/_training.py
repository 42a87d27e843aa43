"""The benchmarks' own training helpers (not in the wheel: the study trains with Avalanche's
strategies, :mod:`avalanche_plugins.study.run.job`): minibatch training and accuracies."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from avalanche_plugins import quiet_evaluator

__all__ = ["accuracy", "accuracy_evaluator", "batched_accuracy", "train_minibatches"]


def accuracy_evaluator(*extra_metrics, loggers=()):
    """:func:`quiet_evaluator` with per-experience accuracy (``Top1_Acc_Exp``)."""
    from avalanche.evaluation.metrics import accuracy_metrics

    return quiet_evaluator(accuracy_metrics(experience=True), *extra_metrics, loggers=loggers)


def train_minibatches(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float,
                      batch_size: int, generator: torch.Generator, optimizer: str = "adam",
                      task: int | None = None) -> int:
    """Cross-entropy training on ``(x, y)``: each epoch a fresh permutation from ``generator``,
    minibatches of ``batch_size`` in that order, one ``torch.optim.Adam`` or plain ``SGD`` step
    each; ``model(x, task)`` when ``task`` is given. Leaves the model in eval mode; returns the
    number of steps."""
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    opt = torch.optim.Adam(model.parameters(), lr=lr) if optimizer == "adam" else \
        torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    steps = 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            opt.zero_grad()
            out = model(x[idx]) if task is None else model(x[idx], task)
            loss_fn(out, y[idx]).backward()
            opt.step()
            steps += 1
    model.eval()
    return steps


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Top-1 accuracy of ``logits`` ``(N, C)``."""
    return float((logits.argmax(1) == targets).float().mean())


@torch.no_grad()
def batched_accuracy(forward: Callable[..., torch.Tensor], *inputs: torch.Tensor, targets: torch.Tensor,
                     batch_size: int = 500) -> float:
    """Top-1 accuracy of ``forward(*chunks)`` over aligned chunks of ``inputs`` of ``batch_size``
    rows (memory-bounded evaluation)."""
    correct = 0
    for s in range(0, len(targets), batch_size):
        out = forward(*(t[s:s + batch_size] for t in inputs))
        correct += int((out.argmax(-1) == targets[s:s + batch_size]).sum())
    return correct / len(targets)
