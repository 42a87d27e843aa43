"""The printed tables and the plot of a run; :func:`report` re-prints a saved run (``--report``)."""

from __future__ import annotations

from benchmarks.plasticity_ranking.ranking import (
    cost_ratios,
    headlines,
    pooled_analysis,
    pooled_table,
    pra_table,
)
from benchmarks.plasticity_ranking.settings import STRATA, setting_from_dict

POOLED_COLUMNS = ("adam_fresh_k1", "adam_fresh_k10", "adam_fresh_k100", "sgd_k100")


def analysis(rows: list[dict], runs: list[dict], settings: dict) -> dict:
    """Everything the tables show, from the PRA rows, the runs' per-checkpoint records
    (``{"setting", "seed", "checkpoints"}``) and the settings by name."""
    tables, values = {}, {}
    for stratum in STRATA:
        tables[stratum], values[stratum] = pra_table(rows, stratum)
    ablation_metrics = list(dict.fromkeys(f"or_val{f:g}" for s in settings.values() for f in s.ablation_fractions))
    ablation_table, ablation_values = pra_table([r for r in rows if r["metric"] in ablation_metrics], "all",
                                                metrics=ablation_metrics)
    regimes: dict = {}
    for r in runs:
        reg = regimes.setdefault(r["setting"], {"dead": 0, "live": 0})
        for c in r["checkpoints"]:
            reg["dead" if c["dead"] else "live"] += 1
    return {
        "tables": tables,
        "values": values,
        "ablation_table": ablation_table,
        "ablation_values": ablation_values,
        "ablation_sizes": {s.name: {f"{f:g}": max(2, int(round(f * s.n_val))) for f in s.ablation_fractions}
                           for s in settings.values()},
        "cost_ratios": cost_ratios(runs, settings),
        "headline": headlines(values, settings),
        "regimes": regimes,
        "pooled": pooled_analysis(runs),
    }


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
        lines.append(f"{bench}: OR sampled {1000 * c['or_sampled_s']:.1f} ms, per-sample {1000 * c['or_per_sample_s']:.1f} ms "
                     f"(per-sample/sampled {c['per_sample_over_sampled']:.2f}x); " + ", ".join(parts)
                     + f" [ground truth {c['ground_truth']}, {c['n_runs']} runs]")
    lines.append("\n### Headline (OR sampled vs the best label-agnostic baseline)")
    for bench, h in a["headline"].items():
        strata = ", ".join(f"{k} {v:.3f}" for k, v in h["or_by_stratum"].items() if v is not None)
        lines.append(f"{bench} [{h['column']}]: OR {strata}; best baseline {h['best_baseline']} "
                     f"{h['best_baseline_pra']:.3f}; OR above every baseline: {h['or_above_every_baseline']}")
    lines.append("\n### Pooled analysis: PRA per run and pooled over the runs of a benchmark; noise ceiling")
    for bench, result in a["pooled"].items():
        columns = [c for c in POOLED_COLUMNS if c in result] or list(result)
        entry = next(iter(result.values()))
        lines += [f"\n{bench}: {entry['n_checkpoints']} checkpoints from {entry['n_runs']} runs",
                  pooled_table(a["pooled"], bench, columns)]
    return "\n".join(lines)


def report(saved: dict) -> str:
    """Every table of a saved run, recomputed from its PRA rows, checkpoints and settings."""
    settings = {s.name: s for s in map(setting_from_dict, saved["config"]["settings"])}
    return format_report(analysis(saved["runs"], saved["checkpoints"], settings))


def plot_runs(runs: list[dict], settings: dict, path) -> None:
    """OR (sampled, log scale) and the true gain along each setting's first run; dead checkpoints marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    firsts = {}
    for r in runs:
        firsts.setdefault(r["setting"], r)
    fig, axes = plt.subplots(1, len(firsts), figsize=(4.2 * len(firsts), 3.4), squeeze=False)
    for ax, (name, run) in zip(axes[0], firsts.items()):
        s = settings[name]
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
        ax.set_title(f"{name} seed {run['seed']} (grey: dead)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
