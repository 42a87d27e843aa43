"""Ranking agreement between a predictor and the truth: pairwise ranking accuracy, Spearman, Kendall."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["pairwise_ranking_accuracy", "spearman", "kendall_tau"]




def _paired(a, b, name_a: str, name_b: str):
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"{name_a} has {a.size} values but {name_b} has {b.size}")
    if a.size < 2:
        raise ValueError(f"{name_a} needs at least 2 values, got {a.size}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError(f"{name_a} and {name_b} must be finite")
    return a, b


def pairwise_ranking_accuracy(metric_values, true_gains) -> float:
    """Fraction of pairs that ``metric_values`` orders like ``true_gains``.

    .. math:: \\frac{\\sum_{i<j,\\ t_i \\ne t_j} \\big[\\mathbb 1\\{(m_i-m_j)(t_i-t_j) > 0\\}
              + \\tfrac12 \\mathbb 1\\{m_i = m_j\\}\\big]}{\\#\\{i<j : t_i \\ne t_j\\}}

    Pairs with equal true gains are skipped; metric ties count ½. Without ties this is
    ``(1 + τ_a)/2`` (Kendall's τ_a).

    Raises:
        ValueError: different lengths, fewer than 2 values, non-finite values, or all true gains
            equal (no pair to rank).

    Example:
        >>> pairwise_ranking_accuracy([0.1, 0.2, 0.2], [1.0, 2.0, 3.0])
        0.8333333333333334
    """
    m, t = _paired(metric_values, true_gains, "metric_values", "true_gains")
    upper = np.triu(np.ones((m.size, m.size), dtype=bool), k=1)
    dm = np.sign(m[:, None] - m[None, :])[upper]
    dt = np.sign(t[:, None] - t[None, :])[upper]
    keep = dt != 0
    if not keep.any():
        raise ValueError("true_gains are all equal: there is no pair to rank")
    score = (dm[keep] * dt[keep] > 0) + 0.5 * (dm[keep] == 0)
    return float(score.mean())


def _average_ranks(a: np.ndarray) -> np.ndarray:
    ordered = np.sort(a)
    below = np.searchsorted(ordered, a, side="left")
    upto = np.searchsorted(ordered, a, side="right")
    return (below + upto + 1) / 2.0


def spearman(a, b) -> float:
    """Spearman's rank correlation: Pearson correlation of average ranks (ties share their mean rank).

    .. math:: ρ = \\frac{\\operatorname{cov}(\\operatorname{rank} a, \\operatorname{rank} b)}
              {σ_{\\operatorname{rank} a}\\, σ_{\\operatorname{rank} b}}

    NaN when either input is constant (as ``scipy.stats.spearmanr``).

    Example:
        >>> spearman([1, 2, 3, 4], [10, 20, 30, 25])
        0.8
    """
    a, b = _paired(a, b, "a", "b")
    ra, rb = _average_ranks(a), _average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denom) if denom > 0 else float("nan")


def kendall_tau(a, b) -> float:
    """Kendall's τ_b (ties in either input handled).

    .. math:: τ_b = \\frac{\\sum_{i<j} \\operatorname{sgn}(a_i-a_j)\\operatorname{sgn}(b_i-b_j)}
              {\\sqrt{(n_0-n_a)(n_0-n_b)}}

    with ``n_0 = n(n−1)/2`` and ``n_a``, ``n_b`` the tied pairs of each input. NaN when either input
    is constant (as ``scipy.stats.kendalltau``).

    Example:
        >>> kendall_tau([1, 2, 3], [1, 3, 2])
        0.3333333333333333
    """
    a, b = _paired(a, b, "a", "b")
    upper = np.triu(np.ones((a.size, a.size), dtype=bool), k=1)
    da = np.sign(a[:, None] - a[None, :])[upper]
    db = np.sign(b[:, None] - b[None, :])[upper]
    denom = math.sqrt(float((da != 0).sum()) * float((db != 0).sum()))
    return float((da * db).sum() / denom) if denom > 0 else float("nan")
