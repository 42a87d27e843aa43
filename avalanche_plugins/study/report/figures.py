"""The study's figures, from the run rows (accuracy matrices) and the tidy metric rows.

Per scenario, in ``OUT/figures/``: ``accuracy_matrix_*`` (mean ``R`` per strategy),
``accuracy_stream_*`` (mean accuracy on the experiences seen so far, after each one), and for
each attached diagnostic: ``readiness_*`` (OR of the checkpoint on each incoming experience),
``ads_*`` (predicted vs realised old-task logit shift), ``transport_*`` (transport-key recovery per
stage and key family), ``curvature_*`` (per-layer curvature profile after each experience) and
``structural_*`` (Grow / Prune compactness, cycle accuracy, newborn gradient ratio). Lines are
means over seeds; bands ± one std. Every figure of a scenario names the failed runs it leaves out:
the note travels with the figure's file (:class:`FigureFile`), into each plot as an argument.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avalanche_plugins.study.catalog.diagnostics import figure_keys
from avalanche_plugins.study.contracts.rows import RunRow

__all__ = ["PLOTS", "FigureFile", "make_figures"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _colors(strategies: Sequence[str]) -> dict:
    cmap = _plt().get_cmap("tab10")
    return {name: cmap(i % 10) for i, name in enumerate(strategies)}


def _integer_x(ax, axis: str = "x") -> None:
    from matplotlib.ticker import MaxNLocator

    getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True))


@dataclass(frozen=True)
class FigureFile:
    """Where one figure goes, and the note every figure of its scenario carries (``""``: none):
    the failed runs it leaves out."""

    path: Path
    note: str = ""


def _annotate_missing(fig, note: str) -> None:
    if note:
        fig.text(0.005, 0.002, note, fontsize=6, color="firebrick", ha="left", va="bottom")


def _save(fig, target: FigureFile) -> Path:
    fig.tight_layout()
    _annotate_missing(fig, target.note)
    fig.savefig(target.path, dpi=90)
    _plt().close(fig)
    return target.path


def make_figures(runs: Sequence[RunRow | Mapping], metrics: Sequence[Mapping], out_dir,
                 strategies: Sequence[str]) -> list[Path]:
    """Write every figure the data allows (test runs only; failed runs are left out, and every
    figure of the scenario names them); return their paths. ``runs``: the run rows (typed or their
    JSON form); ``metrics``: the tidy metric rows."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    colors = _colors(strategies)
    paths = []
    runs = [RunRow.of(r) for r in runs]
    for scenario in dict.fromkeys(r.scenario for r in runs):
        slug = _UNSAFE.sub("_", scenario)
        part = [r for r in runs if r.scenario == scenario and r.split == "test" and not r.error]
        missing = [f"{r.strategy} seed {r.seed}" for r in runs if r.scenario == scenario and r.split == "test" and r.error]
        note = f"missing (failed, not scored): {', '.join(missing)}" if missing else ""
        order = [s for s in strategies if any(r.strategy == s for r in part)]
        rows = [m for m in metrics if m["scenario"] == scenario and m["split"] == "test"]
        if not order:  # every run of the scenario failed: nothing to draw (the tables say so)
            continue
        paths.append(_accuracy_matrices(part, order, FigureFile(out / f"accuracy_matrix_{slug}.png", note), scenario))
        paths.append(_accuracy_stream(part, order, colors, FigureFile(out / f"accuracy_stream_{slug}.png", note),
                                      scenario))
        by_metric = defaultdict(list)
        for row in rows:
            by_metric[row["metric"]].append(row)
        for name in figure_keys():  # one figure per key of the diagnostics catalog, in its order
            path = PLOTS[name](by_metric, order, colors, FigureFile(out / f"{name}_{slug}.png", note), scenario)
            if path is not None:
                paths.append(path)
    return paths


def _mean_matrix(runs, strategy) -> np.ndarray:
    return np.nanmean([np.array(r.accuracy_matrix, dtype=float) for r in runs if r.strategy == strategy], axis=0)


