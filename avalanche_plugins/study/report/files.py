"""Results files and the ``--report`` path, written once (a study's and every benchmark's).

Every run writes ``OUT/results.json`` (command with relative paths, code version, data checksum,
config, machine, per-run rows, summary, wall time, plus the benchmark's own entries),
``OUT/results.csv`` (one line per row, scalar columns) and ``OUT/report.md`` (the printed tables),
then prints those tables. The tables are always made from the saved ``results.json`` by the
benchmark's report function, so ``--report OUT/results.json`` re-prints exactly what the run
printed, and a changed report function re-analyses an old run without rerunning it.
"""

from __future__ import annotations

import csv
import gzip
import importlib.metadata
import json
import os
import platform
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from avalanche_plugins.study.catalog.datasets import data_fingerprint
from avalanche_plugins.study.jobs import code_version, jsonable, source_version

__all__ = [
    "command_line",
    "machine_info",
    "versions",
    "relative_paths",
    "write_results",
    "load_results",
    "print_report",
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


def write_results(out_dir, *, config: dict, rows: Sequence[dict], summary: Sequence[dict],
                  wall_seconds: float, extra: dict | None = None, command: str | None = None,
                  data: dict | None = None) -> Path:
    """Write ``results.json`` and ``results.csv`` into ``out_dir``; return the folder.

    ``command``: the command line that made the run; ``data``: what data it read (a study passes one
    entry per scenario; default: the fingerprint of the bundled digits, :func:`data_fingerprint` of
    no root). The versions of Python, torch, avalanche-lib and this package are recorded with the
    code version. (A benchmark's own wrapper, ``benchmarks/_results.py``, fills ``command`` and
    ``data`` from its parsed command line.)
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": command,
        "code_version": code_version(),
        "source_version": source_version(),  # the exact code (the cache key's code part), dirty or not
        "versions": versions(),
        "data": data if data is not None else data_fingerprint(None),
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
    """A saved ``results.json``: a file, its gzip-compressed form ``results.json.gz`` (how large
    kept runs live under docs/results; a named ``results.json`` that is absent is read from its
    ``.gz`` beside it), or a folder holding either.

    Example:
        >>> import gzip, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     _ = (Path(folder) / "results.json.gz").write_bytes(gzip.compress(b'{"rows": []}'))
        ...     load_results(folder), load_results(Path(folder) / "results.json")
        ({'rows': []}, {'rows': []})
    """
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file() and path.suffix == ".json" and path.with_name(path.name + ".gz").is_file():
        path = path.with_name(path.name + ".gz")
    if not path.is_file():
        raise FileNotFoundError(f"--report: no results.json at {str(path)!r}")
    if path.suffix == ".gz":
        return json.loads(gzip.decompress(path.read_bytes()))
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


