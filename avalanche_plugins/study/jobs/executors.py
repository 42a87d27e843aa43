"""Executors: where jobs run. Any backend yields ``(job, row)`` pairs from ``map_unordered(fn, jobs)``;
:class:`LocalExecutor` (this process or a process pool), :class:`RayExecutor` (a local or remote Ray
cluster), :func:`make_executor` makes either from plain keywords.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from avalanche_plugins.study.jobs.code import _Ran
from avalanche_plugins.study.jobs.environment import init_worker, seed_everything, torch_threads

__all__ = ["EXECUTORS", "LocalExecutor", "NoNodeCanRun", "RayExecutor", "lost_cause", "make_executor"]


PRELOAD = ("torch", "numpy", "avalanche.training", "avalanche.evaluation.metrics", "avalanche_plugins")


class LocalExecutor:
    """``workers == 1``: in this process; otherwise a ``spawn`` process pool. Every worker runs
    :func:`init_worker` first.

    ``isolate=True``: every job runs alone in a fresh process (``workers`` at a time), forked
    from a server that has imported :data:`PRELOAD` once, so a job's peak memory is its own (not
    the high-water mark of the jobs before it) and starting one costs a fork, not the imports.

    ``lost_row(job, cause)``: the row of a job whose worker process died (the pool broke, e.g. the
    kernel's out-of-memory killer); None: the pool's ``BrokenProcessPool`` reaches the caller.
    """

    def __init__(self, workers: int = 1, *, threads: int = 1, seed: int = 0,
                 warmup: Callable[[], None] | None = None, isolate: bool = False,
                 lost_row: Callable[[object, str], object] | None = None):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        self.workers, self.initargs, self.isolate = workers, (threads, seed, warmup), isolate
        self.lost_row = lost_row

    def _pool(self, jobs: Sequence) -> ProcessPoolExecutor:
        if not self.isolate:
            return ProcessPoolExecutor(min(self.workers, len(jobs)), mp_context=multiprocessing.get_context("spawn"),
                                       initializer=init_worker, initargs=self.initargs)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        return ProcessPoolExecutor(min(self.workers, len(jobs)), mp_context=ctx, initializer=init_worker,
                                   initargs=self.initargs, max_tasks_per_child=1)

    def map_unordered(self, fn: Callable, jobs: Sequence) -> Iterator[tuple[object, object]]:
        if not jobs:
            return
        if self.workers == 1 and not self.isolate:
            with torch_threads(None), warnings.catch_warnings():  # the caller gets its settings back
                init_worker(*self.initargs)
                for job in jobs:
                    yield job, fn(job)
            return
        with self._pool(jobs) as pool:
            futures = {pool.submit(fn, job): job for job in jobs}
            for future in as_completed(futures):
                try:
                    ran = future.result()
                except BrokenProcessPool as error:
                    ran = _lost(self.lost_row, futures[future], error)
                yield futures[future], ran


def _lost(lost_row, job, error: BaseException):
    """``lost_row(job, cause)`` for a job its executor lost, or ``error`` raised when there is none."""
    if lost_row is None:
        raise error
    return lost_row(job, lost_cause(error))


def lost_cause(error: BaseException, limit: int = 300) -> str:
    """``"Type: first line of the message"`` of an executor's error (a Ray error's message is a
    whole remote traceback; its first line names what happened).

    Example:
        >>> lost_cause(RuntimeError("the node died\\n  traceback ..."))
        'RuntimeError: the node died'
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


_warmed_up: set = set()  # per Ray worker process: the warm-ups already run


def _ray_task(fn: Callable, job, threads: int, seed: int, warmup: Callable[[], None] | None):
    """One job in a Ray worker: :func:`init_worker`'s set-up (its warm-up once per process),
    then the globals seeded again, so a row never depends on which jobs ran there before. A dict
    row gets ``node_ip``: the address of the Ray node that ran it (where, not what: left out of
    comparisons with the local executor's rows)."""
    import ray

    init_worker(threads, seed)
    key = f"{getattr(warmup, '__module__', '')}.{getattr(warmup, '__qualname__', repr(warmup))}"
    if warmup is not None and key not in _warmed_up:
        warmup()
        _warmed_up.add(key)
        seed_everything(seed)
    ran = fn(job)
    if isinstance(ran, _Ran) and isinstance(ran.row, dict):
        ran.row = {**ran.row, "node_ip": ray.util.get_node_ip_address()}
    elif isinstance(ran, dict):
        ran = {**ran, "node_ip": ray.util.get_node_ip_address()}
    return ran


