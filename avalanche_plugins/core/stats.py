"""Statistics for evaluating predictors: rank agreement (pairwise ranking accuracy, Spearman,
Kendall, direction consistency), calibration (ECE) and the mean per-sample shift."""

from __future__ import annotations

import math

import numpy as np
import torch

from avalanche_plugins.core.checks import check_inputs, check_int

__all__ = ["pairwise_ranking_accuracy", "spearman", "kendall_tau", "expected_calibration_error",
           "direction_consistency", "mean_row_norm"]




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


def expected_calibration_error(logits: torch.Tensor, targets: torch.Tensor, n_bins: int = 15) -> float:
    """Expected calibration error with ``n_bins`` equal-width confidence bins.

    .. math:: \\mathrm{ECE} = \\sum_{k=1}^{K} \\frac{|B_k|}{N} \\,
              \\big| \\operatorname{acc}(B_k) - \\operatorname{conf}(B_k) \\big|

    Confidence = max softmax probability, prediction = its argmax; bin ``k`` holds confidences in
    ``((k−1)/K, k/K]``.

    Example:
        >>> logits = torch.log(torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]]))
        >>> round(expected_calibration_error(logits, torch.tensor([0, 1, 1]), n_bins=4), 6)
        0.133333
    """
    check_int("n_bins", n_bins)
    check_inputs(logits, targets, name="logits")
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (N, C), got {tuple(logits.shape)}")
    if targets.dtype.is_floating_point or targets.dim() != 1:
        raise ValueError("targets must be a 1-D tensor of class indices")
    n_classes = logits.shape[1]
    if bool(((targets < 0) | (targets >= n_classes)).any()):
        raise ValueError(f"targets must be class indices in [0, {n_classes})")
    probs = torch.softmax(logits.detach().double(), dim=1)
    confidence, prediction = probs.max(dim=1)
    correct = (prediction == targets.to(prediction.device)).double()
    bins = torch.clamp(torch.ceil(confidence * n_bins).long() - 1, 0, n_bins - 1)
    n = logits.shape[0]
    ece = 0.0
    for k in range(n_bins):
        members = bins == k
        count = int(members.sum())
        if count:
            ece += count / n * abs(float(correct[members].mean() - confidence[members].mean()))
    return float(ece)



def direction_consistency(pairs, ads, shift) -> float:
    """Fraction of one-edit architecture pairs whose ADS and true shift change in the same direction.

    .. math:: \\mathrm{DC} = \\frac{\\sum_{(i,j)} \\big[\\mathbb 1\\{(a_j-a_i)(s_j-s_i) > 0\\}
              + \\tfrac12 \\mathbb 1\\{a_j = a_i\\}\\big]}{\\#\\{(i,j) : s_i \\ne s_j\\}}

    ``pairs`` are ``(i, j)`` keys into ``ads`` and ``shift`` (sequences or mappings). Pairs with
    equal true shifts are skipped; ADS ties count ½ (as
    :func:`pairwise_ranking_accuracy`).

    Raises:
        ValueError: no pairs, a key missing, non-finite values, or every pair has tied shifts.

    Example:
        >>> direction_consistency([(0, 1), (1, 2), (0, 2)], [1.0, 2.0, 1.5], [10.0, 20.0, 30.0])
        0.6666666666666666
    """
    pairs = list(pairs)
    if not pairs:
        raise ValueError("pairs is empty: direction consistency needs at least one pair")
    score, counted = 0.0, 0
    for pair in pairs:
        if len(pair) != 2:
            raise ValueError(f"every pair must be (i, j), got {pair!r}")
        i, j = pair
        try:
            a_i, a_j, s_i, s_j = float(ads[i]), float(ads[j]), float(shift[i]), float(shift[j])
        except (KeyError, IndexError) as error:
            raise ValueError(f"pair {pair!r} names an architecture missing from ads or shift") from error
        if not all(math.isfinite(v) for v in (a_i, a_j, s_i, s_j)):
            raise ValueError(f"pair {pair!r} has non-finite ads or shift values")
        if s_i == s_j:
            continue
        counted += 1
        if a_i == a_j:
            score += 0.5
        elif (a_j - a_i) * (s_j - s_i) > 0:
            score += 1.0
    if counted == 0:
        raise ValueError("every pair has equal true shifts: there is no direction to compare")
    return score / counted


def mean_row_norm(delta: torch.Tensor) -> float:
    """``mean_i ‖delta_i‖₂`` over the first dimension (float64): the mean per-sample shift."""
    return float(delta.reshape(delta.shape[0], -1).double().norm(dim=1).mean())
