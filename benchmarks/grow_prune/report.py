"""What the benchmark prints and keeps: the paired analysis, the verdict tables of claims 1–4, the figures and the compact kept rows."""

from __future__ import annotations

import json
import re

import numpy as np

from benchmarks._results import format_table, rounded_floats, saved_figure


def plot_course(rows, path) -> None:
    """Newborn/incumbent gradient ratio against iterations since the last growth (mean over seeds)."""
    with saved_figure(path, figsize=(5.5, 3.6)) as (_, axes):
        ax = axes[0][0]
        keys = dict.fromkeys((r["setting"], r["method"], r["compactness"]) for r in rows if r.get("newborn_course"))
        for st, m, c in keys:
            curves = [r["newborn_course"][-1]["ratio"] for r in rows
                      if (r["setting"], r["method"], r["compactness"]) == (st, m, c) and r["newborn_course"]]
            n = min(len(x) for x in curves)
            if n:
                ax.plot(10 * np.arange(1, n + 1), np.mean([x[:n] for x in curves], axis=0),
                        label=f"{st} {m} c={c:.0%}")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set(xlabel="iterations since the last growth", ylabel="newborn / incumbent gradient norm", yscale="log")
        ax.legend(fontsize=6)


def plot_trajectories(rows, path) -> None:
    keys = list(dict.fromkeys((r["setting"], r["compactness"]) for r in rows if r["method"] != "dense"))
    with saved_figure(path, 1, max(1, len(keys)), figsize=(5 * max(1, len(keys)), 3.6)) as (_, axes):
        for ax, (setting, c) in zip(axes[0], keys):
            for method in dict.fromkeys(r["method"] for r in rows):
                runs = [r for r in rows if r["setting"] == setting and r["method"] == method
                        and (r["compactness"] == c or method == "dense")]
                if runs:
                    curve = np.mean([[a for _, a in r["trajectory"]] for r in runs], axis=0)
                    ax.plot(range(1, len(curve) + 1), curve, marker=".", label=method)
            ax.set(xlabel="cycle (epoch)", ylabel="cumulative test accuracy", title=f"{setting}, c={c:.0%}",
                   ylim=(0, 1))
            ax.legend(fontsize=6)


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and x == x]
    return float(np.mean(xs)) if xs else float("nan")


INTERVENTIONS = ("zero_out", "zero_state", "fresh_state", "reinit_in", "newborn_lr", "leaky")


def _targets(by: dict, st: str, method: str = "grow") -> list[float]:
    """The compactness targets ``method`` ran at on setting ``st`` (``by``: rows by their key)."""
    return sorted({k[2] for k in by if k[:2] == (st, method)})


def _seeds(by: dict, st: str, a: str, b: str, c: float) -> list[int]:
    """The seeds where methods ``a`` and ``b`` both ran on setting ``st`` at compactness ``c``."""
    return sorted(k[3] for k in by if k[:3] == (st, a, c) and (st, b, c, k[3]) in by)


def _paired_cells(by: dict, st: str, a: str, b: str, c: float, keys) -> list[str]:
    """:func:`_paired` of ``a`` against ``b`` per key over their shared seeds ("–" where a run lacks it)."""
    seeds, cells = _seeds(by, st, a, b, c), []
    for key in keys:
        x, y = [by[(st, a, c, n)].get(key) for n in seeds], [by[(st, b, c, n)].get(key) for n in seeds]
        cells.append("–" if None in x + y else _paired(x, y))
    return cells