def _ray_instance_running(ray) -> bool:
    """Whether ``RAY_ADDRESS`` names a cluster or a ``ray start`` instance runs on this machine."""
    if os.environ.get("RAY_ADDRESS"):
        return True
    with contextlib.suppress(Exception):  # a private Ray API: only used to word a message
        return bool(ray._private.services.find_gcs_addresses())
    return False


class RayExecutor:
    """Jobs as Ray tasks, each holding ``threads`` CPUs; rows are yielded as they finish.

    ``address`` given (``"auto"``, ``"HOST:PORT"``, ``"ray://HOST:10001"``): joins that cluster
    and ships the working directory (the user's folder: their model and benchmark modules) as the
    tasks' ``working_dir`` (the nodes need the same Python packages, this one included;
    ``--data-root`` must exist on them). Otherwise it starts a private local instance on first use
    (Ray's ``address="local"``: never the cluster of a running ``ray start`` or ``RAY_ADDRESS``) with
    ``num_cpus`` CPUs (``None``: Ray counts them), no dashboard and an object store of
    ``object_store_memory`` bytes, and puts the working directory on the workers' ``PYTHONPATH``. If Ray is
    already initialised in this process it uses that and leaves it running. ``isolate=True``:
    every job in a fresh worker process (``max_calls=1``), for per-job peak memory. :meth:`close` (or
    leaving a ``with`` block) shuts down a Ray it started; Ray also does so at exit.

    While jobs are left and no alive node has the ``threads`` CPUs one needs (a lost node, a head
    with 0 CPUs alone), it says so on stderr at once and every ``wait_report`` seconds (a quarter of
    ``wait_limit`` where that is sooner), with how long and which jobs wait; after ``wait_limit``
    seconds of it (None: no limit) it raises :class:`NoNodeCanRun`, naming the lost nodes and
    the jobs not done (the rows already yielded are the caller's: :func:`run_jobs` has cached them).

    ``lost_row(job, cause)``: the row of a job Ray could not run to the end (its retries used up on
    lost nodes or crashed workers, a task that raised, a working directory that failed to unpack),
    so one lost job neither stops the study nor loses the others; None: Ray's error reaches the caller.
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None, threads: int = 1,
                 warmup: Callable[[], None] | None = None, *, seed: int = 0, runtime_env: dict | None = None,
                 object_store_memory: int | None = 512 * 2**20, isolate: bool = False,
                 wait_limit: float | None = None, wait_report: float = 60.0,
                 lost_row: Callable[[object, str], object] | None = None):
        if wait_limit is not None and not (isinstance(wait_limit, (int, float)) and wait_limit > 0):
            raise ValueError(f"wait_limit must be a number of seconds > 0 or None, got {wait_limit!r}")
        if not (isinstance(wait_report, (int, float)) and wait_report > 0):
            raise ValueError(f"wait_report must be a number of seconds > 0, got {wait_report!r}")
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ValueError(f"address must be a non-empty string such as 'auto' or 'HOST:PORT', got {address!r}")
        if num_cpus is not None and (not isinstance(num_cpus, int) or num_cpus < 1):
            raise ValueError(f"num_cpus must be an int >= 1 or None, got {num_cpus!r}")
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        if num_cpus is not None and address is None and threads > num_cpus:
            raise ValueError(f"threads ({threads}) must not exceed num_cpus ({num_cpus}): each task holds "
                             "`threads` CPUs")
        self.address, self.num_cpus, self.threads, self.seed, self.warmup = address, num_cpus, threads, seed, warmup
        self.runtime_env, self.object_store_memory, self.isolate = runtime_env, object_store_memory, isolate
        self.wait_limit, self.wait_report, self.lost_row = wait_limit, wait_report, lost_row
        self.started = False  # whether this executor started (and so shuts down) Ray

    @staticmethod
    def _ray():
        try:
            import ray
        except ImportError as err:
            raise ImportError("--executor ray needs Ray: pip install -e '.[ray]' (the `ray` extra of "
                              "setup.cfg)") from err
        return ray

    def start(self):
        """Initialise Ray (see the class docstring) unless it already is; returns the module."""
        ray = self._ray()
        if ray.is_initialized():
            return ray
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # offline machines: no usage reports
        if self.address is not None:
            env = self.runtime_env or {"working_dir": str(Path.cwd()),
                                       "excludes": [".git", ".venv", "out", "*.pt", "*.pth"]}
            ray.init(address=self.address, runtime_env=env, logging_level="warning")
            print(f"Ray: joined the cluster at {self.address!r} "
                  f"({ray.cluster_resources().get('CPU', 0):g} CPUs)", file=sys.stderr)
        else:
            path = os.pathsep.join(p for p in (str(Path.cwd()), os.environ.get("PYTHONPATH")) if p)
            env = self.runtime_env or {"env_vars": {"PYTHONPATH": path}}
            # address="local": a private instance even where `ray start` runs or RAY_ADDRESS is set
            # (plain ray.init() would join that cluster, and refuses num_cpus there)
            others = " (a Ray instance already runs on this machine: pass --address auto to join it)" \
                if _ray_instance_running(ray) else ""
            ray.init(address="local", num_cpus=self.num_cpus, include_dashboard=False, runtime_env=env,
                     object_store_memory=self.object_store_memory, logging_level="warning")
            print(f"Ray: started a private local instance with "
                  f"{ray.cluster_resources().get('CPU', 0):g} CPUs{others}", file=sys.stderr)
        self.started = True
        return ray

    def close(self) -> None:
        """Shut down the Ray instance this executor started (no-op otherwise)."""
        if self.started:
            ray = self._ray()
            if ray.is_initialized():
                ray.shutdown()
            self.started = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def map_unordered(self, fn: Callable, jobs: Sequence) -> Iterator[tuple[object, object]]:
        if not jobs:
            return
        ray = self.start()
        # max_calls=1 (a fresh worker process per job) is a remote() setting, not an option
        task = ray.remote(max_calls=1)(_ray_task) if self.isolate else ray.remote(_ray_task)
        task = task.options(num_cpus=self.threads)
        fn_ref, warmup_ref = ray.put(fn), ray.put(self.warmup)  # shipped once, not with every job
        pending = {task.remote(fn_ref, job, self.threads, self.seed, warmup_ref): job for job in jobs}
        starved = _Starved(self.threads, self.wait_limit, self.wait_report)
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=starved.poll)
                if not ready:
                    starved.check(_ray_capacity(ray, self.threads), list(pending.values()))
                for ref in ready:
                    job = pending.pop(ref)
                    try:
                        ran = ray.get(ref)
                    except ray.exceptions.RayError as error:
                        ran = _lost(self.lost_row, job, error)
                    yield job, ran
        finally:  # an error, or the caller stopped early: drop what has not run
            for ref in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)


class NoNodeCanRun(RuntimeError):
    """Ray jobs waited past the executor's ``wait_limit`` with no alive node able to run one."""


