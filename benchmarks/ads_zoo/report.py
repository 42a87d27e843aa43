"""Tables and the scatter plot; :func:`report` re-analyses a saved run (``--report``)."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks._results import saved_figure
from benchmarks.ads_zoo.scoring import PREDICTORS, STATS, analyse
from benchmarks.ads_zoo.zoo import arch_from_dict


def plot(rows: list[dict], scenarios: list[str], path: Path) -> None:
    from matplotlib.ticker import NullFormatter

    present = [s for s in scenarios if any(r["scenario"] == s for r in rows)]
    with saved_figure(path, 2, len(present), figsize=(4.2 * len(present), 7.0), dpi=120) as (_, axes):
        for col, scenario in enumerate(present):
            part = [r for r in rows if r["scenario"] == scenario and r.get("realised_shift") is not None]
            for row, (key, label) in enumerate((("ads_logit", "ADS (logit path)"), ("ads_loss", "ADS (loss path)"))):
                ax = axes[row][col]
                for family, marker in (("mlp", "o"), ("vit", "^")):
                    pts = [(r[key], r["realised_shift"]) for r in part
                           if r["family"] == family and (r.get(key) or 0) > 0]
                    if pts:
                        xs, ys = zip(*pts)
                        ax.scatter(xs, ys, s=14, marker=marker, alpha=0.7, label=family.upper())
                ax.set(xscale="log", yscale="log")
                ax.xaxis.set_minor_formatter(NullFormatter())
                ax.yaxis.set_minor_formatter(NullFormatter())
                ax.set_xlabel(label, fontsize=8)
                ax.set_ylabel("realised old-task logit shift", fontsize=8)
                ax.set_title(scenario, fontsize=9)
                ax.legend(fontsize=7)


def format_results(per_scenario: dict) -> str:
    lines = ["| scenario | predictor | Spearman | Kendall | direction consistency | ECE Spearman | ΔECE Spearman "
             "| Spearman MLPs | Spearman ViTs |", "|---|---|---|---|---|---|---|---|---|"]
    for scenario, e in per_scenario.items():
        for p in PREDICTORS:
            if f"{p}_spearman_mean" not in e or not math.isfinite(e[f"{p}_spearman_mean"]):
                continue
            cells = [f"{e[f'{p}_{s}_mean']:.3f} ± {e[f'{p}_{s}_std']:.3f}" if math.isfinite(e[f"{p}_{s}_mean"])
                     else "—" for s in STATS]
            lines.append(f"| {scenario} | {p} | " + " | ".join(cells) + " |")
    lines += ["", "| scenario | architectures | one-edit pairs | ADS / ground-truth time (median, "
              "total) | same, process CPU time (total) | family-calibrated ADS (with its 2 "
              "reference runs) | probe ADS / ground truth |", "|---|---|---|---|---|---|---|"]
    for scenario, e in per_scenario.items():
        lines.append(f"| {scenario} | {e['n_archs']} | {e['n_pairs']} | {e['time_ratio_median']:.4f}, "
                     f"{e['time_ratio_total']:.4f} | {e.get('cpu_time_ratio_total', float('nan')):.4f} "
                     f"| {e.get('calibrated_time_ratio_total', float('nan')):.4f} | {e['probe_time_ratio_total']:.4f} |")
    lines += ["", "| scenario | family | ADS / ground-truth time (total; cheapest job) | old-task accuracy before "
              "| median realised shift | median shift / ADS (logit path) |", "|---|---|---|---|---|---|"]
    for scenario, e in per_scenario.items():
        for family in ("mlp", "vit"):
            if f"{family}_time_ratio_total" in e:
                lines.append(f"| {scenario} | {family} | {e[f'{family}_time_ratio_total']:.4f}; "
                             f"{e[f'{family}_time_ratio_min']:.4f} | "
                             f"{e[f'{family}_acc_old_before']:.3f} | {e[f'{family}_realised_shift_median']:.1f} | "
                             f"{e.get(f'{family}_shift_over_ads_logit_median', float('nan')):.3f} |")
    return "\n".join(lines)


def report(saved: dict) -> str:
    """The tables of a saved run, re-analysed from its rows (so a changed analysis applies to an
    old run without rerunning its jobs)."""
    config = saved["config"]
    archs = [arch_from_dict(a) for a in config["archs"]]
    return format_results(analyse(saved["runs"], archs, config["scenarios"], config["seeds"]))