def analysis(by: dict, settings: list[str]) -> str:
    """The docs' reading tables from the run rows by key (docs/benchmarks.md, "Report tables")."""
    out = ["Paired Grow − Prune (mean over seeds; seeds where Grow is higher)",
           "| setting | c | ΔACC | ΔTAA | Δticket ACC | Δticket TAA |", "|---|---|---|---|---|---|"]
    for s in settings:
        for c in _targets(by, s):
            seeds, cells = _seeds(by, s, "grow", "prune", c), []
            for key in ("acc", "taa", "ticket_acc", "ticket_taa"):
                d = [by[(s, "grow", c, x)][key] - by[(s, "prune", c, x)][key] for x in seeds
                     if by[(s, "grow", c, x)][key] is not None and by[(s, "prune", c, x)][key] is not None]
                cells.append(f"{np.mean(d):+.3f} ({sum(v > 0 for v in d)}/{len(d)})" if d else "–")
            out.append(f"| {s} | {c:.0%} | " + " | ".join(cells) + " |")
    out += ["", "Newborn gradient ratio: intervention − plain Grow (paired over compactness × seed); "
            "Grow's newborn/incumbent activation ratio",
            "| setting | grow grad ratio | grow act ratio | " + " | ".join(INTERVENTIONS) + " |",
            "|---|---|---|" + "---|" * len(INTERVENTIONS)]
    for s in settings:
        base = {k[2:]: r["newborn_grad_ratio"] for k, r in by.items() if k[:2] == (s, "grow")}
        act = _mean([e["newborn_act"] / e["incumbent_act"] for k, r in by.items() if k[:2] == (s, "grow")
                     for e in r.get("newborn_log") or [] if e["incumbent_act"] > 0])
        cells = [f"{_mean(base.values()):.2f}", f"{act:.2f}"]
        for iv in INTERVENTIONS:
            other = {k[2:]: r["newborn_grad_ratio"] for k, r in by.items() if k[:2] == (s, f"grow+{iv}")}
            d = [other[k] - base[k] for k in sorted(set(base) & set(other))]
            cells.append(f"{np.mean(d):+.2f} ({sum(v > 0 for v in d)}/{len(d)} up)" if d else "–")
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _paired(a, b) -> str:
    """``mean(a − b) (d_z; seeds a > b; paired t-test p)`` over per-seed values, or "identical".

    Example:
        >>> _paired([0.5, 0.6], [0.5, 0.6])
        'identical (2/2 seeds)'
    """
    from scipy import stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if len(a) < 2:
        return "–"
    d = a - b
    if not d.any():
        return f"identical ({len(d)}/{len(d)} seeds)"
    sd = d.std(ddof=1)
    p = stats.ttest_rel(a, b).pvalue if sd > 0 else float("nan")
    dz = d.mean() / sd if sd > 0 else float("nan")
    return f"{d.mean():+.3f} (d_z {dz:+.1f}; {int((d > 0).sum())}/{len(d)} up; p {p:.3f})"


def claim1_table(by: dict, settings: list[str]) -> list[str]:
    """Claim 1: plain Grow's newborn units per setting and compactness (docs, "Report tables")."""
    from scipy import stats

    out = ["Claim 1: newborn units (plain Grow; per seed the mean over growth cycles)",
           "| setting | c | grad ratio | log-ratio t-test p (ratio < 1) | act ratio | after the last growth: ratio first → last "
           "50 iterations; iterations to parity |",
           "|---|---|---|---|---|---|"]
    for st in settings:
        for c in _targets(by, st):
            rs = [by[k] for k in sorted(by) if k[:3] == (st, "grow", c)]
            g = np.array([np.mean([e["grad_ratio"] for e in r["newborn_log"]]) for r in rs])
            a = np.array([np.mean([e["newborn_act"] / e["incumbent_act"] for e in r["newborn_log"]
                                   if e["incumbent_act"] > 0]) for r in rs])
            p = stats.ttest_1samp(np.log(g), 0.0, alternative="less").pvalue if len(g) > 1 else float("nan")
            last = [(r.get("steps_to_parity") or [None])[-1] for r in rs]
            observed = [(r.get("steps_observed") or [0])[-1] for r in rs]
            reached = [x for x in last if x is not None]
            course = [r["newborn_course"][-1]["ratio"] for r in rs if r.get("newborn_course")]
            start_end = [(np.mean(x[:5]), np.mean(x[-5:])) for x in course if len(x) >= 5]
            parity = ((f"ratio {np.mean([a for a, _ in start_end]):.2f} → {np.mean([b for _, b in start_end]):.2f}; "
                       if start_end else "") + f"{len(reached)}/{len(last)} seeds reach it"
                      + (f" (median {np.median(reached):.0f})" if reached else "")
                      + f"; {int(np.median(observed))} observed")
            out.append(f"| {st} | {c:.0%} | {g.mean():.3f} ± {g.std(ddof=1) if len(g) > 1 else 0:.3f} | {p:.2g} | "
                       f"{a.mean():.2f} | {parity} |")
    return out


