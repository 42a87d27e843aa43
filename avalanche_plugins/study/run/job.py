"""One study job: a (scenario, strategy, setting, seed) run on the validation or the test split.

A :class:`StudyJob` holds plain specs, so it pickles to any worker and hashes into the resumable
cache key (with the code version). :func:`run_job` builds the run where it executes, trains on
every experience, evaluates on the whole evaluation stream after each, and returns the run's row:
scores from the accuracy matrix and every value every metric logged (the ``TidyCSVLogger`` rows,
read back), so the rows reach the study even from a remote worker. With ``ship_files=True`` (the
study's Ray runs) the run's own files (``runs/``, ``tensorboard/``, ``text/``, ``wandb/``) are
written in a scratch folder on the node that ran it and come back in the row under :data:`FILES`
(``{relative path: bytes}``); :func:`write_files` puts them under the driver's ``--out``.
"""

from __future__ import annotations

import csv
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from avalanche_plugins.study.catalog.diagnostics import ACCURACY, TASK_IL_ACCURACY
from avalanche_plugins.study.catalog.registry import import_paths
from avalanche_plugins.study.contracts.rows import CONTEXT_KEYS, SCORES, RunRow
from avalanche_plugins.study.contracts.scores import run_scores
from avalanche_plugins.study.contracts.specs import (
    MetricSpec,
    ModelSpec,
    RunSpec,
    ScenarioSpec,
    TrainingSpec,
)
from avalanche_plugins.study.jobs import Timer, seed_everything

__all__ = ["CONTEXT", "FILES", "OUTSIDE_THE_METHOD", "StudyJob", "accuracy_matrix", "failed_outside_the_method",
           "lost_row", "read_files", "run_job", "write_files"]

# statuses of a run that failed for a reason outside the method (an import, the config, the data, a
# metric's or plugin's callback): rerun on the next run of the study, and a non-zero exit status.
# A "diverged" run is a result of the method: cached and scored as failed like any other result.
OUTSIDE_THE_METHOD = frozenset({"error", "callback"})


def failed_outside_the_method(row: RunRow | dict) -> bool:
    """Whether ``row`` (a run's row, typed or its JSON form) failed for a reason outside the method
    (``OUTSIDE_THE_METHOD``).

    Example:
        >>> failed_outside_the_method({"status": "error"}), failed_outside_the_method({"status": "diverged"})
        (True, False)
    """
    return RunRow.of(row).status in OUTSIDE_THE_METHOD


CONTEXT = CONTEXT_KEYS  # the tidy CSV's context columns
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=-]+")


@dataclass(frozen=True)
class StudyJob:
    """Everything one run needs (its fields are its cache key, with the code version)."""

    study: str
    scenario: ScenarioSpec
    model: ModelSpec
    training: TrainingSpec
    strategy: RunSpec  # class, kwargs and plugins with the setting applied
    setting: str
    metrics: tuple[MetricSpec, ...]  # tuning runs get none (accuracy, forgetting and BWT only)
    loggers: tuple[str, ...]
    seed: int
    split: str  # "validation" (tuning) or "test"
    sources: dict = field(default_factory=dict)  # user module → hash of its source (in the cache key)
    paths: tuple = field(default=(), metadata={"cache_key": False})  # where user modules are imported from

    @property
    def run_name(self) -> str:
        parts = [self.scenario.name, self.strategy.name, self.setting, f"seed{self.seed}"]
        if self.split != "test":
            parts[-1] += f"-{self.split}"
        return "/".join(_UNSAFE.sub("_", p).strip("_") or "_" for p in parts)


