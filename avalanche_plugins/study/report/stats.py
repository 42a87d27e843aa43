"""Statistics of a study: summaries over seeds with intervals that respect each metric's range,
paired t-tests against a reference strategy with Holm's correction, of the per-run scores from the
accuracy matrix (:mod:`~avalanche_plugins.study.contracts.scores`, re-exported here).

``R[i, j]`` is the test accuracy on experience ``j`` after training experience ``i`` (``T``
experiences); ``b_j`` the accuracy of the same run's untrained (randomly initialised) model:

* ``ACC = mean_j R[T-1, j]`` (final average accuracy; ``acc_til``: the same from the
  task-incremental matrix, logits masked to each experience's classes);
* ``forgetting = mean_{j<T-1} f_j``, ``f_j = max_{j<=i<T-1} R[i, j] - R[T-1, j]`` (Chaudhry et al.,
  2018);
* ``BWT = mean_{j<T-1} (R[T-1, j] - R[j, j])`` (Lopez-Paz & Ranzato, 2017; Avalanche's
  ``StreamBWT``);
* ``FWT = mean_{j>=1} (R[j-1, j] - b_j)`` (Lopez-Paz & Ranzato, 2017).

Intervals: a 95 % percentile bootstrap of the mean over seeds — every resample of the seeds
enumerated exactly for up to 6 seeds, 10,000 seeded resamples above — so an interval never
leaves the range the metric's values lie in. Paired t-tests need at least
:data:`MIN_SEEDS_FOR_TESTS` seeds; with fewer there is no p-value (the tables say why).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from avalanche_plugins.study.contracts.rows import SCORES, RunRow
from avalanche_plugins.study.contracts.scores import (
    backward_transfer,
    forgetting_per_experience,
    forward_transfer,
    run_scores,
)

__all__ = ["METRICS", "HIGHER_IS_BETTER", "MIN_SEEDS_FOR_TESTS", "SCORES", "TESTED", "backward_transfer",
           "bootstrap_interval", "describe", "forgetting_per_experience", "forward_transfer", "holm",
           "paired_test", "run_scores", "summarize_diagnostics", "summarize_study", "describe_columns"]

COSTS = ("train_s", "diagnostics_s", "figures_s", "peak_memory_mb")  # what the run cost
METRICS = (*SCORES, *COSTS)
TESTED = SCORES  # paired tests against the reference (costs are reported, not tested)
HIGHER_IS_BETTER = {"acc": True, "acc_til": True, "forgetting": False, "bwt": True, "fwt": True,
                    "train_s": False, "diagnostics_s": False, "figures_s": False, "peak_memory_mb": False}
MIN_SEEDS_FOR_TESTS = 3
_EXACT_UP_TO = 6  # seeds whose bootstrap resamples are enumerated exactly (6**6 = 46,656)


def bootstrap_interval(values: Sequence[float], confidence: float = 0.95, *, resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean. Up to 6 values every one of the ``n**n``
    resamples is enumerated (exact, no randomness); above, ``resamples`` seeded draws. The interval
    lies within ``[min(values), max(values)]``, so it never leaves a metric's range.

    Example:
        >>> [round(v, 4) for v in bootstrap_interval([0.0, 1.0])]  # resample means 0, .5, .5, 1
        [0.0375, 0.9625]
        >>> [round(v, 3) for v in bootstrap_interval([0.5, 0.7, 0.6])]
        [0.522, 0.678]
    """
    xs = np.asarray(values, dtype=float)
    n = len(xs)
    if n < 2:
        return float("nan"), float("nan")
    if n <= _EXACT_UP_TO:
        index = np.array(list(itertools.product(range(n), repeat=n)))
    else:
        index = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    means = xs[index].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def describe(values: Sequence[float], confidence: float = 0.95) -> dict:
    """Mean, sample std, n and the percentile-bootstrap interval of the mean (NaN for n < 2);
    non-finite values are left out.

    Example:
        >>> d = describe([0.5, 0.7, 0.6])
        >>> round(d["mean"], 3), round(d["std"], 3), round(d["ci_low"], 3), round(d["ci_high"], 3)
        (0.6, 0.1, 0.522, 0.678)
    """
    xs = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(xs)
    mean = float(xs.mean()) if n else float("nan")
    std = float(xs.std(ddof=1)) if n > 1 else float("nan")
    low, high = bootstrap_interval(xs, confidence)
    return {"mean": mean, "std": std, "n": n, "ci_low": low, "ci_high": high}


def paired_test(values: Mapping[int, float], reference: Mapping[int, float]) -> dict:
    """Paired t-test over the seeds both have: ``{"t", "p", "n", "mean_diff"}``. No test (NaN
    ``t`` and ``p``, ``reason`` set) with fewer than :data:`MIN_SEEDS_FOR_TESTS` paired seeds;
    p = 1 when every difference is 0."""
    from scipy import stats

    seeds = sorted(s for s in values if s in reference and math.isfinite(values[s]) and math.isfinite(reference[s]))
    diffs = np.array([values[s] - reference[s] for s in seeds])
    out = {"n": len(seeds), "mean_diff": float(diffs.mean()) if len(seeds) else float("nan"),
           "t": float("nan"), "p": float("nan")}
    if len(seeds) < MIN_SEEDS_FOR_TESTS:
        return {**out, "reason": f"{len(seeds)} paired seed{'s' if len(seeds) != 1 else ''} "
                                 f"(a test needs >= {MIN_SEEDS_FOR_TESTS})"}
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


