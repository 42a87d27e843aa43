"""Pairwise ranking accuracy (PRA) of every metric against every ground truth, the headline,
the cost ratios, and the pooled analysis with the ground truth's noise ceiling."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np

from avalanche_plugins.core.stats import pairwise_ranking_accuracy
from benchmarks.plasticity_ranking.settings import (
    BASELINES,
    INGREDIENTS,
    METRIC_LABELS,
    METRICS,
    NEGATED,
    STRATA,
    VARIANTS,
    Setting,
    gain_keys,
)


def metric_values(checkpoints, metric: str) -> list[float]:
    """A metric's values over checkpoints, higher = more plastic, at 10 significant digits, NaN
    where missing (why: docs/benchmarks.md, "benchmarks.plasticity_ranking", PRA).

    Example:
        >>> metric_values([{"dormant_units": 0.25}, {"effective_rank": 1.0000000000000004}], "effective_rank")
        [nan, 1.0]
        >>> metric_values([{"dormant_units": 0.25}], "dormant_units")
        [-0.25]
    """
    sign = -1.0 if metric in NEGATED else 1.0
    return [sign * float(f"{float(c.get(metric, math.nan)):.10g}") for c in checkpoints]


def _pra(metric, truth):
    metric, truth = np.asarray(metric, float), np.asarray(truth, float)
    keep = np.isfinite(metric) & np.isfinite(truth)
    if keep.sum() < 2 or np.unique(truth[keep]).size < 2:
        return None
    return pairwise_ranking_accuracy(metric[keep], truth[keep])


def pra_rows(run: dict, setting: Setting) -> list[dict]:
    """One row per (stratum, ground truth, k, metric) with the run's PRA (None when undefined)."""
    cks = run["checkpoints"]
    rows = []
    dead = np.array([c["dead"] for c in cks], bool)
    masks = {"all": np.ones(len(cks), bool), "dead": dead, "live": ~dead}
    ablation = [f"or_val{f:g}" for f in setting.ablation_fractions]
    for stratum, mask in masks.items():
        sub = [c for c, m in zip(cks, mask) if m]
        for name, k in gain_keys(setting):
            truth = [c[f"gain_{name}_k{k}"] for c in sub]
            for metric in (*METRICS, *ablation):
                value = _pra(metric_values(sub, metric), truth) if len(sub) >= 2 else None
                rows.append({"benchmark": setting.benchmark, "setting": setting.name, "seed": run["seed"],
                             "stratum": stratum, "gain": name, "k": k, "metric": metric, "pra": value,
                             "n_checkpoints": len(sub)})
    return rows


def _mean_se(values):
    xs = np.array([v for v in values if v is not None], float)
    if xs.size == 0:
        return None, None, 0
    se = float(xs.std(ddof=1) / math.sqrt(xs.size)) if xs.size > 1 else 0.0
    return float(xs.mean()), se, int(xs.size)


def _label(metric: str) -> str:
    if metric.startswith("or_val"):
        return f"OR (16×1) on {100 * float(metric[6:]):g}% of val"
    return METRIC_LABELS.get(metric, metric)