def _ray_capacity(ray, threads: int) -> tuple[int, list[str]]:
    """``(jobs the alive nodes can run at once, addresses of the lost nodes)``: each job holds
    ``threads`` CPUs; a lost node is a dead one whose address no alive node has (``ray.nodes()``)."""
    nodes = ray.nodes()
    alive = [n for n in nodes if n.get("Alive")]
    capacity = sum(int(n.get("Resources", {}).get("CPU", 0) // threads) for n in alive)
    here = {n.get("NodeManagerAddress") for n in alive}
    lost = sorted({str(n.get("NodeManagerAddress", "?")) for n in nodes if not n.get("Alive")} - here)
    return capacity, lost


def _job_names(jobs: Sequence, shown: int = 6) -> str:
    names = [str(getattr(job, "run_name", None) or job) for job in jobs]
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


class _Starved:
    """How long no alive node could run a job: said at once and every ``report`` seconds (a
    quarter of ``limit`` where sooner) on stderr; past ``limit`` seconds, :class:`NoNodeCanRun`.

    Example:
        >>> import contextlib, io
        >>> s, said = _Starved(threads=2, limit=None, report=60.0), io.StringIO()
        >>> with contextlib.redirect_stderr(said):
        ...     s.check((0, ["10.0.0.2"]), ["a/b/seed0"])  # (capacity, lost nodes), the jobs left
        >>> said.getvalue().split(";")[0]
        'Ray: no alive node has the 2 CPU(s) a job needs (lost node(s): 10.0.0.2)'
        >>> s.check((1, []), ["a/b/seed0"]); s.since is None  # a node is back: the clock stops
        True
    """

    def __init__(self, threads: int, limit: float | None, report: float):
        self.threads, self.limit = threads, limit
        self.report = report if limit is None else min(report, max(limit / 4, 0.5))
        self.poll = min(5.0, self.report)  # seconds between looks at the cluster while no row arrives
        self.since = self.said = None

    def check(self, state: tuple[int, list[str]], jobs: Sequence) -> None:
        capacity, lost = state
        if capacity > 0:
            self.since = None
            return
        now = time.monotonic()
        if self.since is None:
            self.since = self.said = now
        waited = now - self.since
        why = f"no alive node has the {self.threads} CPU(s) a job needs" + \
              (f" (lost node(s): {', '.join(lost)})" if lost else "")
        if self.limit is not None and waited >= self.limit:
            raise NoNodeCanRun(f"stopped after {waited:.0f} s (wait limit {self.limit:g} s): {why}; "
                               f"{len(jobs)} job(s) not done: {_job_names(jobs)}")
        if waited == 0 or now - self.said >= self.report:
            self.said = now
            until = f"stopping after {self.limit:g} s" if self.limit is not None else \
                "until a node joins (a wait limit stops the study)"
            for_ = f" for {waited:.0f} s" if waited else ""
            print(f"Ray: {why}; {len(jobs)} job(s) waiting{for_}, {until}: {_job_names(jobs)}",
                  file=sys.stderr, flush=True)


EXECUTORS = ("local", "ray")


def make_executor(kind: str = "local", *, workers: int = 1, threads: int = 1, address: str | None = None,
                  warmup: Callable[[], None] | None = None, isolate: bool = False, wait_limit: float | None = None,
                  lost_row: Callable[[object, str], object] | None = None):
    """A :class:`LocalExecutor` with ``workers`` processes (``kind="local"``), or a
    :class:`RayExecutor` (``kind="ray"``) joining ``address`` or started locally with
    ``workers × threads`` CPUs; ``threads`` torch threads per job, ``warmup`` run once per worker
    process, ``isolate``: every job in a fresh process (per-job peak memory), ``wait_limit``
    (Ray only): seconds jobs may wait with no node able to run one (:class:`RayExecutor`),
    ``lost_row(job, cause)``: the row of a job the executor lost (a dead worker or node) instead of
    its error.

    Example:
        >>> type(make_executor("local", workers=2)).__name__
        'LocalExecutor'
        >>> ex = make_executor("ray", workers=2, threads=2)
        >>> type(ex).__name__, ex.num_cpus, ex.threads, ex.address
        ('RayExecutor', 4, 2, None)
    """
    if kind == "local":
        if address is not None or wait_limit is not None:
            raise ValueError("address and wait_limit are only used with executor 'ray'")
        return LocalExecutor(workers, threads=threads, warmup=warmup, isolate=isolate, lost_row=lost_row)
    if kind == "ray":
        return RayExecutor(address=address, num_cpus=None if address else workers * threads, threads=threads,
                           warmup=warmup, isolate=isolate, wait_limit=wait_limit, lost_row=lost_row)
    raise ValueError(f"executor must be one of {EXECUTORS}, got {kind!r}")
