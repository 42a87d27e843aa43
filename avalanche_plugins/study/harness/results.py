"""Results files, tables and the ``--report`` path, written once.

Every run writes ``OUT/results.json`` (command with relative paths, code version, data checksum,
config, machine, per-run rows, summary, wall time, plus the benchmark's own entries),
``OUT/results.csv`` (one line per row, scalar columns) and ``OUT/report.md`` (the printed tables),
then prints those tables. The tables are always made from the saved ``results.json`` by the
benchmark's report function, so ``--report OUT/results.json`` re-prints exactly what the run
printed, and a changed report function re-analyses an old run without rerunning it.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import platform
import shlex
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from avalanche_plugins.study.harness.data import data_fingerprint
from avalanche_plugins.study.harness.jobs import code_version, jsonable, source_version

__all__ = [
    "rounded_floats",
    "command_line",
    "machine_info",
    "versions",
    "relative_paths",
    "summarize",
    "format_table",
    "write_results",
    "load_results",
    "print_report",
    "plot_final_accuracy",
]


def _relative(text: str) -> str:
    return os.path.relpath(text) if os.path.isabs(text) else text


def relative_paths(obj):
    """``obj`` with every absolute path string made relative to the working directory.

    Example:
        >>> relative_paths({"out": os.path.join(os.getcwd(), "out", "x"), "n": [1, "a/b"]})
        {'out': 'out/x', 'n': [1, 'a/b']}
    """
    if isinstance(obj, dict):
        return {k: relative_paths(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [relative_paths(v) for v in obj]
    if isinstance(obj, str):
        return _relative(obj)
    return obj


def rounded_floats(value, digits: int = 6):
    """``value`` with every float (in nested dicts and lists) rounded to ``digits`` significant
    digits: the kept form of a results file, stable across machines and small in the repository.

    >>> rounded_floats({"a": [0.123456789, 2], "b": 1.0000001}, 3)
    {'a': [0.123, 2], 'b': 1.0}
    """
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: rounded_floats(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded_floats(v, digits) for v in value]
    return value


def command_line(prog: str, argv: Sequence[str]) -> str:
    """The command that produced a run, with relative paths (``--out=/abs`` forms included).

    Example:
        >>> command_line("python -m benchmarks.x", ["--out", os.path.join(os.getcwd(), "o"), "--skip", "a b"])
        "python -m benchmarks.x --out o --skip 'a b'"
    """
    parts = []
    for arg in argv:
        flag, sep, value = arg.partition("=")
        parts.append(f"{flag}={_relative(value)}" if sep and flag.startswith("--") else _relative(arg))
    return " ".join([prog, *(shlex.quote(a) for a in parts)])


def machine_info() -> dict:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


_DISTRIBUTIONS = ("torch", "avalanche-lib", "avalanche-plugins", "numpy", "scikit-learn", "torchvision")


def versions() -> dict:
    """``{name: version}`` of Python and the packages a run's numbers depend on (torch,
    avalanche-lib, this package, ...; ``None`` for one that is not installed)."""
    out = {"python": platform.python_version()}
    for name in _DISTRIBUTIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def summarize(rows: Sequence[dict], group_by: Sequence[str], values: Sequence[str]) -> list[dict]:
    """Mean, sample std and count of ``values`` over rows sharing ``group_by`` (order kept); a value
    no row of a group has (``None`` or missing, e.g. a ticket of the dense model) gets ``None``.

    Example:
        >>> rows = [{"m": "a", "acc": 0.5}, {"m": "a", "acc": 0.7}, {"m": "b", "acc": 0.9}]
        >>> [(s["m"], round(s["acc_mean"], 2), round(s["acc_std"], 3), s["n"]) for s in summarize(rows, ["m"], ["acc"])]
        [('a', 0.6, 0.141, 2), ('b', 0.9, 0.0, 1)]
    """
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
    "nan" stays visible, e.g. a diverged run).

    Example:
        >>> print(format_table([{"m": "a", "acc_mean": 0.5, "acc_std": 0.1, "ticket_mean": None, "n": 2}],
        ...                    ["m"], ["acc", "ticket"], 2))
        | m | acc | ticket | n |
        |---|---|---|---|
        | a | 0.50 ± 0.10 | – | 2 |
    """
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


def write_results(out_dir, args=None, *, config: dict, rows: Sequence[dict], summary: Sequence[dict],
                  wall_seconds: float, extra: dict | None = None, command: str | None = None,
                  data: dict | None = None) -> Path:
    """Write ``results.json`` and ``results.csv`` into ``out_dir``; return the folder.

    ``command``: the command line that made the run (default: ``args.command``); ``data``: what data
    it read (default: the fingerprint of the one dataset at ``args.data_root``, a benchmark's
    ``--data-root``; a study passes one entry per scenario). ``args`` is any object with those
    attributes (a benchmark's parsed command line), or ``None``. The versions of Python, torch,
    avalanche-lib and this package are recorded with the code version.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": command if command is not None else getattr(args, "command", None),
        "code_version": code_version(),
        "source_version": source_version(),  # the exact code (the cache key's code part), dirty or not
        "versions": versions(),
        "data": data if data is not None else data_fingerprint(getattr(args, "data_root", None)),
        "config": config,
        "machine": machine_info(),
        "wall_seconds": wall_seconds,
        "runs": list(rows),
        "summary": list(summary),
        **(extra or {}),
    }
    (out / "results.json").write_text(json.dumps(relative_paths(jsonable(payload)), indent=2))
    scalar_keys: list[str] = []
    for row in rows:
        for k, v in row.items():
            if k not in scalar_keys and isinstance(v, (int, float, str, bool, np.floating, np.integer)):
                scalar_keys.append(k)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=scalar_keys, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: jsonable(row.get(k)) for k in scalar_keys})
    return out


def load_results(path) -> dict:
    """A saved ``results.json`` (a file, or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"--report: no results.json at {str(path)!r}")
    return json.loads(path.read_text())


def print_report(results, report: Callable[[dict], str], *, out_dir=None, echo: bool = True) -> str:
    """``report(saved results)`` — from a path or an already loaded dict — printed and, with
    ``out_dir``, written to ``out_dir/report.md``. Returns the text."""
    saved = load_results(results) if isinstance(results, (str, Path)) else results
    text = report(saved)
    if out_dir is not None:
        Path(out_dir, "report.md").write_text(text + "\n")
    if echo:
        print(text, flush=True)
    return text


def plot_final_accuracy(rows, path, title: str, *, group: str = "strategy") -> None:
    """Final accuracy per experience (last row of each run's ``accuracy_matrix``), one line per
    ``group`` value and one panel per scenario (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(6 * len(scenarios), 4), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios):
        for name in dict.fromkeys(r[group] for r in rows):
            mats = [np.array(r["accuracy_matrix"]) for r in rows if r[group] == name and r["scenario"] == scenario]
            if mats:
                final = np.mean([m[-1] for m in mats], axis=0)
                ax.plot(range(len(final)), final, marker="o", label=name)
        ax.set(xlabel="experience", ylabel="final test accuracy", title=scenario, ylim=(0, 1))
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