def _accuracy_matrices(runs, order, target: FigureFile, scenario) -> Path:
    plt = _plt()
    cols = min(len(order), 5)
    nrows = math.ceil(len(order) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(2.6 * cols + 0.6, 2.5 * nrows + 0.4), squeeze=False)
    for ax in axes.flat[len(order):]:
        ax.axis("off")
    for ax, strategy in zip(axes.flat, order):
        acc = _mean_matrix(runs, strategy)
        image = ax.imshow(acc, vmin=0, vmax=1, cmap="viridis")
        if acc.shape[0] <= 10:
            for (i, j), v in np.ndenumerate(acc):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="w" if v < 0.6 else "k")
        ax.set(title=strategy, xlabel="evaluated experience")
        ax.title.set_fontsize(9)
        _integer_x(ax)
        _integer_x(ax, axis="y")
    for row in axes:
        row[0].set_ylabel("after training experience")
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="accuracy")
    fig.suptitle(f"{scenario}: accuracy matrix (mean over seeds)", fontsize=10)
    _annotate_missing(fig, target.note)
    fig.savefig(target.path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return target.path


def _accuracy_stream(runs, order, colors, target: FigureFile, scenario) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for strategy in order:
        curves = []
        for r in runs:
            if r.strategy == strategy:
                acc = np.array(r.accuracy_matrix, dtype=float)
                curves.append([np.mean(acc[i, :i + 1]) for i in range(acc.shape[0])])
        curves = np.array(curves)
        x = np.arange(curves.shape[1])
        mean = curves.mean(axis=0)
        ax.plot(x, mean, marker="o", ms=3, color=colors[strategy], label=strategy)
        if len(curves) > 1:
            std = curves.std(axis=0, ddof=1)
            ax.fill_between(x, mean - std, mean + std, color=colors[strategy], alpha=0.15)
    ax.set(xlabel="after training experience", ylabel="accuracy on experiences seen", ylim=(0, 1.02),
           title=f"{scenario}: accuracy across the stream")
    _integer_x(ax)
    ax.legend(fontsize=7)
    return _save(fig, target)


def _by_experience(rows, order, key_filter=None) -> dict:
    """``{strategy: {experience: [values over seeds]}}`` of finite values."""
    out = {s: defaultdict(list) for s in order}
    for row in rows:
        value = _num(row["value"])
        if row["strategy"] in out and math.isfinite(value) and row["experience"] not in ("", None):
            if key_filter is None or key_filter(row):
                out[row["strategy"]][int(row["experience"])].append(value)
    return out


def _line(ax, data: Mapping[int, list], color, label, style="-", marker="o"):
    xs = sorted(data)
    if not xs:
        return
    means = np.array([np.mean(data[x]) for x in xs])
    ax.plot(xs, means, style, marker=marker, ms=3, color=color, label=label)
    stds = np.array([np.std(data[x], ddof=1) if len(data[x]) > 1 else 0.0 for x in xs])
    if stds.any():
        ax.fill_between(xs, means - stds, means + stds, color=color, alpha=0.12)


def _readiness(by_metric, order, colors, target: FigureFile, scenario):
    rows = by_metric.get("OptimizationReadiness")
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for strategy, data in _by_experience(rows, order).items():
        _line(ax, data, colors[strategy], strategy)
    ax.set(xlabel="incoming experience", ylabel="OR of the checkpoint", title=f"{scenario}: optimization readiness")
    _integer_x(ax)
    ax.legend(fontsize=7)
    return _save(fig, target)


def _ads(by_metric, order, colors, target: FigureFile, scenario):
    predicted, realised = by_metric.get("ADS"), by_metric.get("ADSRealisedShift")
    if not predicted or not realised:
        return None
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.5))
    pred, real = _by_experience(predicted, order), _by_experience(realised, order)
    for strategy in order:
        _line(left, pred[strategy], colors[strategy], f"{strategy} predicted")
        _line(left, real[strategy], colors[strategy], f"{strategy} realised", style="--", marker="s")
    left.set(xlabel="incoming experience", ylabel="old-task logit shift", title="ADS predicted (—) vs realised (--)")
    _integer_x(left)
    left.legend(fontsize=6, ncol=2)
    pairs = defaultdict(dict)
    for row_set, slot in ((predicted, 0), (realised, 1)):
        for row in row_set:
            pairs[(row["strategy"], row["seed"], row["experience"])][slot] = _num(row["value"])
    for strategy in order:
        points = [(v[0], v[1]) for k, v in pairs.items() if k[0] == strategy and len(v) == 2]
        if points:
            xs, ys = zip(*points)
            right.scatter(xs, ys, s=12, color=colors[strategy], label=strategy)
    low, high = right.get_xlim()[0], max(right.get_xlim()[1], right.get_ylim()[1])
    right.plot([0, high], [0, high], color="grey", lw=0.6, ls=":")
    right.set(xlabel="predicted (ADS)", ylabel="realised shift", title="per run and experience (: y = x)",
              xlim=(min(0, low), high), ylim=(0, high))
    right.legend(fontsize=7)
    fig.suptitle(f"{scenario}: architecture-driven shift", fontsize=10)
    return _save(fig, target)


