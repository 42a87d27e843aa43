"""The printed tables and the plot of a run; :func:`report` re-prints a saved run (``--report``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks._results import rounded_floats, saved_figure
from benchmarks.plasticity_ranking import ranking
from benchmarks.plasticity_ranking.settings import (
    BASELINES,
    INGREDIENTS,
    METRIC_LABELS,
    STRATA,
    VARIANTS,
    setting_from_dict,
)

#: the rows of the OR-against-everything table, in order
COMPARED = ("or", *INGREDIENTS, *BASELINES, *VARIANTS)

POOLED_COLUMNS = ("adam_fresh_k1", "adam_fresh_k10", "adam_fresh_k100", "sgd_k1", "sgd_k10", "sgd_k100")


def analysis(rows: list[dict], runs: list[dict], settings: dict) -> dict:
    """Everything the tables show, from the PRA rows, the runs' per-checkpoint records
    (``{"setting", "seed", "checkpoints"}``) and the settings by name."""
    tables, values = {}, {}
    for stratum in STRATA:
        tables[stratum], values[stratum] = ranking.pra_table(rows, stratum)
    ablation_metrics = list(dict.fromkeys(f"or_val{f:g}" for s in settings.values() for f in s.ablation_fractions))
    ablation_table, ablation_values = ranking.pra_table([r for r in rows if r["metric"] in ablation_metrics], "all",
                                                metrics=ablation_metrics)
    regimes: dict = {}
    for r in runs:
        reg = regimes.setdefault(r["setting"], {"dead": 0, "live": 0})
        for c in r["checkpoints"]:
            reg["dead" if c["dead"] else "live"] += 1
    sizes = {s.name: {f"{f:g}": max(2, int(round(f * s.n_val))) for f in s.ablation_fractions}
             for s in settings.values()}
    return {"tables": tables, "values": values, "ablation_table": ablation_table, "ablation_values": ablation_values,
            "ablation_sizes": sizes, "cost_ratios": ranking.cost_ratios(runs, settings),
            "headline": ranking.headlines(values, settings), "regimes": regimes,
            "pooled": ranking.pooled_analysis(runs), "against_or": _against_or(rows, values["all"], settings)}


def _against_or(rows, values: dict, settings: dict) -> dict:
    """Per benchmark and ground truth: paired tests of every metric against OR and the verdict."""
    out: dict = {}
    for bench in values:
        s = next(x for x in settings.values() if x.benchmark == bench)
        for gain, _, _ in s.gain_optimizers:
            tests = ranking.paired_against_or(rows, bench, gain, metrics=COMPARED)
            verdicts = ranking.verdict(values, tests, bench, gain, s.ks)
            for k, v in verdicts.items():  # our variants against the best ingredient at this k
                if v["best_ingredient"] is not None:
                    by_k = ranking.paired_against_or(rows, bench, gain, metrics=VARIANTS, reference=v["best_ingredient"])
                    v["variants_vs_best_ingredient"] = by_k.get(k, {})
            out.setdefault(bench, {})[gain] = {
                "tests": {str(k): v for k, v in tests.items()},
                "verdict": {str(k): v for k, v in verdicts.items()}}
    return out


def against_or_table(a: dict, bench: str, gain: str) -> str:
    """OR, its ingredients, the plasticity diagnostics and our variants: PRA ± s.e. over runs and
    the paired difference to OR (p of the paired t-test), one column pair per k."""
    entry = a["against_or"][bench][gain]
    ks = sorted(int(k) for k in entry["tests"])
    cells_of = a["values"]["all"][bench]
    header = ["metric"] + [h for k in ks for h in (f"k={k} PRA ± s.e.", f"k={k} Δ vs OR (p)")]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in COMPARED:
        row = [METRIC_LABELS.get(m, m)]
        for k in ks:
            c = cells_of.get(f"{gain}/k{k}", {}).get(m)
            if c is None or c["mean"] is None:
                row += ["—", "—"]
                continue
            t = entry["tests"][str(k)].get(m)
            row += [f"{c['mean']:.3f} ± {c['se']:.3f}", "—" if t is None else f"{t['mean_diff']:+.3f} (p {t['p']:.3f})"]
        lines.append("| " + " | ".join(row) + " |")
    for k in ks:
        v = entry["verdict"].get(str(k))
        if v:
            lines.append(f"\nk={k}: OR {v['or']:.3f}; best ingredient {v['best_ingredient']} "
                         f"{v['best_ingredient_pra']:.3f}; best diagnostic {v['best_diagnostic']} "
                         f"{v['best_diagnostic_pra']:.3f}; OR above all: {v['beats_all']}; "
                         f"above OR with p < 0.05: {', '.join(v['significantly_beaten_by']) or 'none'}")
            ours = v.get("variants_vs_best_ingredient", {})
            if ours:
                lines.append(f"k={k}, ours − {v['best_ingredient']}: " + "; ".join(
                    f"{m} {t['mean_diff']:+.3f} (p {t['p']:.3f})" for m, t in ours.items()))
    return "\n".join(lines)


def format_report(a: dict) -> str:
    """The printed tables of :func:`analysis`."""
    lines = []
    for stratum in STRATA:
        lines += [f"\n### Pairwise ranking accuracy — {stratum} checkpoints (mean ± s.e. over runs (n runs))",
                  a["tables"][stratum]]
    lines += ["\n### Validation-size ablation: OR from 16 minibatches of size 1 on a fraction of the validation set",
              a["ablation_table"],
              "validation sizes: " + "; ".join(f"{k}: " + ", ".join(f"{f}→{n}" for f, n in v.items())
                                               for k, v in a["ablation_sizes"].items()),
              "\nregimes (checkpoints): " + ", ".join(f"{k} dead {v['dead']} / live {v['live']}"
                                                     for k, v in a["regimes"].items()),
              "\n### Cost (same run, median)"]
    for bench, c in a["cost_ratios"].items():
        parts = [f"{key.split('_')[0]}/OR {v:.1f}x" for key, v in c.items() if key.endswith("_over_or")]
        per_sample = (f", per-sample {1000 * c['or_per_sample_s']:.1f} ms (per-sample/sampled "
                      f"{c['per_sample_over_sampled']:.2f}x)" if "or_per_sample_s" in c else "")
        ours = "".join(f"; {key[:-len('_over_g100')]}/G^(100) {v:.3f}x" for key, v in c.items()
                       if key.endswith("_over_g100"))
        lines.append(f"{bench}: OR sampled {1000 * c['or_sampled_s']:.1f} ms{per_sample}; " + ", ".join(parts) + ours
                     + f" [ground truth {c['ground_truth']}, {c['n_runs']} runs]")
    lines.append("\n### Headline (OR sampled vs the best label-agnostic baseline)")
    for bench, h in a["headline"].items():
        strata = ", ".join(f"{k} {v:.3f}" for k, v in h["or_by_stratum"].items() if v is not None)
        lines.append(f"{bench} [{h['column']}]: OR {strata}; best baseline {h['best_baseline']} "
                     f"{h['best_baseline_pra']:.3f}; OR above every baseline: {h['or_above_every_baseline']}")
    for bench, by_gain in a.get("against_or", {}).items():
        for gain in by_gain:
            lines += [f"\n### {bench}, ground truth {gain}: OR against its ingredients, the plasticity diagnostics "
                      "and our variants (mean ± s.e. over runs; paired t-test against OR over runs)",
                      against_or_table(a, bench, gain)]
    lines.append("\n### Pooled analysis: PRA per run and pooled over the runs of a benchmark; noise ceiling")
    for bench, result in a["pooled"].items():
        columns = [c for c in POOLED_COLUMNS if c in result] or list(result)
        entry = next(iter(result.values()))
        lines += [f"\n{bench}: {entry['n_checkpoints']} checkpoints from {entry['n_runs']} runs",
                  ranking.pooled_table(a["pooled"], bench, columns)]
    return "\n".join(lines)


def report(saved: dict) -> str:
    """Every table of a saved run, recomputed from its checkpoints and settings (the PRA rows too),
    headed by its command."""
    settings = {s.name: s for s in map(setting_from_dict, saved["config"]["settings"])}
    rows = [row for run in saved["checkpoints"] for row in ranking.pra_rows(run, settings[run["setting"]])]
    head = f"command: `{saved['command']}`\n" if saved.get("command") else ""
    return head + format_report(analysis(rows, saved["checkpoints"], settings))


def keep(saved: dict, out_dir, name: str) -> list[str]:
    """The kept form of a run (docs/benchmarks.md, "Kept form"): ``NAME.json``, ``NAME_tables.md``
    and ``NAME_decline.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kept = rounded_floats({k: v for k, v in saved.items() if k not in ("runs", "summary")}, 10)
    (out / f"{name}.json").write_text(json.dumps(kept, separators=(",", ":")) + "\n")
    (out / f"{name}_tables.md").write_text(report(kept) + "\n")
    plot_decline(kept, out / f"{name}_decline.png")
    return [f"{name}.json", f"{name}_tables.md", f"{name}_decline.png"]


