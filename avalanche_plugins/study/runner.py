"""One study job: a (scenario, strategy, setting, seed) run on the validation or the test split.

A :class:`StudyJob` holds plain specs, so it pickles to any worker and hashes into the resumable
cache key (with the code version). :func:`run_job` builds the run where it executes, trains on
every experience, evaluates on the whole evaluation stream after each, and returns the run's row:
scores from the accuracy matrix and every value every metric logged (the ``TidyCSVLogger`` rows,
read back), so the rows reach the study even from a remote worker.
"""

from __future__ import annotations

import copy
import csv
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avalanche_plugins.study.config import plugin_index
from avalanche_plugins.study.harness.jobs import Timer, seed_everything
from avalanche_plugins.study.stats import run_scores

__all__ = ["CONTEXT", "StudyJob", "accuracy_matrix", "apply_setting", "run_job"]

CONTEXT = ("scenario", "strategy", "setting", "seed", "split")  # the tidy CSV's context columns
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=-]+")


@dataclass(frozen=True)
class StudyJob:
    """Everything one run needs (its fields are its cache key, with the code version)."""

    study: str
    scenario: dict
    model: dict
    training: dict
    strategy: dict  # name, class, kwargs and plugins with the setting applied
    setting: str
    metrics: list  # metric specs; tuning runs get none (accuracy, forgetting and BWT only)
    loggers: list
    seed: int
    split: str  # "validation" (tuning) or "test"

    @property
    def run_name(self) -> str:
        parts = [self.scenario["name"], self.strategy["name"], self.setting, f"seed{self.seed}"]
        if self.split != "test":
            parts[-1] += f"-{self.split}"
        return "/".join(_UNSAFE.sub("_", p).strip("_") or "_" for p in parts)


def apply_setting(strategy: dict, training: dict, setting: dict) -> tuple[dict, dict]:
    """``(strategy spec, training)`` with a grid setting applied: bare keys go to the strategy's
    kwargs, ``training.KEY`` to the training settings, ``PLUGIN.KEY`` / ``plugins[i].KEY`` to a
    plugin's kwargs. The strategy's own ``training`` overrides the study's."""
    spec = {"name": strategy["name"], "class": strategy["class"], "kwargs": dict(strategy["kwargs"]),
            "plugins": copy.deepcopy(strategy["plugins"])}
    training = {**training, **strategy.get("training", {})}
    for key, value in setting.items():
        owner, _, argument = key.rpartition(".")
        if not owner:
            spec["kwargs"][argument] = value
        elif owner == "training":
            training[argument] = value
        else:
            spec["plugins"][plugin_index(owner, spec["plugins"], key)]["kwargs"][argument] = value
    return spec, training


def accuracy_matrix(rows, n_experiences: int | None = None) -> np.ndarray:
    """``R[i, j]`` from tidy rows: ``Top1_Acc_Exp`` on the evaluation stream, ``i`` the training
    experience, ``j`` the evaluated one (NaN where nothing was logged)."""
    cells = {}
    for row in rows:
        if row["metric"] == "Top1_Acc_Exp" and row["phase"] == "eval" and row["training_experience"] not in ("", None):
            cells[int(row["training_experience"]), int(row["experience"])] = float(row["value"])
    n = n_experiences or (1 + max((max(i, j) for i, j in cells), default=-1))
    acc = np.full((n, n), np.nan)
    for (i, j), value in cells.items():
        if i < n and j < n:
            acc[i, j] = value
    return acc


_DIVERGED = re.compile(r"\bnan\b|\binf\b|non-finite|diverg", re.IGNORECASE)


def run_job(job: StudyJob, log_dir: str | None = None) -> dict:
    """Train and evaluate one run; return its row (module docstring). A run that diverges (an
    error about NaN / non-finite values) returns NaN scores and the error, so do tuning runs that
    fail in any way (a grid outcome); other errors of a test run are raised."""
    row = {"scenario": job.scenario["name"], "strategy": job.strategy["name"], "setting": job.setting,
           "seed": job.seed, "split": job.split}
    try:
        return {**row, **_train(job, log_dir)}
    except (ValueError, RuntimeError, FloatingPointError) as error:
        if job.split == "test" and not _DIVERGED.search(str(error)):
            raise
        return {**row, **{m: float("nan") for m in ("acc", "forgetting", "bwt")}, "wall_s": float("nan"),
                "accuracy_matrix": [], "metrics": [], "error": f"{type(error).__name__}: {error}"}


def _train(job: StudyJob, log_dir: str | None) -> dict:
    from avalanche_plugins.study.build import (
        build_evaluator,
        build_model,
        build_plugins,
        build_strategy,
        build_stream,
    )
    from avalanche_plugins.study.harness.training import quiet_deprecations

    stream = build_stream(job.scenario, job.seed, validation=job.split == "validation")
    seed_everything(job.seed)  # after the stream: Avalanche's generators reseed torch
    model = build_model(job.model, stream)
    plugins = build_plugins(job.strategy["plugins"])
    context = {"scenario": job.scenario["name"], "strategy": job.strategy["name"], "setting": job.setting,
               "seed": job.seed, "split": job.split}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(log_dir) if log_dir is not None else Path(scratch)
        tidy_path = root / "runs" / f"{job.run_name}.csv"
        evaluator, loggers = build_evaluator(job.metrics, stream, model, plugins, tidy_path=tidy_path,
                                             context=context, images=log_dir is not None, loggers=job.loggers,
                                             log_dir=root, run_name=job.run_name, project=job.study)
        strategy = build_strategy(job.strategy, model, job.training, plugins, evaluator)
        benchmark = stream.benchmark
        try:
            with Timer() as timer, quiet_deprecations():
                for experience in benchmark.train_stream:
                    strategy.train(experience, num_workers=0)
                    strategy.eval(benchmark.test_stream, num_workers=0)
        finally:
            _close(loggers)
        with open(tidy_path, newline="") as f:
            metrics = list(csv.DictReader(f))
    acc = accuracy_matrix(metrics, len(benchmark.train_stream))
    scores = run_scores(acc)
    if job.split == "test" and not math.isfinite(scores["acc"]):
        raise RuntimeError(f"{job.run_name}: the accuracy matrix has holes: {acc.tolist()}")
    return {**scores, "wall_s": timer.seconds, "accuracy_matrix": acc.tolist(), "metrics": metrics}


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
