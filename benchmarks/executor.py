"""Run a benchmark's independent jobs, locally or in a process pool, with a resumable cache.

Experiments only see :func:`run_jobs` (a function of one job, a list of jobs, a key per job), so a
distributed backend can replace :class:`LocalExecutor` without touching them: it only has to
yield ``(job, row)`` pairs as jobs finish.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks.harness import jsonable

__all__ = ["LocalExecutor", "run_jobs"]


class LocalExecutor:
    """``workers <= 1``: in this process; otherwise a ``spawn`` process pool. Every worker runs
    ``initializer(*initargs)`` first (set torch threads to 1 there: oversubscribed torch threads
    on a small machine make ``torch.func`` code tens of times slower)."""

    def __init__(self, workers: int = 1, initializer: Callable | None = None, initargs: tuple = ()):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.workers, self.initializer, self.initargs = workers, initializer, initargs

    def map_unordered(self, fn: Callable, jobs: Sequence) -> Iterator[tuple[object, object]]:
        if self.workers == 1:
            threads = torch.get_num_threads()
            if self.initializer is not None:
                self.initializer(*self.initargs)
            try:  # the jobs run with the initializer's settings; the caller gets its thread count back
                for job in jobs:
                    yield job, fn(job)
            finally:
                torch.set_num_threads(threads)
            return
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=self.initializer,
                                 initargs=self.initargs) as pool:
            futures = {pool.submit(fn, job): job for job in jobs}
            for future in as_completed(futures):
                yield futures[future], future.result()


def run_jobs(fn: Callable, jobs: Iterable, *, key: Callable[[object], str], executor: LocalExecutor,
             cache: Path | None = None, desc: str = "jobs", progress: bool = True) -> list:
    """``[fn(job) for job in jobs]`` (in completion order) through ``executor``.

    Finished rows are appended to ``cache`` (JSON lines keyed by ``key(job)``) and reused when the
    same jobs are run again, so an interrupted run resumes where it stopped.
    """
    jobs = list(jobs)
    done = {}
    if cache is not None and Path(cache).exists():
        for line in Path(cache).read_text().splitlines():
            entry = json.loads(line)
            done[entry["key"]] = entry["row"]
    rows = [done[key(j)] for j in jobs if key(j) in done]
    todo = [j for j in jobs if key(j) not in done]
    for job, row in tqdm(executor.map_unordered(fn, todo), total=len(todo), desc=desc, disable=not progress):
        rows.append(row)
        if cache is not None:
            Path(cache).parent.mkdir(parents=True, exist_ok=True)
            with open(cache, "a") as f:
                f.write(json.dumps({"key": key(job), "row": jsonable(row)}) + "\n")
    return rows
