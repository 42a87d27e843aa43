"""Tables, log-log slopes and the plot of :mod:`benchmarks.scale`, all made from a saved
``results.json`` (so ``--report`` re-prints exactly what a run printed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from benchmarks._results import saved_figure
from benchmarks.scale.measure import INFO

__all__ = ["FAMILIES", "MEMORY_TARGET_GB", "aggregate", "loglog_slope", "slopes", "report", "plot",
           "main_table", "targets_table", "format_seconds"]

FAMILIES = ("mlp", "resnet", "vit")
MEMORY_TARGET_GB = 4.0
NO_TARGET = (None, None, "")


def _target(estimator: str) -> tuple[str | None, float | None, str]:
    """``(the row field compared, its bound, how the bound reads)``: issue 15's target of
    ``estimator`` (estimators.yaml; none for the Fisher diagonals and per-sample readiness, nor for a
    saved run's measurement that estimators.yaml no longer has)."""
    return tuple(INFO.get(estimator, {}).get("target", NO_TARGET))


def _memory_target(estimator: str) -> bool:
    """Whether the 4 GB bound applies (not where measured at capped settings or as a reference)."""
    return INFO.get(estimator, {}).get("memory_target", True)


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Slope of ``log y`` against ``log x`` by least squares (``numpy.polyfit``); NaN with fewer
    than two distinct positive points.

    Example:
        >>> round(loglog_slope([1e3, 1e4, 1e5], [2e-6, 2e-4, 2e-2]), 6)
        2.0
    """
    pts = [(float(a), float(b)) for a, b in zip(x, y)
           if a is not None and b is not None and a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)]
    if len({a for a, _ in pts}) < 2:
        return float("nan")
    lx, ly = np.log(np.array(pts)).T
    return float(np.polyfit(lx, ly, 1)[0])


def aggregate(rows: Sequence[dict]) -> list[dict]:
    """One entry per (model, estimator), in run order: means over ok seeds of the times and ratios,
    the largest peak RSS; the first failure's status and message when no seed succeeded."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["estimator"]), []).append(r)
    out = []
    for members in groups.values():
        ok = [m for m in members if m.get("status") == "ok"]
        base = dict((ok or members)[0])
        for key in ("time_s", "ratio", "over_dense", "lae_over_ewc", "epoch5000_s", "ref_s_per_image",
                    "penalty_ms_lae", "penalty_ms_ewc"):
            values = [m[key] for m in ok if m.get(key) is not None]
            if values:
                base[key] = float(np.mean(values))
        peaks = [m["peak_rss_gb"] for m in (ok or members) if m.get("peak_rss_gb") is not None]
        base["peak_rss_gb"] = max(peaks) if peaks else None
        base["n"] = len(ok)
        out.append(base)
    return out


def slopes(rows: Sequence[dict]) -> list[dict]:
    """Per estimator: log-log slopes of time and of peak RSS against parameter count, per model
    family (ok measurements only; across families the architecture, not the size, would dominate)."""
    cells = [c for c in aggregate(rows) if c.get("status") == "ok" and c.get("params")]
    out = []
    for estimator in dict.fromkeys(c["estimator"] for c in cells):
        entry = {"estimator": estimator}
        for family in FAMILIES:
            sel = [c for c in cells if c["estimator"] == estimator and c["family"] == family]
            params = [c["params"] for c in sel]
            entry[f"time_slope_{family}"] = loglog_slope(params, [c["time_s"] for c in sel])
            entry[f"rss_slope_{family}"] = loglog_slope(params, [c["peak_rss_gb"] for c in sel])
            entry[f"n_{family}"] = len(sel)
        out.append(entry)
    return out


def format_seconds(t) -> str:
    """``0.0123`` → ``12.3 ms``, ``45.6`` → ``45.6 s``; None → ``—``."""
    if t is None or not math.isfinite(t):
        return "—"
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def _num(value, fmt: str = ".3g", suffix: str = "") -> str:
    return "—" if value is None or not math.isfinite(float(value)) else f"{float(value):{fmt}}{suffix}"


def _time_and_ratio(c: dict) -> str:
    """The time and ratio cells of a measurement (lower bounds where it timed out)."""
    if c.get("status") == "ok":
        return f"{format_seconds(c.get('time_s'))} | {_num(c.get('ratio'), '.3g', '×')}"
    if c.get("status") == "timeout" and c.get("timeout_s") is not None:
        bound = c["timeout_s"] and c.get("epoch5000_s")
        ratio = f"> {c['timeout_s'] / c['epoch5000_s']:.3g}×" if bound else "—"
        return f"> {c['timeout_s']:.0f} s | {ratio}"
    return "— | —"


def _status_cell(c: dict) -> str:
    status = c.get("status", "?")
    note = c.get("message") or c.get("note") or ""
    return f"{status}: {note}" if note and status != "ok" else (f"ok ({note})" if note else status)


MAIN_COLUMNS = ("model", "params", "estimator", "setting", "time", "× 5,000-image epoch", "peak RSS", "status")


def main_table(rows: Sequence[dict]) -> str:
    """Every measurement: time, ratio to the 5,000-image epoch of the same process, peak RSS."""
    lines = ["| " + " | ".join(MAIN_COLUMNS) + " |", "|" + "---|" * len(MAIN_COLUMNS)]
    for c in aggregate(rows):
        params = f"{c['params'] / 1e6:.3g} M" if c.get("params") else "—"
        lines.append(f"| {c['model']} | {params} | {c['estimator']} | {c.get('setting') or ''} | {_time_and_ratio(c)} | "
                     f"{_num(c.get('peak_rss_gb'), '.2f', ' GB')} | {_status_cell(c)} |")
    return "\n".join(lines)


def slopes_table(rows: Sequence[dict]) -> str:
    cols = [f"time {f}" for f in FAMILIES] + [f"peak RSS {f}" for f in FAMILIES]
    lines = ["| estimator | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for s in slopes(rows):
        cells = [_num(s[f"{kind}_slope_{f}"], ".2f") for kind in ("time", "rss") for f in FAMILIES]
        lines.append(f"| {s['estimator']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _met(c: dict) -> str:
    if c.get("status") != "ok":
        return f"no ({c.get('status')})" if c.get("status") in ("timeout", "out_of_memory", "killed") else "—"
    field, bound, _ = _target(c["estimator"])
    reasons, value = [], c.get(field) if field else None
    if bound is not None and value is not None and value > bound:
        reasons.append("time")
    memory = _memory_target(c["estimator"])
    if memory and c.get("peak_rss_gb") is not None and c["peak_rss_gb"] > MEMORY_TARGET_GB:
        reasons.append("memory")
    shown = f" ({value:.2f}×)" if field and field != "ratio" and value is not None else ""
    if bound is None and not memory:
        return "—" + shown
    return ("yes" if not reasons else "no: " + ", ".join(reasons)) + shown


def targets_table(rows: Sequence[dict], model: str = "resnet18") -> str:
    """Issue 15's table on ``model`` (the largest ResNet measured when it is absent)."""
    cells = [c for c in aggregate(rows) if c["model"] == model]
    note = ""
    if not cells:
        resnets = sorted({(c.get("params") or 0, c["model"]) for c in aggregate(rows) if c.get("family") == "resnet"})
        if not resnets:
            return f"(no {model} and no ResNet in this run: no targets table)"
        model = resnets[-1][1]
        cells = [c for c in aggregate(rows) if c["model"] == model]
        note = f" — {model} stands in: the targets are defined on ResNet-18, which this run did not measure"
    lines = [f"Issue 15's targets on {model}{note} (memory: ≤ {MEMORY_TARGET_GB:g} GB peak RSS at defaults)", "",
             "| what | setting | time | ratio to 5,000-image epoch | peak RSS | target | met? |", "|---|---|---|---|---|---|---|"]
    for c in cells:
        target = _target(c["estimator"])[2]
        if _memory_target(c["estimator"]):
            target = ", ".join(t for t in (target, f"≤ {MEMORY_TARGET_GB:g} GB") if t)
        lines.append(f"| {c.get('what') or c['estimator']} | {c.get('setting') or ''} | {_time_and_ratio(c)} | "
                     f"{_num(c.get('peak_rss_gb'), '.2f', ' GB')} | {target} | {_met(c)} |")
    return "\n".join(lines)


def epoch_check(rows: Sequence[dict]) -> str:
    checks = [c for c in aggregate(rows) if c["estimator"] == "epoch_5000" and c.get("status") == "ok"]
    if not checks:
        return ""
    return "\n".join(
        f"Extrapolation check on {c['model']}: one real {c['images']:,}-image epoch took {format_seconds(c['time_s'])}; "
        f"{c['images']:,} × the per-image reference gives {format_seconds(c['images'] * c['ref_s_per_image'])} "
        f"(real / extrapolated = {c['over_dense']:.2f})." for c in checks)


def report(saved: dict) -> str:
    rows = saved["runs"]
    cfg = saved.get("config", {})
    load = saved.get("load_average") or {}
    cpus = (saved.get("machine") or {}).get("cpus")
    busy = (f" Load average {_num(load.get('start'), '.1f')} at the start, {_num(load.get('end'), '.1f')} at the end "
            f"({cpus} CPUs): other processes slow every timing down." if load else "")
    cpu = sum(r.get("cpu_s") or r.get("wall_s") or 0.0 for r in rows)
    busy += f" The measurement processes used {cpu / 60:.1f} min of CPU (wall time of killed ones)." if cpu else ""
    parts = [f"Command: {saved.get('command')}",
             f"Wall time {saved.get('wall_seconds', float('nan')) / 60:.1f} min.{busy} {cfg.get('threads', 1)} torch thread(s) "
             "per measurement, one process per measurement. \"5,000-image epoch\" = 5,000 × the per-image time of "
             f"a reference SGD epoch (batch 64, {cfg.get('ref_images')} images) timed in the same process after the "
             "estimator. Peak RSS = ru_maxrss of that process, before the reference epoch; it includes the "
             f"interpreter with torch, torchvision and Avalanche imported (rss_base_gb, about "
             f"{_num(_median(rows, 'rss_base_gb'), '.2f')} GB here).",
             "Every measurement\n\n" + main_table(rows),
             "Log-log slopes against parameter count (time ∝ params^slope)\n\n" + slopes_table(rows),
             targets_table(rows), epoch_check(rows)]
    return "\n\n".join(part for part in parts if part)  # no epoch check: ""


def _median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.median(values)) if values else None


def plot(rows: Sequence[dict], path) -> None:
    """Log-log time and peak RSS against parameter count, one panel per model family, one line per
    estimator; a cross marks a measurement stopped at its timeout (a lower bound)."""
    import matplotlib

    cells = [c for c in aggregate(rows) if c.get("status") == "ok" and c.get("params")]
    timed_out = [c for c in aggregate(rows) if c.get("status") == "timeout" and c.get("params") and c.get("timeout_s")]
    present = {c["family"] for c in cells}  # FAMILIES' order, then any other (resnet-mnist)
    families = [f for f in dict.fromkeys([*FAMILIES, *sorted(present)]) if f in present] or list(FAMILIES)
    estimators = list(dict.fromkeys(c["estimator"] for c in cells))
    colors = matplotlib.colormaps["tab20"](np.linspace(0, 1, max(len(estimators), 1)))
    with saved_figure(path, 2, len(families), figsize=(5 * len(families), 8), dpi=90) as (_, axes):
        for col, family in enumerate(families):
            for color, estimator in zip(colors, estimators):
                sel = sorted((c["params"], c["time_s"], c["peak_rss_gb"]) for c in cells
                             if c["family"] == family and c["estimator"] == estimator)
                if not sel:
                    continue
                p, t, m = zip(*sel)
                axes[0][col].plot(p, t, marker="o", color=color, label=estimator)
                axes[1][col].plot(p, m, marker="o", color=color, label=estimator)
            for c in timed_out:  # a lower bound: the measurement was stopped at its timeout
                if c["family"] == family and c["estimator"] in estimators:
                    axes[0][col].plot([c["params"]], [c["timeout_s"]], marker="x", linestyle="none",
                                      color=colors[estimators.index(c["estimator"])])
            for row, label in enumerate(("time (s)", "peak RSS (GB)")):
                axes[row][col].set(xscale="log", yscale="log", xlabel="parameters", ylabel=label, title=family)
        axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
