"""Train an Avalanche strategy on a stream and read back the accuracy matrix.

``R[i, j]`` is the test accuracy on experience ``j`` after training on experiences ``0..i``
(read from Avalanche's ``Top1_Acc_Exp`` metric). From it: final average accuracy
``ACC = mean_j R[T-1, j]`` and average forgetting
``F = mean_{j<T-1} (max_{j<=i<T-1} R[i, j] - R[T-1, j])`` (Chaudhry et al., 2018).
"""

from __future__ import annotations

import contextlib
import re
import warnings

import numpy as np
from tqdm.auto import tqdm

__all__ = ["accuracy_evaluator", "run_stream", "average_accuracy", "average_forgetting"]

_ACC_EXP = re.compile(r"^Top1_Acc_Exp/eval_phase/test_stream/(?:Task\d+/)?Exp(\d+)$")


@contextlib.contextmanager
def _quiet_deprecations():
    """Drop DeprecationWarnings while training. Avalanche's ``deprecated`` decorator (called by
    ReplayPlugin every experience) re-enables them globally with ``simplefilter("once")``, which
    beats any filter, so the display hook is what has to change."""
    original = warnings.showwarning

    def show(message, category, *args, **kwargs):
        if not issubclass(category, DeprecationWarning):
            original(message, category, *args, **kwargs)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original


def accuracy_evaluator(*extra_metrics, loggers=()):
    """An ``EvaluationPlugin`` with per-experience accuracy (what :func:`run_stream` reads)."""
    from avalanche.evaluation.metrics import accuracy_metrics
    from avalanche.training.plugins import EvaluationPlugin

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        return EvaluationPlugin(accuracy_metrics(experience=True), *extra_metrics,
                                loggers=list(loggers), collect_all=False)


def run_stream(strategy, benchmark, *, progress: str | None = None, eval_every_experience: bool = True,
               **train_kwargs) -> np.ndarray:
    """Train ``strategy`` on every experience of ``benchmark.train_stream``; after each one
    evaluate on the whole test stream. Returns the accuracy matrix ``R`` (T × T).

    With ``eval_every_experience=False`` only the final row is measured (others are NaN).
    """
    train_stream, test_stream = benchmark.train_stream, benchmark.test_stream
    n = len(train_stream)
    acc = np.full((n, len(test_stream)), np.nan)
    for i, experience in enumerate(tqdm(train_stream, desc=progress, disable=progress is None, leave=False)):
        with _quiet_deprecations():
            strategy.train(experience, num_workers=0, **train_kwargs)
        if eval_every_experience or i == n - 1:
            metrics = strategy.eval(test_stream, num_workers=0)
            for name, value in metrics.items():
                match = _ACC_EXP.match(name)
                if match:
                    acc[i, int(match.group(1))] = value
    return acc


def average_accuracy(acc: np.ndarray) -> float:
    """Mean accuracy over all experiences after the last one was trained.

    Example:
        >>> average_accuracy(np.array([[0.9, 0.1], [0.6, 0.8]]))
        0.7
    """
    return float(np.mean(acc[-1]))


def average_forgetting(acc: np.ndarray) -> float:
    """Mean drop from each earlier experience's best accuracy to its final accuracy.

    Example:
        >>> round(average_forgetting(np.array([[0.9, 0.1], [0.6, 0.8]])), 3)
        0.3
    """
    if acc.shape[0] < 2:
        return 0.0
    last = acc.shape[0] - 1
    drops = [np.nanmax(acc[j:last, j]) - acc[last, j] for j in range(last)]
    return float(np.mean(drops))