def plot_runs(runs: list[dict], settings: dict, path) -> None:
    """OR (sampled, log scale) and the true gain along each setting's first run; dead checkpoints marked."""
    firsts = {}
    for r in runs:
        firsts.setdefault(r["setting"], r)
    with saved_figure(path, 1, len(firsts), figsize=(4.2 * len(firsts), 3.4)) as (_, axes):
        for ax, (name, run) in zip(axes[0], firsts.items()):
            _plot_run(ax, run, settings[name])


def _plot_run(ax, run: dict, s) -> None:
    cks = run["checkpoints"]
    x = [c["tasks_trained"] for c in cks]
    ax.semilogy(x, [max(c["or"], 1e-12) for c in cks], "o-", color="tab:blue", label="OR")
    ax.set_xlabel("tasks trained")
    ax.set_ylabel("OR (sampled)", color="tab:blue")
    twin = ax.twinx()
    gname, k = s.gain_optimizers[0][0], max(s.ks)
    twin.plot(x, [max(c[f"gain_{gname}_k{k}"], -1.0) for c in cks], "s--", color="tab:red")
    twin.set_ylabel(f"G^({k}) {gname}", color="tab:red")
    for xi, c in zip(x, cks):
        if c["dead"]:
            ax.axvline(xi, color="grey", alpha=0.2, lw=4)
    ax.set_title(f"{s.name} seed {run['seed']} (grey: dead)", fontsize=9)


