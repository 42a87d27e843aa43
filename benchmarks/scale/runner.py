"""Run each measurement in a fresh process with a timeout and a memory cap.

:class:`ProcessExecutor` is an executor of :func:`avalanche_plugins.study.jobs.run_jobs`; a
forkserver child starts in ~0.1 s where a spawned interpreter spends 5–30 s importing torch. A
failed measurement becomes a row with its status (``timeout``, ``out_of_memory``, ``killed``,
``error``) and message, never an exception (docs/benchmarks.md, "benchmarks.scale").
"""

from __future__ import annotations

import multiprocessing
import os
import re
import resource
import time
import traceback
from collections.abc import Callable, Sequence

__all__ = ["START_METHODS", "ProcessExecutor", "failure_row", "child_rss_gb", "peak_rss_gb"]

START_METHODS = ("forkserver", "spawn", "fork")
_POLL_S = 0.05
_MEMORY_WORDS = ("can't allocate memory", "cannot allocate memory", "out of memory", "std::bad_alloc")


def child_rss_gb(pid: int | str) -> float | None:
    """Resident set size of process ``pid`` (or ``"self"``) from ``/proc`` (None: unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 / 1e9 for line in f if line.startswith("VmRSS:")), None)
    except (OSError, ValueError):
        return None


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: kB


def _limit_data(max_rss_gb: float) -> None:
    """Cap further private allocations at about ``max_rss_gb`` of resident memory: ``RLIMIT_DATA``
    counts reserved (virtual) data, so the limit is the current data size plus the RSS left."""
    try:
        status = open("/proc/self/status").read().split("\n")
        kb = {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith(("VmRSS", "VmData"))}
        limit = kb["VmData"] * 1024 + max(0, int(max_rss_gb * 1e9) - kb["VmRSS"] * 1024)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    except (OSError, ValueError, KeyError):
        pass  # not Linux: the parent's RSS poll still applies


def _child(fn, job, conn, threads: int, max_rss_gb: float | None) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if max_rss_gb is not None:
        _limit_data(max_rss_gb)
    try:
        row = fn(job, lambda info: conn.send(("info", info)))
        conn.send(("row", row))
    except BaseException as exc:  # every failure becomes a row
        text = f"{type(exc).__name__}: {exc}".strip()
        memory = isinstance(exc, MemoryError) or any(w in text.lower() for w in _MEMORY_WORDS)
        kind = "out_of_memory" if memory else "error"
        where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        at = f" (at {os.path.basename(where[0].filename)}:{where[0].lineno})" if where else ""
        peak = peak_rss_gb()
        asked = re.search(r"tried to allocate (\d+) bytes", text)
        if asked:  # torch's allocator message is long; the size is what matters
            cap = f" (cap {max_rss_gb:g} GB)" if max_rss_gb is not None else ""
            text = f"an allocation of {int(asked.group(1)) / 1e9:.2g} GB failed{cap}"
        try:
            conn.send(("failed", {"status": kind, "message": (text.splitlines() or [""])[0][:300] + at,
                                  "peak_rss_gb": peak}))
        except Exception:
            pass
    finally:
        conn.close()


def failure_row(job, status: str, message: str, info: dict | None = None, **extra) -> dict:
    """A row for a measurement that produced no result (``info``: what the child reported before
    it failed, e.g. the model's size)."""
    row = {"model": job.model, "estimator": job.estimator, "seed": job.seed, **(info or {})}
    row.update(status=status, message=message, time_s=None, ratio=None, **extra)
    return row


class ProcessExecutor:
    """Each job in its own process, at most ``workers`` at a time (see the module docstring).

    Args:
        timeout_of: seconds a job may run (called once per job, when it starts).
        max_rss_gb: memory cap per process (None: none).
        start_method: one of :data:`START_METHODS`.
        preload: modules the ``forkserver`` imports once.
        threads: torch threads of each child (also ``OMP_NUM_THREADS``).
    """

    def __init__(self, *, timeout_of: Callable[[object], float], workers: int = 1, max_rss_gb: float | None = 6.0,
                 start_method: str = "forkserver", preload: Sequence[str] = (), threads: int = 1):
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        if max_rss_gb is not None and not max_rss_gb > 0:
            raise ValueError(f"max_rss_gb must be > 0 or None, got {max_rss_gb!r}")
        self.timeout_of, self.workers, self.max_rss_gb = timeout_of, workers, max_rss_gb
        self.start_method, self.preload, self.threads = start_method, list(preload), threads

    def _context(self):
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ.setdefault(var, str(self.threads))  # the server and children start single-threaded
        ctx = multiprocessing.get_context(self.start_method)
        if self.start_method == "forkserver" and self.preload:
            ctx.set_forkserver_preload(self.preload)
        return ctx

    def map_unordered(self, fn: Callable, jobs: Sequence):
        jobs = list(jobs)
        if not jobs:
            return
        ctx = self._context()
        pending, running = list(jobs), []
        try:
            while pending or running:
                while pending and len(running) < self.workers:
                    running.append(self._start(ctx, fn, pending.pop(0)))
                still = []
                for slot in running:
                    row = self._poll(slot)
                    if row is None:
                        still.append(slot)
                    else:
                        yield slot["job"], row
                running = still
                if running:
                    time.sleep(_POLL_S)
        finally:
            for slot in running:  # interrupted: leave no orphan behind
                slot["proc"].kill()
                slot["proc"].join()

    def _start(self, ctx, fn, job) -> dict:
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(fn, job, child, self.threads, self.max_rss_gb), daemon=True)
        proc.start()
        child.close()
        return {"job": job, "proc": proc, "conn": parent, "start": time.perf_counter(),
                "timeout": float(self.timeout_of(job)), "info": {}, "peak_seen_gb": 0.0, "result": None}

    def _poll(self, slot) -> dict | None:
        """The finished row of ``slot``'s job, or None while it runs."""
        proc, conn, job = slot["proc"], slot["conn"], slot["job"]
        try:
            while conn.poll():
                kind, payload = conn.recv()
                if kind == "info":
                    slot["info"].update(payload)
                else:
                    slot["result"] = (kind, payload)
        except (EOFError, OSError):
            pass
        elapsed = time.perf_counter() - slot["start"]
        rss = child_rss_gb(proc.pid) if proc.is_alive() else None
        if rss is not None:
            slot["peak_seen_gb"] = max(slot["peak_seen_gb"], rss)
        seen = {"peak_rss_gb": round(slot["peak_seen_gb"], 3) if slot["peak_seen_gb"] else None}
        if slot["result"] is None and proc.is_alive():
            if elapsed > slot["timeout"]:
                return self._kill(slot, "timeout", f"> {slot['timeout']:.0f} s (timed out, killed)", seen, elapsed)
            if self.max_rss_gb is not None and rss is not None and rss > self.max_rss_gb:
                return self._kill(slot, "out_of_memory", f"> {self.max_rss_gb:g} GB RSS (killed)", seen, elapsed)
            return None
        proc.join()
        conn.close()
        if slot["result"] is not None:
            kind, payload = slot["result"]
            if kind == "row":
                payload["wall_s"] = elapsed
                return payload
            return failure_row(job, payload["status"], payload["message"], slot["info"], wall_s=elapsed,
                               peak_rss_gb=payload.get("peak_rss_gb"))
        code = proc.exitcode
        status = "killed" if code is not None and code < 0 else "error"
        message = (f"killed by signal {-code} (the kernel's OOM killer, most likely)" if status == "killed"
                   else f"exited with code {code} without a result")
        return failure_row(job, status, message, slot["info"], wall_s=elapsed, **seen)

    def _kill(self, slot, status, message, seen, elapsed) -> dict:
        slot["proc"].kill()
        slot["proc"].join()
        slot["conn"].close()
        row = failure_row(slot["job"], status, message, slot["info"], wall_s=elapsed, **seen)
        if status == "timeout":
            row["timeout_s"] = slot["timeout"]
        return row
