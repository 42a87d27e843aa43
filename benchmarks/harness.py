"""The contract every benchmark follows, written once.

``python -m benchmarks.NAME [--data-root PATH] [--quick] [--seeds N] [--out DIR]`` prints a results
table and writes ``DIR/results.json`` (command, config, machine, per-seed rows, summary with mean
and std, wall times), ``DIR/results.csv`` (one row per run) and at least one PNG plot.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import shlex
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "benchmark_parser",
    "command_line",
    "machine_info",
    "seed_everything",
    "summarize",
    "format_table",
    "write_results",
    "Timer",
    "jsonable",
]


def benchmark_parser(name: str, description: str) -> argparse.ArgumentParser:
    """Parser with the shared flags; benchmarks add their own options on top."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=description)
    parser.add_argument("--data-root", default=None,
                        help="folder holding MNIST/raw/*-ubyte (e.g. ../shared/data); digits when absent")
    parser.add_argument("--quick", action="store_true", help="small configuration, under 3 minutes")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (0, 1, ..., N-1)")
    parser.add_argument("--out", default=f"out/{name}", help="output folder for results.json/csv/png")
    return parser


def command_line() -> str:
    """The command that produced this run, for results.json and the docs."""
    return "python -m " + " ".join(shlex.quote(a) for a in [_module_name(), *sys.argv[1:]])


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem


def machine_info() -> dict:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - seeds third-party code that uses the legacy global RNG
    torch.manual_seed(seed)


class Timer:
    """``with Timer() as t: ...; t.seconds``"""

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._start


def summarize(rows: Sequence[dict], group_by: Sequence[str], values: Sequence[str]) -> list[dict]:
    """Mean, sample std and count of ``values`` over rows sharing ``group_by`` (order kept).

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
            entry[f"{v}_mean"] = float(xs.mean()) if len(xs) else float("nan")
            entry[f"{v}_std"] = float(xs.std(ddof=1)) if len(xs) > 1 else 0.0
        entry["n"] = len(members)
        out.append(entry)
    return out


def format_table(summary: Iterable[dict], keys: Sequence[str], values: Sequence[str], digits: int = 3) -> str:
    """Markdown table: ``keys`` verbatim, ``values`` as ``mean ± std``."""
    header = [*keys, *values, "n"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summary:
        cells = [str(s[k]) for k in keys]
        cells += [f"{s[f'{v}_mean']:.{digits}f} ± {s[f'{v}_std']:.{digits}f}" for v in values]
        cells.append(str(s["n"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_results(out_dir, *, config: dict, rows: Sequence[dict], summary: Sequence[dict],
                  wall_seconds: float, extra: dict | None = None) -> Path:
    """Write ``results.json`` and ``results.csv`` into ``out_dir``; return the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": command_line(),
        "config": config,
        "machine": machine_info(),
        "wall_seconds": wall_seconds,
        "runs": list(rows),
        "summary": list(summary),
        **(extra or {}),
    }
    (out / "results.json").write_text(json.dumps(jsonable(payload), indent=2))
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
