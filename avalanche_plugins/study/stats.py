"""Statistics of a study: per-run ACC / forgetting / BWT from the accuracy matrix, summaries over
seeds with t-intervals, paired t-tests against a reference strategy, Holm's correction.

``R[i, j]`` is the test accuracy on experience ``j`` after training experience ``i``:

* ``ACC = mean_j R[T-1, j]`` (final average accuracy);
* ``forgetting = mean_{j<T-1} (max_{j<=i<T-1} R[i, j] - R[T-1, j])`` (Chaudhry et al., 2018);
* ``BWT = mean_{j<T-1} (R[T-1, j] - R[j, j])`` (Lopez-Paz & Ranzato, 2017; Avalanche's
  ``StreamBWT``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from avalanche_plugins.study.harness.training import average_accuracy, average_forgetting

__all__ = ["METRICS", "HIGHER_IS_BETTER", "backward_transfer", "describe", "holm", "paired_test",
           "run_scores", "summarize_study"]

METRICS = ("acc", "forgetting", "bwt")
HIGHER_IS_BETTER = {"acc": True, "forgetting": False, "bwt": True}


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


def run_scores(acc: np.ndarray) -> dict:
    """ACC, forgetting and BWT of one run's accuracy matrix (NaN when it has holes)."""
    if acc.size == 0 or np.isnan(acc[-1]).any() or np.isnan(np.diag(acc)).any():
        return {m: float("nan") for m in METRICS}
    return {"acc": average_accuracy(acc), "forgetting": average_forgetting(acc), "bwt": backward_transfer(acc)}


def describe(values: Sequence[float], confidence: float = 0.95) -> dict:
    """Mean, sample std, n and the two-sided t-interval of the mean (NaN interval for n < 2).

    Example:
        >>> d = describe([0.5, 0.7, 0.6])
        >>> round(d["mean"], 3), round(d["std"], 3), round(d["ci_low"], 3), round(d["ci_high"], 3)
        (0.6, 0.1, 0.352, 0.848)
    """
    from scipy import stats

    xs = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(xs)
    mean = float(xs.mean()) if n else float("nan")
    std = float(xs.std(ddof=1)) if n > 1 else float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)) if n > 1 else float("nan")
    return {"mean": mean, "std": std, "n": n, "ci_low": mean - half, "ci_high": mean + half}


def paired_test(values: Mapping[int, float], reference: Mapping[int, float]) -> dict:
    """Paired t-test over the seeds both have: ``{"t", "p", "n", "mean_diff"}`` (NaN for n < 2;
    p = 1 when every difference is 0)."""
    from scipy import stats

    seeds = sorted(s for s in values if s in reference and math.isfinite(values[s]) and math.isfinite(reference[s]))
    diffs = np.array([values[s] - reference[s] for s in seeds])
    out = {"n": len(seeds), "mean_diff": float(diffs.mean()) if len(seeds) else float("nan"),
           "t": float("nan"), "p": float("nan")}
    if len(seeds) < 2:
        return out
    if np.all(diffs == 0):
        return {**out, "t": 0.0, "p": 1.0}
    result = stats.ttest_rel([values[s] for s in seeds], [reference[s] for s in seeds])
    return {**out, "t": float(result.statistic), "p": float(result.pvalue)}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (NaN entries stay NaN and do not count).

    Example:
        >>> [round(p, 3) for p in holm([0.01, 0.04, 0.03])]
        [0.03, 0.06, 0.06]
    """
    finite = [(p, i) for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    adjusted = [float("nan")] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(finite)):
        running = max(running, min(1.0, (len(finite) - rank) * p))
        adjusted[i] = running
    return adjusted


def summarize_study(rows: Sequence[Mapping], reference: str, strategies: Sequence[str]) -> list[dict]:
    """Per (scenario, strategy): ``{metric: describe(...)}`` over seeds and, for every strategy but
    ``reference``, the paired test of each metric against it with Holm's correction across the
    scenario's comparisons of that metric. Order: scenarios as they appear, strategies as given."""
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    summary = []
    for scenario in scenarios:
        part = [r for r in rows if r["scenario"] == scenario]
        by_strategy = {name: {r["seed"]: r for r in part if r["strategy"] == name} for name in strategies}
        entries = []
        for name in strategies:
            runs = by_strategy[name]
            if not runs:
                continue
            entry = {"scenario": scenario, "strategy": name, "setting": next(iter(runs.values()))["setting"],
                     "seeds": sorted(runs), "tests": {}}
            for metric in METRICS:
                entry[metric] = describe([r[metric] for r in runs.values()])
            entries.append(entry)
        ref_runs = by_strategy.get(reference, {})
        for metric in METRICS:
            compared = [e for e in entries if e["strategy"] != reference and ref_runs]
            tests = [paired_test({s: by_strategy[e["strategy"]][s][metric] for s in e["seeds"]},
                                 {s: r[metric] for s, r in ref_runs.items()}) for e in compared]
            for entry, test, p_holm in zip(compared, tests, holm([t["p"] for t in tests])):
                entry["tests"][metric] = {**test, "p_holm": p_holm}
        summary += entries
    return summary
