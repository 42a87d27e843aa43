"""Evaluation helpers for code that drives a strategy itself: accuracy over experiences, and an
``EvaluationPlugin`` that does not warn when no logger is given.
"""

from __future__ import annotations

import warnings

import torch

from avalanche_plugins._avalanche.data import dataset_subset, experience_batches
from avalanche_plugins.core.calls import eval_mode, model_forward, sample_stride
from avalanche_plugins.core.parallel import unwrap_model

__all__ = ["quiet_evaluator", "stream_accuracy"]


#: floats of evaluation batches a ``stream_accuracy`` cache keeps (1 GiB in float32); an
#: experience that would pass it is read again at every call
CACHE_FLOATS = 1 << 28


@torch.no_grad()
def stream_accuracy(strategy, experiences, *, batch_size: int = 256, cache: dict | None = None,
                    samples_per_experience: int | None = None) -> float:
    """Top-1 accuracy of ``strategy.model`` over the union of ``experiences``' datasets (eval
    transforms; sample-weighted), on the strategy's device, in eval mode.

    ``cache``: a dict kept by the caller across calls on the same experiences (a metric
    evaluating them at every cycle): each experience's evaluation batches are read once through
    its dataset and kept there (up to ``CACHE_FLOATS`` floats in all), so a later call only
    runs the model; the batches are the same, so is the accuracy (a random evaluation transform
    is drawn once).

    ``samples_per_experience``: evaluate every ``⌈n / samples_per_experience⌉``-th sample of an
    experience of ``n`` (all of them when ``n`` is not larger, or for None), the same samples at
    every call."""
    correct = total = 0
    model = unwrap_model(strategy.model)  # not DDP's forward: no collective from one rank's evaluation
    with eval_mode(model):
        for experience in experiences:
            for x, y, t in _evaluation_batches(strategy, experience, batch_size, cache, samples_per_experience):
                pred = model_forward(model, x, t).argmax(1)
                correct += int((pred == y).sum())
                total += int(y.numel())
    if total == 0:
        raise ValueError("no test samples to evaluate")
    return correct / total


def _evaluation_batches(strategy, experience, batch_size: int, cache: dict | None, samples: int | None = None):
    """``experience``'s evaluation batches ``(x, y, task labels)`` on the strategy's device (every
    ``⌈n / samples⌉``-th sample), from ``cache`` when it holds them (keyed by the dataset object,
    the batch size, the stride and the device)."""
    data = experience.dataset
    stride = sample_stride(len(data), samples)
    key = (id(data), batch_size, stride, str(strategy.device))
    if cache is not None and key in cache and cache[key][0] is data:
        return cache[key][1]
    view = data.eval() if hasattr(data, "eval") else data
    if stride > 1:
        view = dataset_subset(view, list(range(0, len(view), stride)))
    batches = [(x, y, torch.as_tensor(t).to(x.device))
               for x, y, t in experience_batches(strategy, dataset=view, batch_size=batch_size)]
    if cache is not None:
        held = sum(x.numel() for _, entry in cache.values() for x, _, _ in entry)
        if held + sum(x.numel() for x, _, _ in batches) <= CACHE_FLOATS:
            cache[key] = (data, batches)
    return batches



def quiet_evaluator(*metrics, loggers=()):
    """An ``EvaluationPlugin`` with ``metrics`` that does not warn about missing loggers."""
    from avalanche.training.plugins import EvaluationPlugin

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        return EvaluationPlugin(*metrics, loggers=list(loggers), collect_all=False)