def plot_decline(saved: dict, path, metrics=("or", "loss", "grad_norm_sq", "lookahead_gd")) -> None:
    """Per benchmark, along the stream: current-task accuracy, G^(k) and ``metrics`` (each scaled to
    [0, 1]; docs/benchmarks.md, "Decline figure")."""
    settings = {s.name: s for s in map(setting_from_dict, saved["config"]["settings"])}
    benches = list(dict.fromkeys(settings[r["setting"]].benchmark for r in saved["checkpoints"]))
    with saved_figure(path, 1, len(benches), figsize=(5.2 * len(benches), 3.6)) as (_, axes):
        for ax, bench in zip(axes[0], benches):
            runs = [r for r in saved["checkpoints"] if settings[r["setting"]].benchmark == bench]
            _plot_decline(ax, bench, runs, settings[runs[0]["setting"]], metrics)


def _plot_decline(ax, bench: str, runs: list[dict], s, metrics) -> None:
    n = min(len(r["checkpoints"]) for r in runs)
    x = [c["tasks_trained"] for c in runs[0]["checkpoints"][:n]]

    def mean_of(values_per_run, n=n):
        return np.nanmean(np.array([v[:n] for v in values_per_run], float), axis=0)

    def scaled(v):
        lo, hi = np.nanmin(v), np.nanmax(v)
        return (v - lo) / (hi - lo) if hi > lo else v * 0

    acc = mean_of([[c.get("task_accuracy", np.nan) for c in r["checkpoints"]] for r in runs])
    if np.isfinite(acc).any():
        ax.plot(x, acc, "k-", lw=2, label="current-task accuracy")
    gname = s.gain_optimizers[0][0]
    for k, style in zip(s.ks, (":", "--", "-")):
        g = mean_of([[c[f"gain_{gname}_k{k}"] for c in r["checkpoints"]] for r in runs])
        ax.plot(x, scaled(g), "r" + style, label=f"G^({k}) {gname} (scaled)")
    for m in metrics:
        v = mean_of([ranking.metric_values(r["checkpoints"], m) for r in runs])
        if np.isfinite(v).any():
            ax.plot(x, scaled(v), marker=".", lw=1, label=f"{m} (scaled)")
    ax.set(xlabel="tasks trained", title=f"{bench}: mean over {len(runs)} runs", ylim=(-0.05, 1.05))
    ax.legend(fontsize=6)
