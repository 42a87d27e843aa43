"""The job machinery of the study and of every benchmark: jobs, cache keys, worker set-up, a resumable executor.

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

Modules: :mod:`~avalanche_plugins.study.jobs.environment` (a job's process),
:mod:`~avalanche_plugins.study.jobs.code` (the code a job ran), :mod:`~avalanche_plugins.study.jobs.cache`
(keys, the resumable :func:`run_jobs`), :mod:`~avalanche_plugins.study.jobs.executors` (local and Ray),
:mod:`~avalanche_plugins.study.jobs.protocol` (tune on validation, then test). The rule of this folder:
it imports nothing else of the study (tests/study/test_layout.py).
"""

from avalanche_plugins.study.jobs.cache import CODE_PER_JOB, job_key, jsonable, run_jobs
from avalanche_plugins.study.jobs.code import (
    PACKAGE_ROOT,
    checkout_code,
    code_roots,
    code_version,
    git_state,
    loaded_code,
    source_version,
)
from avalanche_plugins.study.jobs.environment import (
    Timer,
    init_worker,
    seed_everything,
    torch_threads,
)
from avalanche_plugins.study.jobs.executors import (
    EXECUTORS,
    LocalExecutor,
    NoNodeCanRun,
    RayExecutor,
    lost_cause,
    make_executor,
)

__all__ = [
    "CODE_PER_JOB",
    "EXECUTORS",
    "LocalExecutor",
    "NoNodeCanRun",
    "PACKAGE_ROOT",
    "RayExecutor",
    "Timer",
    "checkout_code",
    "code_roots",
    "code_version",
    "git_state",
    "init_worker",
    "job_key",
    "jsonable",
    "loaded_code",
    "lost_cause",
    "make_executor",
    "run_jobs",
    "seed_everything",
    "source_version",
    "torch_threads",
]