def pra_table(rows, stratum: str, metrics=METRICS) -> tuple[str, dict]:
    """Markdown table (rows = metrics, columns = benchmark × ground truth × k) and its values."""
    cols = list(dict.fromkeys((r["benchmark"], r["gain"], r["k"]) for r in rows))
    values: dict = {}
    header = ["metric", *[f"{b} {g} k={k}" for b, g, k in cols]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for metric in metrics:
        cells = [_label(metric)]
        for b, g, k in cols:
            sel = [r["pra"] for r in rows if r["stratum"] == stratum and r["metric"] == metric
                   and r["benchmark"] == b and r["gain"] == g and r["k"] == k]
            mean, se, n = _mean_se(sel)
            if sel:  # metrics that a benchmark does not have (e.g. its ablation sizes) get no entry
                values.setdefault(b, {}).setdefault(f"{g}/k{k}", {})[metric] = {"mean": mean, "se": se, "n_runs": n}
            cells.append("—" if mean is None else f"{mean:.3f} ± {se:.3f} ({n})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), values


def headlines(values: dict, settings: dict) -> dict:
    """Per benchmark, at the first ground truth and the largest k: OR's PRA per stratum and the best
    label-agnostic baseline's (all checkpoints; the first ground truths: docs, "Headline")."""
    out = {}
    for bench, columns in values["all"].items():
        s = next(x for x in settings.values() if x.benchmark == bench)
        column = f"{s.gain_optimizers[0][0]}/k{max(s.ks)}"
        if column not in columns:
            continue
        cells = columns[column]
        base = {m: cells[m]["mean"] for m in BASELINES if cells.get(m, {}).get("mean") is not None}
        best = max(base, key=base.get) if base else None
        or_all = cells["or"]["mean"]
        by_stratum = {st: values[st].get(bench, {}).get(column, {}).get("or", {}).get("mean") for st in STRATA}
        out[bench] = {"column": column, "or_by_stratum": by_stratum, "best_baseline": best,
                      "best_baseline_pra": base.get(best, float("nan")),
                      "or_above_every_baseline": bool(or_all is not None and all(or_all > v for v in base.values()))}
    return out


def cost_ratios(runs: list[dict], settings: dict) -> dict:
    """Per benchmark: median over runs of (G^(k) time / sampled OR time) at the run's first
    checkpoint (where every cost_k is timed), and median per-sample / sampled OR time."""
    out: dict = {}

    def bench_of(run):
        return settings[run["setting"]].benchmark

    for bench in dict.fromkeys(bench_of(r) for r in runs):
        first = [r["checkpoints"][0]["timings"] for r in runs if bench_of(r) == bench and r["checkpoints"]]
        every = [c["timings"] for r in runs if bench_of(r) == bench for c in r["checkpoints"]]
        s = next(settings[r["setting"]] for r in runs if bench_of(r) == bench)
        name = s.gain_optimizers[0][0]
        entry = {"ground_truth": name, "n_runs": s.n_runs, "gain_batch": s.gain_batch,
                 "or_sampled_s": float(np.median([t["or_sampled_s"] for t in every]))}
        if all("or_per_sample_s" in t for t in every):
            entry["or_per_sample_s"] = float(np.median([t["or_per_sample_s"] for t in every]))
            entry["per_sample_over_sampled"] = float(np.median([t["or_per_sample_s"] / t["or_sampled_s"] for t in every]))
        g100 = f"gain_{name}_k100_s"
        for variant in VARIANTS:  # our variants' cost against G^(100) at the same checkpoint
            ratios = [t[f"{variant}_s"] / t[g100] for t in first if f"{variant}_s" in t and g100 in t]
            if ratios:
                entry[f"{variant}_over_g100"] = float(np.median(ratios))
        for k in sorted({*s.cost_k, *s.ks}):
            key = f"gain_{name}_k{k}_s"
            ratios = [t[key] / t["or_sampled_s"] for t in first if key in t]
            if ratios:
                entry[f"g{k}_over_or"] = float(np.median(ratios))
                entry[f"g{k}_s"] = float(np.median([t[key] for t in first if key in t]))
        out[bench] = entry
    return out


def noise_ceiling(gains, stderrs) -> float:
    """Expected PRA of the true gains against one noisy measurement of them (Gaussian errors; 1
    without noise, 0.5 for a near tie: docs/benchmarks.md, "Pooled analysis")."""
    g, s = np.asarray(gains, float), np.asarray(stderrs, float)
    probs = []
    for i, j in combinations(range(len(g)), 2):
        scale = math.hypot(s[i], s[j])
        diff = abs(g[i] - g[j])
        probs.append(1.0 if scale == 0 else 0.5 * (1 + math.erf(diff / scale / math.sqrt(2))))
    return float(np.mean(probs))


def pooled_analysis(runs: list[dict]) -> dict:
    """Per-run and pooled PRA and the noise ceiling from a run's per-checkpoint records (docs,
    "Pooled analysis"): ``{benchmark: {truth column: {"ceiling_per_run", "ceiling_pooled",
    metric: {"per_run", "pooled"}}}}``."""
    out: dict = {}
    for benchmark in sorted({r["setting"].split("/")[0] for r in runs}):
        members = [r for r in runs if r["setting"].split("/")[0] == benchmark]
        keys = sorted({k[len("gain_"):] for r in members for c in r["checkpoints"] for k in c
                       if k.startswith("gain_") and not k.endswith("_stderr")})
        for key in keys:
            entry = out.setdefault(benchmark, {}).setdefault(key, {})
            pooled = [c for r in members for c in r["checkpoints"]]
            truth = [c[f"gain_{key}"] for c in pooled]
            entry["ceiling_pooled"] = noise_ceiling(truth, [c[f"gain_{key}_stderr"] for c in pooled])
            entry["ceiling_per_run"] = float(np.mean([
                noise_ceiling([c[f"gain_{key}"] for c in r["checkpoints"]],
                              [c[f"gain_{key}_stderr"] for c in r["checkpoints"]]) for r in members]))
            entry["n_checkpoints"], entry["n_runs"] = len(pooled), len(members)
            for metric in METRICS:
                per_run = [_pra(metric_values(r["checkpoints"], metric), [c[f"gain_{key}"] for c in r["checkpoints"]])
                           for r in members]
                per_run = [p for p in per_run if p is not None]
                entry[metric] = {"per_run": float(np.mean(per_run)) if per_run else None,
                                 "pooled": _pra(metric_values(pooled, metric), truth)}
    return out


def pooled_table(result: dict, benchmark: str, columns) -> str:
    lines = ["| metric | " + " | ".join(f"{c} per run | {c} pooled" for c in columns) + " |",
             "|---|" + "---|---|" * len(columns)]

    def cell(v):
        return "—" if v is None else f"{v:.3f}"

    for metric in METRICS:
        cells = [cell(result[benchmark][c][metric][k]) for c in columns for k in ("per_run", "pooled")]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    cells = [cell(result[benchmark][c][k]) for c in columns for k in ("ceiling_per_run", "ceiling_pooled")]
    lines.append("| noise ceiling | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_against_or(rows, benchmark: str, gain: str, metrics=METRICS, stratum: str = "all",
                      reference: str = "or") -> dict:
    """Per k, every metric's PRA minus the ``reference``'s, paired over runs (:func:`paired_test`):
    ``{k: {metric: {"mean_diff", "t", "p", "n"}}}``."""
    from avalanche_plugins.study.report.stats import paired_test

    out: dict = {}
    sel = [r for r in rows if r["benchmark"] == benchmark and r["gain"] == gain and r["stratum"] == stratum]
    for k in sorted({r["k"] for r in sel}):
        by_metric: dict = {}
        for r in sel:
            if r["k"] == k and r["pra"] is not None:
                by_metric.setdefault(r["metric"], {})[(r["setting"], r["seed"])] = r["pra"]
        ref = by_metric.get(reference, {})
        keys = {key: i for i, key in enumerate(sorted(ref))}
        out[k] = {m: paired_test({keys[key]: v for key, v in by_metric.get(m, {}).items() if key in keys},
                                 {keys[key]: v for key, v in ref.items()})
                  for m in metrics if m != reference}
    return out


def verdict(values: dict, tests: dict, benchmark: str, gain: str, ks) -> dict:
    """Does OR rank better than every ingredient and diagnostic, per k? (docs, "Verdict"):
    ``{k: {"or", "best_ingredient", "best_diagnostic", "beats_all", "significantly_beaten_by"}}``"""
    out = {}
    for k in ks:
        cells = values.get(benchmark, {}).get(f"{gain}/k{k}", {})
        if "or" not in cells or cells["or"]["mean"] is None:
            continue

        or_mean = cells["or"]["mean"]
        means = {m: cells[m]["mean"] for m in (*INGREDIENTS, *BASELINES, *VARIANTS)
                 if cells.get(m, {}).get("mean") is not None}
        ing = max((m for m in INGREDIENTS if m in means), key=means.get, default=None)
        diag = max((m for m in BASELINES if m in means), key=means.get, default=None)
        beaten = [m for m, v in means.items()
                  if v > or_mean and tests.get(k, {}).get(m, {}).get("p", math.nan) < 0.05]
        out[k] = {"or": or_mean, "best_ingredient": ing, "best_ingredient_pra": means.get(ing),
                  "best_diagnostic": diag, "best_diagnostic_pra": means.get(diag),
                  "beats_all": all(or_mean > means[m] for m in (*INGREDIENTS, *BASELINES) if m in means),
                  "significantly_beaten_by": beaten}
    return out
