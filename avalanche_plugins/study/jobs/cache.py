"""Resumable runs: :func:`run_jobs` keys each job (:func:`job_key`), appends every finished row to a
JSON-lines cache and, run again, reuses the rows whose code is unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from avalanche_plugins.study.jobs.code import (
    PACKAGE_ROOT,
    _code_unchanged,
    _refuse_other_code,
    _run_recording_code,
    _unpack,
    code_roots,
    code_version,
    source_version,
)
from avalanche_plugins.study.jobs.executors import LocalExecutor

__all__ = ["CODE_PER_JOB", "job_key", "jsonable", "run_jobs"]


def jsonable(obj):
    """``obj`` with dataclasses, tuples, NumPy and torch values turned into JSON types.

    Example:
        >>> jsonable({"a": (1, np.float32(0.5)), 2: torch.tensor([1.0])})
        {'a': [1, 0.5], '2': [1.0]}
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(jsonable(v) for v in obj)
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def job_key(job, version: str | None = None) -> str:
    """Hash of the job's type, its fields and ``version`` (None: :func:`source_version`, the whole
    checkout's source, as every key was before the cache recorded the code each job ran; :func:`run_jobs`
    keys on ``version="code-per-job"`` and checks the recorded code itself). Dataclass fields with
    ``metadata={"cache_key": False}`` (where a job runs, not what it computes) are left out.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class Job:
        ...     method: str
        ...     seed: int
        >>> job_key(Job("ewc", 0), "v1") == job_key(Job("ewc", 0), "v1")
        True
        >>> len({job_key(Job("ewc", 0), "v1"), job_key(Job("ewc", 1), "v1"), job_key(Job("ewc", 0), "v2")})
        3
    """
    fields = jsonable(job)
    if dataclasses.is_dataclass(job):  # fields marked metadata={"cache_key": False} stay out of the key
        for f in dataclasses.fields(job):
            if not f.metadata.get("cache_key", True):
                fields.pop(f.name, None)
    payload = {"type": type(job).__qualname__, "job": fields,
               "code": source_version() if version is None else version}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def run_jobs(fn: Callable, jobs: Iterable, *, cache: str | Path | None = None, workers: int = 1,
             threads: int = 1, warmup: Callable[[], None] | None = None, executor=None,
             desc: str = "jobs", progress: bool = True, retry: Callable[[dict], bool] | None = None) -> list:
    """``[fn(job) for job in jobs]`` through an executor, resumable.

    Finished rows are appended to ``cache`` (JSON lines ``{"key", "job", "row", "code",
    "code_version"}``: the job's :func:`job_key`, the code it ran, :func:`loaded_code` under
    ``fn``'s :func:`code_roots`, and the :func:`code_version` it ran under) and reused when the same
    jobs are run again while that code is unchanged (a line of the older format, without ``code``, while
    the whole package's source is: :func:`source_version`), except a cached
    row for which ``retry(row)`` is true (e.g. a run that failed for a reason outside the method:
    it runs again, and its new row is the one kept). ``executor`` defaults to
    ``LocalExecutor(workers, threads=threads, warmup=warmup)``. Returns the rows in the order of
    ``jobs`` (a job listed twice runs once).
    """
    jobs = list(jobs)
    version = code_version()  # the commit and whether it was dirty when the jobs started, not when results are written
    roots = code_roots(fn)
    keys = [job_key(job, CODE_PER_JOB) for job in jobs]
    done: dict = {}
    cache = Path(cache) if cache is not None else None
    if cache is not None and cache.exists():
        done = _read_cache(cache, jobs, keys, roots)
    if retry is not None:
        done = {key: row for key, row in done.items() if not retry(row)}
    todo, queued = [], set()
    for job, key in zip(jobs, keys):
        if key not in done and key not in queued:
            todo.append(job)
            queued.add(key)
    executor = executor or LocalExecutor(workers, threads=threads, warmup=warmup)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        text = cache.read_text() if cache.exists() else ""
        if text and not text.endswith("\n"):  # end the half-written line of a killed run
            with open(cache, "a") as f:
                f.write("\n")
    recording = functools.partial(_run_recording_code, fn)
    for job, ran in tqdm(executor.map_unordered(recording, todo), total=len(todo), desc=desc, disable=not progress):
        ran = _unpack(ran, roots)
        key = job_key(job, CODE_PER_JOB)
        row = json.loads(json.dumps(jsonable(_refuse_other_code(ran.row, ran.code, roots))))  # fresh and cached alike
        done[key] = row
        if cache is not None:
            line = {"key": key, "job": jsonable(job), "row": row, "code": ran.code, "code_version": version}
            with open(cache, "a") as f:
                f.write(json.dumps(line) + "\n")
    return [done[key] for key in keys]


CODE_PER_JOB = "code-per-job"  # job_key's version in caches that record each job's code


def _read_cache(cache: Path, jobs: list, keys: list[str], roots: Sequence[Path] = (PACKAGE_ROOT,)) -> dict:
    """``{key: row}`` of the cache's lines whose code (under ``roots``) is unchanged; a later line
    of a key (a retried job) wins. Lines without ``code`` (the older format) count under their old key, the
    job's fields with the whole package's source."""
    entries = []
    for line in cache.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:  # blank, or the half-written line of a killed run
            continue
    done: dict = {}
    old = [e for e in entries if "code" not in e]
    if old:
        by_old_key = {job_key(job): key for job, key in zip(jobs, keys)}
        for entry in old:
            if entry["key"] in by_old_key:
                done[by_old_key[entry["key"]]] = entry["row"]
    for entry in entries:
        if "code" in entry:
            if _code_unchanged(entry["code"], roots):
                done[entry["key"]] = entry["row"]
            else:
                done.pop(entry["key"], None)
    return done