def _mlp_cnn_pairs(settings: list[str]) -> list[tuple[str, str]]:
    """``("mlp X", "cnn X")`` for every stream X run with both networks.

    >>> _mlp_cnn_pairs(["mlp iid mnist", "cnn iid mnist", "cnn split digits"])
    [('mlp iid mnist', 'cnn iid mnist')]
    """
    return [(f"mlp {st.removeprefix('cnn ')}", st) for st in settings
            if st.startswith("cnn ") and f"mlp {st.removeprefix('cnn ')}" in settings]


def claim2_tables(by: dict, settings: list[str]) -> list[str]:
    """Claim 2: Grow − Prune per setting and compactness; the CNN's gap minus the MLP's."""
    out = ["", "Claim 2: Grow − Prune, paired over seeds: mean (d_z; seeds where Grow is higher; paired t-test p)",
           "| setting | c | ACC | TAA | ticket ACC | ticket TAA | current-task acc |", "|---|---|---|---|---|---|---|"]
    for st in settings:
        for c in _targets(by, st):
            if _seeds(by, st, "grow", "prune", c):
                cells = _paired_cells(by, st, "grow", "prune", c, ("acc", "taa", "ticket_acc", "ticket_taa", "plasticity"))
                out.append(f"| {st} | {c:.0%} | " + " | ".join(cells) + " |")
    for pair in _mlp_cnn_pairs(settings):
        if not all((st, "grow") in {k[:2] for k in by} for st in pair):
            continue
        out += ["", f"Claim 2, MLP vs CNN ({pair[1].removeprefix('cnn ')}): (Grow − Prune on the CNN) − (Grow − Prune on "
                "the MLP), paired by seed", "| c | ACC | TAA | ticket ACC | ticket TAA |", "|---|---|---|---|---|"]
        for c in _targets(by, pair[1]):
            seeds = sorted(x for x in {k[3] for k in by}
                           if all((st, m, c, x) in by for st in pair for m in ("grow", "prune")))
            cells = []
            for key in ("acc", "taa", "ticket_acc", "ticket_taa"):
                if any(by[(st, m, c, x)].get(key) is None for st in pair for m in ("grow", "prune") for x in seeds):
                    cells.append("–")
                    continue
                d = [[by[(st, "grow", c, x)][key] - by[(st, "prune", c, x)][key] for x in seeds] for st in pair]
                cells.append(_paired(d[1], d[0]))
            out.append(f"| {c:.0%} | " + " | ".join(cells) + " |")
    return out


def claim3_table(by: dict, settings: list[str]) -> list[str]:
    """Each intervention − plain Grow on the grad ratio, ACC, TAA and the ticket's."""
    out = ["", "Claim 3: intervention − plain Grow, paired over seeds (same c)",
           "| setting | c | intervention | grad ratio | ACC | TAA | ticket ACC | ticket TAA |",
           "|---|---|---|---|---|---|---|---|"]
    for st in settings:
        for iv in INTERVENTIONS:
            for c in _targets(by, st, f"grow+{iv}"):
                cells = _paired_cells(by, st, f"grow+{iv}", "grow", c,
                                      ("newborn_grad_ratio", "acc", "taa", "ticket_acc", "ticket_taa"))
                out.append(f"| {st} | {c:.0%} | {iv} | " + " | ".join(cells) + " |")
    return out