def _transport(by_metric, order, colors, target: FigureFile, scenario):
    rows = [r for r in by_metric.get("TransportKeyRecovery", []) if "control=" not in r["key"]]
    if not rows:
        return None
    parsed = defaultdict(lambda: defaultdict(list))  # (family) → (strategy, stage) → values
    stages: list[str] = []
    for row in rows:
        fields = dict(part.split("=", 1) for part in row["key"].split("/") if "=" in part)
        value = _num(row["value"])
        if "stage" in fields and "family" in fields and math.isfinite(value):
            parsed[fields["family"]][(row["strategy"], fields["stage"])].append(value)
            if fields["stage"] not in stages:
                stages.append(fields["stage"])
    if not parsed:
        return None
    plt = _plt()
    families = list(parsed)
    fig, axes = plt.subplots(1, len(families), figsize=(3.6 * len(families) + 0.6, 3.4), squeeze=False)
    for ax, family in zip(axes[0], families):
        for strategy in order:
            ys = [np.mean(parsed[family][(strategy, s)]) if parsed[family].get((strategy, s)) else np.nan for s in stages]
            ax.plot(range(len(stages)), ys, marker="o", ms=3, color=colors[strategy], label=strategy)
        ax.set_xticks(range(len(stages)))
        ax.set_xticklabels(stages, rotation=30, fontsize=7)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(title=f"key family: {family}", ylabel="recovery", xlabel="stage")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{scenario}: transport-key recovery of earlier experiences", fontsize=10)
    return _save(fig, target)


def _curvature(by_metric, order, colors, target: FigureFile, scenario):
    rows = [r for r in by_metric.get("LayerSensitivity", []) if r["key"]]
    if not rows:
        return None
    plt = _plt()
    present = [s for s in order if any(r["strategy"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(present), figsize=(3.2 * len(present) + 0.6, 3.3), squeeze=False, sharey=True)
    layers = list(dict.fromkeys(r["key"] for r in rows))
    for ax, strategy in zip(axes[0], present):
        values = defaultdict(lambda: defaultdict(list))
        for r in rows:
            if r["strategy"] == strategy and math.isfinite(_num(r["value"])):
                values[int(r["experience"])][r["key"]].append(_num(r["value"]))
        cmap = plt.get_cmap("viridis")
        experiences = sorted(values)
        for k, exp in enumerate(experiences):
            ys = [np.mean(values[exp][layer]) if values[exp].get(layer) else np.nan for layer in layers]
            ax.plot(range(len(layers)), ys, marker="o", ms=3, color=cmap(k / max(1, len(experiences) - 1)),
                    label=f"after exp {exp}")
        ax.set_xticks(range(len(layers)))
        ax.set_xticklabels(layers, rotation=45, ha="right", fontsize=6)
        ax.set(yscale="log", title=strategy, xlabel="layer")
    axes[0][0].set_ylabel("top curvature s_l")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle(f"{scenario}: layer curvature profile", fontsize=10)
    return _save(fig, target)


def _by_step(rows, strategy) -> tuple[np.ndarray, np.ndarray]:
    values = defaultdict(list)
    for r in rows:
        value = _num(r["value"])
        if r["strategy"] == strategy and math.isfinite(value):
            values[int(float(r["step"]))].append(value)
    xs = np.array(sorted(values))
    return xs, np.array([np.mean(values[x]) for x in xs])


def _structural(by_metric, order, colors, target: FigureFile, scenario):
    panels = [(name, label) for name, label in (("Compactness", "compactness (active units)"),
                                                ("CycleAccuracy", "cycle accuracy (seen experiences)"),
                                                ("NewbornGradientRatio", "newborn / incumbent gradient"))
              if by_metric.get(name)]
    if not any(name == "Compactness" for name, _ in panels) and not any(name == "CycleAccuracy" for name, _ in panels):
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels) + 0.4, 3.3), squeeze=False)
    for ax, (name, label) in zip(axes[0], panels):
        for strategy in order:
            xs, ys = _by_step(by_metric[name], strategy)
            if len(xs):
                ax.plot(xs, ys, marker="o", ms=2, color=colors[strategy], label=strategy)
        ax.set(xlabel="training iteration", ylabel=label)
    max(axes[0], key=lambda ax: len(ax.get_lines())).legend(fontsize=7)
    fig.suptitle(f"{scenario}: structural plasticity", fontsize=10)
    return _save(fig, target)


PLOTS = {"readiness": _readiness, "ads": _ads, "transport": _transport, "curvature": _curvature,
         "structural": _structural}  # figure key (the diagnostics catalog's) -> plot(by_metric, order, colors, target, scenario)