def accuracy_matrix(rows, n_experiences: int | None = None, metric: str = ACCURACY) -> np.ndarray:
    """``R[i, j]`` from tidy rows: ``metric`` (per-experience accuracy) on the evaluation stream,
    ``i`` the training experience, ``j`` the evaluated one (NaN where nothing was logged)."""
    cells = {}
    for row in rows:
        if row["metric"] == metric and row["phase"] == "eval" and row["training_experience"] not in ("", None):
            cells[int(row["training_experience"]), int(row["experience"])] = float(row["value"])
    n = n_experiences or (1 + max((max(i, j) for i, j in cells), default=-1))
    acc = np.full((n, n), np.nan)
    for (i, j), value in cells.items():
        if i < n and j < n:
            acc[i, j] = value
    return acc


def run_job(job: StudyJob, log_dir: str | None = None, ship_files: bool = False) -> dict:
    """Train and evaluate one run; return its row (module docstring).

    A run that fails in any way is returned, never raised, and never scored: ``status`` is
    ``"diverged"`` (a non-finite loss, gradient or model output: :class:`~.watch.Diverged` names
    the experience, epoch and iteration), ``"callback"`` (an exception in an attached plugin's or
    metric's callback, named with its class, the callback and the experience) or ``"error"``
    (anything else); ``error`` says what happened and the scores are NaN.

    ``ship_files``: the run's files are written under a scratch folder of this node (``log_dir``
    unused) and returned in the row under :data:`FILES`, failed runs' included.
    """
    if not ship_files:
        return _run_job(job, log_dir)
    with tempfile.TemporaryDirectory(prefix="avalanche-study-run-") as scratch:
        row = _run_job(job, scratch)
        return {**row, FILES: read_files(scratch)}


FILES = "files"  # the row key of a shipped run's files: {path relative to the study's out: bytes}


def read_files(root) -> dict[str, bytes]:
    """``{relative posix path: bytes}`` of every file under ``root``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = (Path(d) / "runs").mkdir(), (Path(d) / "runs" / "a.csv").write_bytes(b"x")
        ...     read_files(d)
        {'runs/a.csv': b'x'}
    """
    root = Path(root)
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def write_files(out, files: dict[str, bytes]) -> list[Path]:
    """Write :func:`read_files`' ``files`` under ``out`` (folders made as needed); returns the paths.
    A path that is absolute or climbs out of ``out`` (``..``) is refused with a ``ValueError``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     [p.relative_to(d).as_posix() for p in write_files(d, {"runs/a.csv": b"x"})]
        ['runs/a.csv']
    """
    from pathlib import PurePosixPath

    out, written = Path(out), []
    for name, data in files.items():
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise ValueError(f"a run's file {name!r} is not a path inside the study's out folder")
        target = out.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written.append(target)
    return written


def _run_job(job: StudyJob, log_dir: str | None) -> dict:
    """:func:`run_job` writing the run's files under ``log_dir`` (None: a scratch folder, no images)."""
    from avalanche_plugins.study.run.watch import CallbackFailed, Diverged

    facts: dict = {}  # the stream's setting, experiences and classes, once it is built (provenance)
    try:
        with import_paths(job.paths):  # where the study's user modules are imported from, for this job only
            return RunRow(**_context(job), **_train(job, log_dir, facts), stream=facts, status="ok").as_dict()
    except Diverged as error:
        status, cause = "diverged", str(error)
    except CallbackFailed as error:
        status, cause = "callback", str(error)
    except Exception as error:  # noqa: BLE001 - a failed run is recorded, the study goes on
        status, cause = "error", f"{type(error).__name__}: {error}"
    if job.scenario.online and "access_task_boundaries=True" in cause:  # say it in the config's terms
        cause += f" (scenario {job.scenario.name}: set online.access_task_boundaries: true)"
    return _failed_row(job, status, cause, facts).as_dict()


def _context(job: StudyJob) -> dict:
    return {"scenario": job.scenario.name, "strategy": job.strategy.name, "setting": job.setting,
            "seed": job.seed, "split": job.split}


