"""Evaluation helpers for code that drives a strategy itself: accuracy over experiences, and an
``EvaluationPlugin`` that does not warn when no logger is given.
"""

from __future__ import annotations

import warnings

import torch

from avalanche_plugins._avalanche.data import experience_batches
from avalanche_plugins.core.calls import eval_mode, model_forward

__all__ = ["quiet_evaluator", "stream_accuracy"]


@torch.no_grad()
def stream_accuracy(strategy, experiences, *, batch_size: int = 256) -> float:
    """Top-1 accuracy of ``strategy.model`` over the union of ``experiences``' datasets (eval
    transforms; sample-weighted), on the strategy's device, in eval mode."""
    correct = total = 0
    model = strategy.model
    with eval_mode(model):
        for experience in experiences:
            data = experience.dataset
            data = data.eval() if hasattr(data, "eval") else data
            for x, y, t in experience_batches(strategy, dataset=data, batch_size=batch_size):
                pred = model_forward(model, x, torch.as_tensor(t).to(x.device)).argmax(1)
                correct += int((pred == y).sum())
                total += int(y.numel())
    if total == 0:
        raise ValueError("no test samples to evaluate")
    return correct / total



def quiet_evaluator(*metrics, loggers=()):
    """An ``EvaluationPlugin`` with ``metrics`` that does not warn about missing loggers."""
    from avalanche.training.plugins import EvaluationPlugin

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        return EvaluationPlugin(*metrics, loggers=list(loggers), collect_all=False)
