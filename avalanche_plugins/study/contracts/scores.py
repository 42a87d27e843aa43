"""One run's scores from its accuracy matrices (what a run's row carries; the statistics over seeds
are :mod:`~avalanche_plugins.study.report.stats`'s).

``R[i, j]`` is the test accuracy on experience ``j`` after training experience ``i`` (``T``
experiences); ``b_j`` the accuracy of the same run's untrained model: ACC, forgetting, BWT and FWT
as :mod:`~avalanche_plugins.study.report.stats` defines them: ``ACC = mean_j R[T-1, j]``,
``F = mean_{j<T-1} (max_{j<=i<T-1} R[i, j] - R[T-1, j])`` (Chaudhry et al., 2018).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from avalanche_plugins.study.contracts.rows import SCORES

__all__ = ["average_accuracy", "average_forgetting", "backward_transfer", "forgetting_per_experience", "forward_transfer", "run_scores"]


def backward_transfer(acc: np.ndarray) -> float:
    """Mean change from just-trained to final accuracy of every experience but the last.

    Example:
        >>> round(backward_transfer(np.array([[0.9, 0.1], [0.6, 0.8]])), 3)
        -0.3
    """
    if acc.shape[0] < 2:
        return 0.0
    last = acc.shape[0] - 1
    return float(np.mean([acc[last, j] - acc[j, j] for j in range(last)]))


def forward_transfer(acc: np.ndarray, baseline: Sequence[float]) -> float:
    """``mean_{j>=1} (R[j-1, j] - b_j)``: accuracy on each experience before training on it, over
    the untrained model's (NaN with one experience or a missing ``b_j``).

    Example:
        >>> round(forward_transfer(np.array([[0.9, 0.3], [0.6, 0.8]]), [0.1, 0.1]), 3)
        0.2
    """
    if acc.shape[0] < 2 or len(baseline) < acc.shape[1]:
        return float("nan")
    gains = [acc[j - 1, j] - baseline[j] for j in range(1, acc.shape[0])]
    return float(np.mean(gains)) if all(math.isfinite(g) for g in gains) else float("nan")


def forgetting_per_experience(acc: np.ndarray) -> list[float]:
    """``f_j = max_{j<=i<T-1} R[i, j] - R[T-1, j]`` for every ``j < T-1``.

    Example:
        >>> [round(f, 3) for f in forgetting_per_experience(np.array([[0.9, 0.1, 0.0], [0.7, 0.8, 0.1],
        ...                                                            [0.5, 0.6, 0.9]]))]
        [0.4, 0.2]
    """
    last = acc.shape[0] - 1
    return [float(np.nanmax(acc[j:last, j]) - acc[last, j]) for j in range(last)]


def run_scores(acc: np.ndarray, baseline: Sequence[float] | None = None,
               task_il: np.ndarray | None = None) -> dict:
    """ACC, task-incremental ACC, forgetting, BWT and FWT of one run (NaN where the matrix has
    holes, or where there is no task-incremental matrix / untrained baseline)."""
    nan = float("nan")
    if acc.size == 0 or np.isnan(acc[-1]).any() or np.isnan(np.diag(acc)).any():
        return {m: nan for m in SCORES}
    til = nan
    if task_il is not None and task_il.size and not np.isnan(task_il[-1]).any():
        til = average_accuracy(task_il)
    return {"acc": average_accuracy(acc), "acc_til": til, "forgetting": average_forgetting(acc),
            "bwt": backward_transfer(acc), "fwt": forward_transfer(acc, baseline) if baseline is not None else nan}


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
