"""Re-analyse ``benchmarks.plasticity_ranking`` results without rerunning them.

Reads one or more ``results.json`` (their per-checkpoint records) and prints, per benchmark,
ground truth and k:

* **per-run PRA** (checkpoints of one learner and seed ranked among themselves, the benchmark's
  own table) next to **pooled PRA** (every checkpoint of the benchmark, all learners and seeds,
  ranked together, as a ranking across runs would);
* the **noise ceiling**: the PRA a perfect predictor can expect against the *measured* truth,
  ``mean over pairs Φ(|G_i − G_j| / √(se_i² + se_j²))`` from each checkpoint's standard error
  of G^(k). A metric cannot be expected to beat it; a gap to it is the metric's, not noise.

Usage::

    python -m benchmarks.plasticity_analysis docs/results/plasticity_ranking_scr/results.json
"""

from __future__ import annotations

import argparse
import json
import math
from itertools import combinations

import numpy as np

from avalanche_plugins.core.stats import pairwise_ranking_accuracy

METRICS = ("or", "or_per_sample", "strength", "reliability", "effective_rank", "energy_rank",
           "entk_energy_rank", "hessian_energy_rank", "active_units")


def noise_ceiling(gains, stderrs) -> float:
    """Expected PRA of the true gains against one noisy measurement of them (Gaussian errors).

    Example:
        >>> round(noise_ceiling([0.1, 0.2, 0.3], [0.0, 0.0, 0.0]), 3)
        1.0
        >>> round(noise_ceiling([0.1, 0.1 + 1e-9], [0.05, 0.05]), 2)
        0.5
    """
    g, s = np.asarray(gains, float), np.asarray(stderrs, float)
    probs = []
    for i, j in combinations(range(len(g)), 2):
        scale = math.hypot(s[i], s[j])
        diff = abs(g[i] - g[j])
        probs.append(1.0 if scale == 0 else 0.5 * (1 + math.erf(diff / scale / math.sqrt(2))))
    return float(np.mean(probs))


def _pra(metric, truth):
    metric, truth = np.asarray(metric, float), np.asarray(truth, float)
    keep = np.isfinite(metric) & np.isfinite(truth)
    if keep.sum() < 2 or np.unique(truth[keep]).size < 2:
        return None
    return pairwise_ranking_accuracy(metric[keep], truth[keep])


def analyse(paths) -> dict:
    """``{benchmark: {truth column: {"ceiling_per_run", "ceiling_pooled", metric: {"per_run", "pooled"}}}}``."""
    runs = []
    for path in paths:
        data = json.loads(open(path).read())
        runs += data["checkpoints"]
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
                per_run = [_pra([c[metric] for c in r["checkpoints"]], [c[f"gain_{key}"] for c in r["checkpoints"]])
                           for r in members]
                per_run = [p for p in per_run if p is not None]
                entry[metric] = {"per_run": float(np.mean(per_run)) if per_run else None,
                                 "pooled": _pra([c[metric] for c in pooled], truth)}
    return out


def table(result: dict, benchmark: str, columns) -> str:
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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plasticity_analysis", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results.json files of benchmarks.plasticity_ranking")
    parser.add_argument("--columns", default="adam_fresh_k1,adam_fresh_k10,adam_fresh_k100,sgd_k100",
                        help="ground-truth columns to print")
    parser.add_argument("--out", default=None, help="write the analysis as JSON here")
    args = parser.parse_args(argv)
    result = analyse(args.results)
    for benchmark in result:
        columns = [c for c in args.columns.split(",") if c in result[benchmark]]
        entry = next(iter(result[benchmark].values()))
        print(f"\n### {benchmark}: {entry['n_checkpoints']} checkpoints from {entry['n_runs']} runs")
        print(table(result, benchmark, columns))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