def _matrix_summary(matrices: list[np.ndarray]) -> dict | None:
    """Mean and std over seeds of each cell of equally shaped matrices."""
    matrices = [m for m in matrices if m.size]
    if not matrices or len({m.shape for m in matrices}) != 1:
        return None
    stack = np.stack(matrices)
    std = stack.std(axis=0, ddof=1) if len(matrices) > 1 else np.full(stack.shape[1:], np.nan)
    return {"mean": stack.mean(axis=0).tolist(), "std": std.tolist(), "n": len(matrices)}


def summarize_study(rows: Sequence[RunRow | Mapping], reference: str, strategies: Sequence[str]) -> list[dict]:
    """Per (scenario, strategy): ``{metric: describe(...)}`` over the seeds that finished, the mean
    ± std accuracy matrices (``matrix``, ``til_matrix``) and forgetting per experience, the seeds
    that failed (``failed``: ``[{seed, status, error}]``; every seed failed: ``all_failed``) and,
    for every strategy but ``reference``, the paired test of each score against it with Holm's
    correction across the scenario's comparisons of that score. Order: scenarios as they
    appear, strategies as given."""
    rows = [RunRow.of(r) for r in rows]
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    summary = []
    for scenario in scenarios:
        part = [r for r in rows if r.scenario == scenario]
        by_strategy = {name: {r.seed: r for r in part if r.strategy == name and r.ok} for name in strategies}
        entries = []
        for name in strategies:
            runs = by_strategy[name]
            failed = [{"seed": r.seed, "status": r.status or "error", "error": r.error or ""}
                      for r in part if r.strategy == name and not r.ok]
            if not runs and not failed:
                continue
            setting = next(iter(runs.values()), None) or next(r for r in part if r.strategy == name)
            entry = {"scenario": scenario, "strategy": name, "setting": setting.setting, "seeds": sorted(runs),
                     "failed": sorted(failed, key=lambda f: f["seed"]), "all_failed": not runs, "tests": {}}
            for metric in METRICS:
                entry[metric] = describe([r.score(metric) for r in runs.values()])
            matrices = [np.asarray(r.accuracy_matrix or [], dtype=float) for r in runs.values()]
            entry["matrix"] = _matrix_summary(matrices)
            entry["til_matrix"] = _matrix_summary([np.asarray(r.til_matrix or [], dtype=float)
                                                   for r in runs.values()])
            per_exp = [forgetting_per_experience(m) for m in matrices if m.size]
            entry["forgetting_per_experience"] = describe_columns(per_exp)
            entries.append(entry)
        ref_runs = by_strategy.get(reference, {})
        for metric in TESTED:
            compared = [e for e in entries if e["strategy"] != reference and ref_runs and not e["all_failed"]]
            tests = [paired_test({s: by_strategy[e["strategy"]][s].score(metric) for s in e["seeds"]},
                                 {s: r.score(metric) for s, r in ref_runs.items()}) for e in compared]
            for entry, test, p_holm in zip(compared, tests, holm([t["p"] for t in tests])):
                entry["tests"][metric] = {**test, "p_holm": p_holm}
        summary += entries
    return summary


def summarize_diagnostics(metric_rows: Sequence[Mapping], scalars: Mapping[str, str],
                          strategies: Sequence[str]) -> list[dict]:
    """Per (scenario, strategy) that logged any of ``scalars`` (``{metric name: title}``):
    ``{title: describe(...)}`` over seeds of each run's mean of that metric's finite values (every
    experience it was measured at; keyed values are left out). ``metric_rows`` are tidy rows
    (``scenario``, ``strategy``, ``seed``, ``metric``, ``key``, ``value``). Order: scenarios as they
    appear, strategies as given, titles as in ``scalars``.

    Example:
        >>> rows = [{"scenario": "s", "strategy": "A", "seed": seed, "metric": "K", "key": "", "value": v}
        ...         for seed, v in [(0, 2.0), (0, 4.0), (1, 5.0)]]
        >>> entry = summarize_diagnostics(rows, {"K": "κ"}, ["A"])[0]
        >>> entry["strategy"], entry["κ"]["mean"], entry["κ"]["n"]
        ('A', 4.0, 2)
    """
    values: dict = {}
    for row in metric_rows:
        if row["metric"] in scalars and not row.get("key"):
            value = float(row["value"]) if row["value"] not in ("", None) else math.nan
            if math.isfinite(value):
                cell = values.setdefault((row["scenario"], row["strategy"]), {})
                cell.setdefault(scalars[row["metric"]], {}).setdefault(str(row["seed"]), []).append(value)
    out = []
    for scenario in dict.fromkeys(row["scenario"] for row in metric_rows):
        for strategy in strategies:
            cell = values.get((scenario, strategy))
            if cell:
                out.append({"scenario": scenario, "strategy": strategy,
                            **{title: describe([float(np.mean(v)) for v in cell[title].values()])
                               for title in scalars.values() if title in cell}})
    return out


def describe_columns(rows: Sequence[Sequence[float]]) -> list[dict]:
    """:func:`describe` of each column of equally long rows (``[]`` when there are none)."""
    if not rows or len({len(r) for r in rows}) != 1:
        return []
    return [describe([r[j] for r in rows]) for j in range(len(rows[0]))]