def _failed_row(job: StudyJob, status: str, cause: str, facts: dict | None = None) -> RunRow:
    """The row of a run that failed: NaN scores and costs (no callback seconds), empty matrices."""
    nan = float("nan")
    costs = {"wall_s": nan, "train_s": nan, "diagnostics_s": nan, "figures_s": nan, "peak_memory_mb": nan,
             "callback_s": {}}
    return RunRow(**_context(job), scores=dict.fromkeys(SCORES, nan), costs=costs, accuracy_matrix=[], til_matrix=[],
                  baseline_accuracy=[], metrics=[], stream=facts or {}, status=status, error=cause)


def lost_row(job: StudyJob, cause: str) -> dict:
    """The row of a job its executor lost (a Ray task whose retries were used up on a dead node or
    worker, a local worker process killed): failed outside the method (status ``"error"``), so
    the study exits non-zero and a rerun runs it again.

    Example:
        >>> from avalanche_plugins.study.contracts.specs import ModelSpec, RunSpec, ScenarioSpec, TrainingSpec
        >>> job = StudyJob("s", ScenarioSpec("digits", "split_digits"), ModelSpec("mlp"), TrainingSpec(),
        ...                RunSpec("Naive", "Naive"), "default", (), (), 0, "test")
        >>> row = lost_row(job, "NodeDiedError: the node running it died")
        >>> row["status"], failed_outside_the_method(row), row["error"]
        ('error', True, 'job lost by the executor: NodeDiedError: the node running it died')
    """
    return _failed_row(job, "error", f"job lost by the executor: {cause}").as_dict()


def _disjoint_classes(stream) -> bool:
    """Whether the training experiences' class sets are pairwise disjoint (a split scenario)."""
    seen: set = set()
    experiences = list(stream.benchmark.train_stream)
    for experience in experiences:
        classes = set(int(c) for c in experience.classes_in_this_experience)
        if classes & seen:
            return False
        seen |= classes
    return len(experiences) > 1


def _initial_accuracy(strategy, experience) -> float:
    """Accuracy of the untrained model on ``experience`` (NaN where it cannot predict yet, e.g.
    a multi-head model without that task's head): the b̄ of forward transfer."""
    from avalanche_plugins import stream_accuracy

    try:
        return stream_accuracy(strategy, [experience])
    except (KeyError, IndexError, RuntimeError, ValueError):
        return float("nan")