def claim4_table(by: dict) -> list[str]:
    """Claim 4: Grow − each baseline per integration time E, and the trend (docs, "Claim 4")."""
    groups: dict = {}
    for (st, _, _, _) in by:
        m = re.match(r"(.*) E(\d+)$", st)
        if m:
            groups.setdefault(m.group(1), set()).add(int(m.group(2)))
    if not groups:
        return []
    out = ["", "Claim 4: Grow − baseline on the plasticity stream per integration time E (epochs per experience), "
           "paired over seeds", "| stream | E | baseline | ACC | TAA | current-task acc |", "|---|---|---|---|---|---|"]
    for base_name, es in groups.items():
        es = sorted(es)
        for base in ("prune", "prune+norewind", "dense"):
            diffs = {}
            for e in es:
                st = f"{base_name} E{e}"
                grow = {k[3]: by[k] for k in by if k[:2] == (st, "grow")}
                other = {k[3]: by[k] for k in by if k[:2] == (st, base)}
                seeds = sorted(set(grow) & set(other))
                if not seeds:
                    continue
                cells = []
                for key in ("acc", "taa", "plasticity"):
                    g, b = [grow[x][key] for x in seeds], [other[x][key] for x in seeds]
                    diffs.setdefault(key, {})[e] = dict(zip(seeds, np.subtract(g, b)))
                    cells.append(_paired(g, b))
                out.append(f"| {base_name} | {e} | {base} | " + " | ".join(cells) + " |")
            if len(diffs.get("acc", {})) >= 2:
                lo, hi = min(diffs["acc"]), max(diffs["acc"])
                cells = []
                for key in ("acc", "taa", "plasticity"):
                    seeds = sorted(set(diffs[key][lo]) & set(diffs[key][hi]))
                    cells.append(_paired([diffs[key][hi][x] for x in seeds], [diffs[key][lo][x] for x in seeds]))
                out.append(f"| {base_name} | E{hi} − E{lo} | {base} | " + " | ".join(cells) + " |")
    return out


def compact_row(row: dict) -> dict:
    """A row as a kept run stores it (``--merge``; docs/benchmarks.md, "Kept runs").

    Example:
        >>> compact_row({"edits": [{"cycle": 1, "units": {"fc": [3, 7]}}], "acc": 0.91234567891})
        {'edits': [{'cycle': 1}], 'acc': 0.912346}
    """
    out = dict(row)
    if row.get("edits"):
        out["edits"] = [{k: v for k, v in e.items() if k != "units"} for e in row["edits"]]
    return rounded_floats(out)


def share_run_configs(saved: dict) -> dict:
    """A kept run with every distinct per-run ``config`` stored once in ``saved["run_configs"]`` and
    each run's ``config`` its index there (docs/benchmarks.md, "Kept runs").

    Example:
        >>> share_run_configs({"runs": [{"acc": 1, "config": {"lr": 0.1}}, {"acc": 2, "config": {"lr": 0.1}}]})
        {'runs': [{'acc': 1, 'config': 0}, {'acc': 2, 'config': 0}], 'run_configs': [{'lr': 0.1}]}
    """
    configs = list(saved.get("run_configs", []))  # a file shared before keeps its indices
    index = {json.dumps(c, sort_keys=True): i for i, c in enumerate(configs)}
    runs = []
    for run in saved["runs"]:
        if isinstance(run.get("config"), dict):
            key = json.dumps(run["config"], sort_keys=True)
            if key not in index:
                index[key] = len(configs)
                configs.append(run["config"])
            run = {**run, "config": index[key]}
        runs.append(run)
    return {**saved, "runs": runs, "run_configs": configs}


VALUES = ("acc", "taa", "ticket_acc", "ticket_taa", "newborn_grad_ratio", "plasticity")


def report(saved: dict) -> str:
    """The summary table, the paired analysis, the tests behind the verdicts of issue 25
    (claims 1–4) and the masked/dense time per epoch of a saved run."""
    by = {(r["setting"], r["method"], r["compactness"], r["seed"]): r for r in saved["runs"]}
    settings = list(dict.fromkeys(r["setting"] for r in saved["runs"]))
    claims = (claim1_table(by, settings) + claim2_tables(by, settings) + claim3_table(by, settings)
              + claim4_table(by))
    lines = [format_table(saved["summary"], ["setting", "method", "compactness"], VALUES),
             analysis(by, settings), "", "\n".join(claims)]
    if saved.get("timing"):
        lines.append("masked/dense time per epoch: " + ", ".join(f"{t['setting']} {t['masked_over_dense']:.2f}"
                                                               for t in saved["timing"]))
    return "\n".join(lines)
