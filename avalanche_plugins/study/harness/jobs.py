"""One job protocol for every benchmark: jobs, cache keys, worker set-up, a resumable executor.

* A **job** is a small frozen dataclass holding everything its function needs (settings, seed,
  data root), so ``fn(job)`` gives the same row in any process.
* Its **cache key** (:func:`job_key`) is a hash of the job's fields and its type name; :func:`run_jobs`
  stores with each row the code the job ran and reuses a cached row only while every file of that
  code is unchanged (its syntax tree without docstrings). The code a job ran is found after it
  ran, not guessed before: :func:`loaded_code` hashes every ``.py`` file under the job function's
  :func:`code_roots` (this package, and the top-level package or module the function is defined
  in, e.g. ``benchmarks/``) that the job's process had imported when it finished (a superset
  where the process ran other jobs first). So a commit to a module the job never imported (another
  benchmark, a test, report code), or to a docstring or comment anywhere, keeps the cache; a change
  to code it ran reruns it. Nothing but the job function decides the roots: importing a module
  changes no key. A study's user modules are hashed into its jobs' fields (``StudyJob.sources``).
  Results record :func:`code_version` (the git commit, else the package version), and every cache
  line the code version it was made with.
* Every worker process first runs :func:`init_worker` (torch threads, warnings, seeds, an optional
  warm-up); in-process runs (``workers=1``) do the same and restore the thread count afterwards.
* :func:`run_jobs` runs the jobs through an executor (:class:`LocalExecutor`: in this process or
  a ``spawn`` process pool; :class:`RayExecutor`: tasks on a local or remote Ray cluster; any
  backend only has to yield ``(job, row)`` pairs from ``map_unordered(fn, jobs)``; :func:`make_executor`
  makes either from plain keywords), appends
  every finished row to a JSON-lines cache and, run again, reuses the cached rows, so an
  interrupted run resumes where it stopped. Rows come back in job order.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

__all__ = [
    "EXECUTORS",
    "Timer",
    "LocalExecutor",
    "NoNodeCanRun",
    "checkout_code",
    "code_roots",
    "RayExecutor",
    "code_version",
    "git_state",
    "source_version",
    "init_worker",
    "jsonable",
    "job_key",
    "loaded_code",
    "make_executor",
    "run_jobs",
    "seed_everything",
    "torch_threads",
]


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's legacy and torch's global generators."""
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


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Run the block with ``threads`` torch threads (``None``: unchanged), then restore."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``git:<commit>`` of the checkout this package runs from (an editable install), with
    ``+dirty`` when the checkout's code (:func:`checkout_code`) differs from that commit
    (:func:`git_state`), else
    ``avalanche_plugins <version>`` (an installed wheel). :func:`source_version` names the exact
    code either way."""
    root = PACKAGE_ROOT.parent
    state = git_state(root, checkout_code()) if (root / ".git").exists() and (root / "setup.cfg").exists() else None
    if state is not None:
        return state
    import avalanche_plugins

    return f"avalanche_plugins {avalanche_plugins.__version__}"


def git_state(root, code) -> str | None:
    """``git:<commit>`` of the repository at ``root``, ``+dirty`` when a ``.py`` file under the
    folders ``code`` is modified, staged or untracked there (the commit then does not name the code
    that ran); None when git cannot tell.

    Example:
        >>> git_state("/nonexistent-folder", []) is None
        True
    """
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10,
                              check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        folders = [str(Path(folder).resolve()) for folder in code]
        changed = git("status", "--porcelain", "--", *folders).splitlines() if folders else []
    except (OSError, subprocess.SubprocessError):
        return None
    if not commit:
        return None
    dirty = any(line.rstrip().endswith(".py") for line in changed)
    return f"git:{commit}" + ("+dirty" if dirty else "")


PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the avalanche_plugins folder


def checkout_code() -> list[Path]:
    """The folders of code of the checkout this package runs from: the package, and ``benchmarks/``
    beside it where there is one (an installed wheel: the package alone). What :func:`code_version`
    checks for changes and :func:`source_version` hashes, the same whatever this process imported."""
    benchmarks = PACKAGE_ROOT.parent / "benchmarks"
    return [PACKAGE_ROOT, *([benchmarks] if (benchmarks / "__init__.py").is_file() else [])]


@functools.lru_cache(maxsize=1)
def source_version() -> str:
    """Hash of the source of the checkout's code (:func:`checkout_code`: every ``.py`` file of this
    package and of the checkout's ``benchmarks/``): names the exact code, dirty or not, beside
    :func:`code_version` (the cache keys on each job's own code instead: :func:`loaded_code`)."""
    digest = hashlib.sha256()
    for root in checkout_code():
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(path.read_bytes())
    return f"src:{digest.hexdigest()[:16]}"


def code_roots(fn: Callable) -> tuple[Path, ...]:
    """The folders (or module file) whose modules count as code a job of ``fn`` can run: this
    package, and the top-level package ``fn`` is defined in (its module file where that is a
    plain module; ``functools.partial`` unwrapped), unless that is installed code or the standard
    library. Computed from ``fn`` alone, wherever it runs (a Ray node finds its own copy).

    Example:
        >>> [p.name for p in code_roots(seed_everything)], [p.name for p in code_roots(len)]
        (['avalanche_plugins'], ['avalanche_plugins'])
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    home = _home(sys.modules.get(module.__name__.partition(".")[0], module)) if module is not None else None
    if home is None or home == PACKAGE_ROOT or home.is_relative_to(PACKAGE_ROOT) or _installed(home):
        return (PACKAGE_ROOT,)
    return PACKAGE_ROOT, home


def _home(module) -> Path | None:
    """The folder of a package (its ``__init__.py``'s, or a namespace package's first), or a module's file."""
    file = getattr(module, "__file__", None)
    if file:
        path = Path(file).resolve()
        return path.parent if path.name == "__init__.py" else path
    folders = list(getattr(module, "__path__", None) or [])
    return Path(folders[0]).resolve() if folders else None


def _installed(path: Path) -> bool:
    """Whether ``path`` is installed code (under site-packages / dist-packages) or the standard library."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    return any(part in ("site-packages", "dist-packages") for part in path.parts) or path.is_relative_to(stdlib)


@functools.lru_cache(maxsize=4096)
def _file_hash(path: str, mtime_ns: int, size: int) -> str:
    """Hash of what the file's code does: its syntax tree without docstrings (comments and
    formatting are not in the tree), so editing a docstring or a comment keeps cached rows."""
    source = Path(path).read_bytes()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return hashlib.sha256(source).hexdigest()[:16]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def loaded_code(roots: Sequence[Path] = (PACKAGE_ROOT,)) -> dict[str, str]:
    """``{file: sha256 prefix}`` of every ``.py`` file under ``roots`` (a job function's
    :func:`code_roots`) that this process has imported: the code a job that ran here can have run
    (a superset where the process ran other things before). Paths are relative to the root's
    parent (``avalanche_plugins/core/calls.py``, ``benchmarks/scale/main.py``)."""
    out = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py"):
            continue
        path = Path(file).resolve()
        root = next((r for r in roots if path.is_relative_to(r)), None)
        if root is not None and path.is_file():
            stat = path.stat()
            out[str(path.relative_to(root.parent))] = _file_hash(str(path), stat.st_mtime_ns, stat.st_size)
    return dict(sorted(out.items()))


def _changed_code(code: dict[str, str], roots: Sequence[Path] = (PACKAGE_ROOT,)) -> list[str]:
    """The files of ``code`` (from :func:`loaded_code` with ``roots``) whose code here differs (or that are gone)."""
    parents = [r.parent for r in roots]
    changed = []
    for name, digest in code.items():
        path = next((p / name for p in parents if (p / name).is_file()), None)
        if path is None:
            changed.append(name)
            continue
        stat = path.stat()
        if _file_hash(str(path), stat.st_mtime_ns, stat.st_size) != digest:
            changed.append(name)
    return changed


def _code_unchanged(code: dict[str, str], roots: Sequence[Path] = (PACKAGE_ROOT,)) -> bool:
    """Whether every file of ``code`` (from :func:`loaded_code` with ``roots``) still has the hash it had."""
    return not _changed_code(code, roots)


def _refuse_other_code(row, code: dict[str, str], roots: Sequence[Path] = (PACKAGE_ROOT,)):
    """A Ray row (``node_ip``) whose node ran code that differs from the driver's becomes a failed
    run (status ``error``, naming the node and the files): its numbers are not those of this code."""
    if not (isinstance(row, dict) and "node_ip" in row):
        return row
    changed = _changed_code(code, roots)
    if not changed:
        return row
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return {**row, "status": "error",
            "error": f"node {row['node_ip']} ran other code than the driver's ({shown}); install the driver's "
                     f"version of the package on every node"}


@dataclasses.dataclass
class _Ran:
    """What a worker returns for one job: its row and the code it ran (:func:`loaded_code`)."""

    row: object
    code: dict


CODE_FIELD = "_code_ran"  # the key a dict row carries its code in, from the worker to run_jobs


def _run_recording_code(fn: Callable, job, *args, **kwargs):
    """``fn(job, ...)`` (an executor may pass more, e.g. a progress callback) with the code it ran:
    a dict row carries it under :data:`CODE_FIELD` (so an executor that reads or amends rows sees
    a row), anything else comes back as a :class:`_Ran`. The code is :func:`loaded_code` under
    ``fn``'s :func:`code_roots`, found in the process that ran it."""
    row = fn(job, *args, **kwargs)
    code = loaded_code(code_roots(fn))
    if isinstance(row, dict):
        return {**row, CODE_FIELD: code}
    return _Ran(row, code)


def _unpack(ran, roots: Sequence[Path] = (PACKAGE_ROOT,)) -> _Ran:
    """What a worker sent back, as ``_Ran(row, code)``; an executor's own row (a timeout, a
    killed child) carries no code: this process's code under ``roots`` stands in for it."""
    if isinstance(ran, _Ran):
        return ran
    if isinstance(ran, dict) and CODE_FIELD in ran:
        row = dict(ran)
        return _Ran(row, row.pop(CODE_FIELD))
    return _Ran(ran, loaded_code(roots))


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


def init_worker(threads: int = 1, seed: int = 0, warmup: Callable[[], None] | None = None) -> None:
    """What every worker runs before its first job: ``threads`` torch threads (oversubscribed
    threads on a small machine make ``torch.func`` code tens of times slower), warnings off,
    every global generator seeded with ``seed`` (each job still seeds itself), then ``warmup()``
    (e.g. a first ``torch.func`` call, whose one-off cost would otherwise land in a job's timing)."""
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    seed_everything(seed)
    if warmup is not None:
        warmup()


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