def _peak_memory_mb(device: str) -> float:
    """Peak memory of this process: ``torch.cuda.max_memory_allocated`` on a GPU, else the RSS
    high-water mark (``ru_maxrss``, KiB on Linux)."""
    import resource

    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _train(job: StudyJob, log_dir: str | None, facts: dict) -> dict:
    """Build and run ``job``; returns what it measured as :class:`RunRow` fields (scores, costs,
    matrices, the tidy rows), ``facts`` filled with its stream's facts once the stream is built."""
    from avalanche_plugins.study.catalog.datasets import stream_facts
    from avalanche_plugins.study.jobs.environment import quiet_deprecations
    from avalanche_plugins.study.run.build import (
        build_evaluator,
        build_model,
        build_plugins,
        build_strategy,
        build_stream,
    )
    from avalanche_plugins.study.run.watch import DivergenceWatch, time_callbacks

    stream = build_stream(job.scenario, job.seed, validation=job.split == "validation")
    facts.update(stream_facts(stream))
    seed_everything(job.seed)  # after the stream: Avalanche's generators reseed torch
    model = build_model(job.model, stream)
    plugins = build_plugins(job.strategy.plugins)
    task_il = not stream.task_incremental and _disjoint_classes(stream)
    context = _context(job)
    ledger: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(log_dir) if log_dir is not None else Path(scratch)
        tidy_path = root / "runs" / f"{job.run_name}.csv"
        evaluator, loggers, metrics = build_evaluator(job.metrics, stream, model, plugins, tidy_path=tidy_path,
                                                      context=context, images=log_dir is not None,
                                                      loggers=job.loggers, log_dir=root, run_name=job.run_name,
                                                      project=job.study, task_il=task_il)
        timed_metrics = time_callbacks(metrics, ledger)
        time_callbacks(plugins, ledger)
        strategy = build_strategy(job.strategy, model, job.training, [DivergenceWatch(), *plugins], evaluator)
        benchmark = stream.benchmark
        model.to(strategy.device)
        baseline = [_initial_accuracy(strategy, experience) for experience in benchmark.test_stream]
        _import_autograd_machinery()
        try:
            with Timer() as timer, quiet_deprecations():
                for experiences in _training_units(benchmark.train_stream, job.scenario, job.seed):
                    for experience in experiences:
                        strategy.train(experience, num_workers=0)
                    strategy.eval(benchmark.test_stream, num_workers=0)
        finally:
            with Timer() as closing:  # the tidy logger draws and writes the run's figures here
                _close(loggers)
        with open(tidy_path, newline="") as f:
            rows = list(csv.DictReader(f))
    n = len(benchmark.train_stream)
    acc = accuracy_matrix(rows, n)
    til = accuracy_matrix(rows, n, metric=TASK_IL_ACCURACY) if task_il else np.zeros((0, 0))
    scores = run_scores(acc, baseline=baseline, task_il=til if task_il else None)
    if not math.isfinite(scores["acc"]):
        raise RuntimeError(f"{job.run_name}: the accuracy matrix has holes: {acc.tolist()}")
    diagnostics = sum(ledger[label] for label in timed_metrics)
    costs = {"wall_s": timer.seconds, "train_s": timer.seconds - diagnostics, "diagnostics_s": diagnostics,
             "figures_s": closing.seconds, "callback_s": dict(ledger),
             "peak_memory_mb": _peak_memory_mb(job.training.device)}
    return {"scores": scores, "costs": costs, "accuracy_matrix": acc.tolist(), "til_matrix": til.tolist(),
            "baseline_accuracy": baseline, "metrics": rows}


def _import_autograd_machinery() -> None:
    """Import what the first ``torch.autograd.grad`` and the first ``torch.func.jvp`` of a process
    import (``torch._dynamo``, 0.5–1.5 s on a 2-core CPU; ``torch._decomp.decompositions_for_jvp``,
    0.1 s) before the run's clock starts: a once-per-process cost, not the first job's training or
    its first metric's (issue 41: it made the first job of each worker look 3× slower)."""
    import torch._decomp.decompositions_for_jvp  # noqa: F401
    import torch._dynamo  # noqa: F401


def _training_units(train_stream, scenario: ScenarioSpec, seed: int):
    """What is trained between two evaluations: each experience (offline), or the sub-experiences
    of each original experience of Avalanche's ``split_online_stream`` (a scenario's ``online:``;
    shuffled with the run's seed), so ``R[i, j]`` is measured once per original experience."""
    if not scenario.online:
        for experience in train_stream:
            yield [experience]
        return
    from avalanche.benchmarks.scenarios.online import split_online_stream

    from avalanche_plugins._avalanche.boundaries import evaluated_experience_id

    subs = split_online_stream(train_stream, scenario.online["experience_size"], seed=seed,
                               access_task_boundaries=scenario.online["access_task_boundaries"])
    unit, origin = [], None
    for sub in subs:
        sub_origin = evaluated_experience_id(sub)
        if unit and sub_origin != origin:
            yield unit
            unit = []
        unit.append(sub)
        origin = sub_origin
    if unit:
        yield unit


def _close(loggers) -> None:
    for logger in loggers:
        kind = type(logger).__name__
        if hasattr(logger, "close"):  # TidyCSVLogger
            logger.close()
        elif kind == "TensorboardLogger":
            logger.writer.close()
        elif kind == "TextLogger":
            logger.file.close()
        elif kind == "WandBLogger":
            import wandb

            wandb.finish()
