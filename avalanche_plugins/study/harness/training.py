"""ACC and forgetting of an accuracy matrix, and the Avalanche helpers the study's runs share.

* Avalanche helpers: :func:`quiet_evaluator` (re-exported from the package), :func:`quiet_deprecations`.
* Scores: :func:`average_accuracy`, :func:`average_forgetting`; over a union of experiences, the
  library's ``avalanche_plugins.stream_accuracy``. (The benchmarks' hand-written loops and
  accuracies live in ``benchmarks/_training.py``.)

``R[i, j]`` is the test accuracy on experience ``j`` after training on experiences ``0..i``
(read from Avalanche's ``Top1_Acc_Exp`` metric). From it: final average accuracy
``ACC = mean_j R[T-1, j]`` and average forgetting
``F = mean_{j<T-1} (max_{j<=i<T-1} R[i, j] - R[T-1, j])`` (Chaudhry et al., 2018).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np

from avalanche_plugins import quiet_evaluator

__all__ = [
    "average_accuracy",
    "average_forgetting",
    "quiet_deprecations",
    "quiet_evaluator",
]


@contextlib.contextmanager
def quiet_deprecations():
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
