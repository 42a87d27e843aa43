"""The benchmarks' own results helpers (not in the wheel: a study has its own tables): results
files, mean ± std tables, rounding and figures (docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from avalanche_plugins.study.catalog.datasets import data_fingerprint
from avalanche_plugins.study.report import files as results

__all__ = ["format_table", "rounded_floats", "saved_figure", "summarize", "write_results"]


def write_results(out_dir, args=None, *, config: dict, rows: Sequence[dict], summary: Sequence[dict],
                  wall_seconds: float, extra: dict | None = None, command: str | None = None,
                  data: dict | None = None) -> Path:
    """Write ``results.json`` and ``results.csv`` into ``out_dir`` (:func:`results.write_results`);
    return the folder. ``command`` / ``data`` default to ``args.command`` and the fingerprint of the
    dataset at ``args.data_root`` (``args``: any object with those attributes, or None)."""
    return results.write_results(
        out_dir, config=config, rows=rows, summary=summary, wall_seconds=wall_seconds, extra=extra,
        command=command if command is not None else getattr(args, "command", None),
        data=data if data is not None else data_fingerprint(getattr(args, "data_root", None)))


def rounded_floats(value, digits: int = 6):
    """``value`` with every float (in nested dicts and lists) rounded to ``digits`` significant
    digits: the kept form of a results file, stable across machines and small in the repository."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: rounded_floats(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded_floats(v, digits) for v in value]
    return value


def summarize(rows: Sequence[dict], group_by: Sequence[str], values: Sequence[str]) -> list[dict]:
    """Mean, sample std and count of ``values`` over rows sharing ``group_by`` (order kept); a value
    no row of a group has (``None`` or missing, e.g. a ticket of the dense model) gets ``None``."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in group_by), []).append(row)
    out = []
    for key, members in groups.items():
        entry = dict(zip(group_by, key))
        for v in values:
            xs = np.array([m[v] for m in members if m.get(v) is not None], dtype=float)
            entry[f"{v}_mean"] = float(xs.mean()) if len(xs) else None
            entry[f"{v}_std"] = float(xs.std(ddof=1)) if len(xs) > 1 else 0.0 if len(xs) else None
        entry["n"] = len(members)
        out.append(entry)
    return out


def format_table(summary: Iterable[dict], keys: Sequence[str], values: Sequence[str], digits: int = 3) -> str:
    """Markdown table: ``keys`` verbatim, ``values`` as ``mean ± std`` ("–" where no row has the value;
    "nan" stays visible, e.g. a diverged run)."""
    header = [*keys, *values, "n"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summary:
        cells = [str(s[k]) for k in keys]
        cells += ["–" if s.get(f"{v}_mean") is None else f"{s[f'{v}_mean']:.{digits}f} ± {_num(s[f'{v}_std']):.{digits}f}"
                  for v in values]
        cells.append(str(s["n"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(value) -> float:
    return float("nan") if value is None else float(value)


@contextmanager
def saved_figure(path, nrows: int = 1, ncols: int = 1, *, figsize, dpi: int = 100):
    """``(fig, axes)``: a new matplotlib figure (no pyplot state) and its 2-D array of axes, laid out
    tight and saved to ``path`` at ``dpi`` when the block ends."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    yield fig, fig.subplots(nrows, ncols, squeeze=False)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
