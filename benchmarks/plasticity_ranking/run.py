"""One run — one learner and one seed — is one job: train online, score every checkpoint."""

from __future__ import annotations

import multiprocessing
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from avalanche_plugins.study.catalog.zoo import MLP
from avalanche_plugins.study.jobs import seed_everything
from benchmarks.plasticity_ranking.learner import MinibatchLearner, OnlineLearner
from benchmarks.plasticity_ranking.scoring import score_checkpoint
from benchmarks.plasticity_ranking.settings import Setting
from benchmarks.plasticity_ranking.tasks import TaskSource


@dataclass(frozen=True)
class Job:
    setting: Setting
    seed: int
    data_root: str | None = None
    checkpoint_dir: str | None = None  # also write every checkpoint there


def run_job(job: Job) -> dict:
    # a per-task bar only in an interactive main process (bars of parallel workers would interleave)
    progress = multiprocessing.parent_process() is None and sys.stderr.isatty()
    return run_setting(job.setting, job.seed, data_root=job.data_root, progress=progress,
                       checkpoint_dir=job.checkpoint_dir)


def run_setting(setting: Setting, seed: int, *, data_root=None, arrays=None, progress: bool = True,
                checkpoint_dir=None) -> dict:
    """Train one learner online, score every checkpoint; returns ``{"checkpoints": [...], ...}``."""
    source = TaskSource(setting, seed, data_root=data_root, arrays=arrays)
    seed_everything(seed)
    model = MLP(source.input_shape, hidden=setting.hidden, n_classes=source.n_out)
    loss_name = "mse" if setting.benchmark == "scr" else "ce"
    loss_fn = nn.MSELoss() if loss_name == "mse" else nn.CrossEntropyLoss()
    if setting.train_batch > 1 or setting.epochs_per_task > 1:
        learner = MinibatchLearner(model, setting.optimizer, setting.lr, loss_name, batch_size=setting.train_batch,
                                   epochs=setting.epochs_per_task, momentum=setting.momentum, seed=seed)
    else:
        learner = OnlineLearner(model, setting.optimizer, setting.lr, loss_name)
    checkpoints = []
    train_seconds = score_seconds = 0.0
    bar = tqdm(range(setting.n_tasks), desc=f"{setting.name} seed {seed}", disable=not progress, leave=False)
    for t in bar:
        x, y, _, _ = source.task(t)
        t0 = time.perf_counter()
        train_loss = learner.train(x, y)
        train_seconds += time.perf_counter() - t0
        if (t + 1) % setting.checkpoint_every:
            continue
        ckpt = learner.checkpoint()
        if checkpoint_dir is not None:
            torch.save(ckpt, f"{checkpoint_dir}/{setting.name.replace('/', '_')}_s{seed}_t{t + 1}.pt")
        scored = MLP(source.input_shape, hidden=setting.hidden, n_classes=source.n_out)
        scored.load_state_dict(ckpt["model"])
        t0 = time.perf_counter()
        rec = score_checkpoint(setting, scored, loss_fn, source.task(t + 1), seed=seed,
                               time_costs=(len(checkpoints) == 0),
                               optimizer_state=ckpt["optimizer"] if setting.optimizer == "adam" else None)
        rec["task_accuracy"] = getattr(learner, "last_accuracy", float("nan"))  # the decline curve
        score_seconds += time.perf_counter() - t0
        rec.update(tasks_trained=t + 1, target_task=t + 1, steps=ckpt["steps"], train_loss_last_task=train_loss)
        checkpoints.append(rec)
        bar.set_postfix(dead=sum(c["dead"] for c in checkpoints), loss=f"{train_loss:.3g}")
    return {"setting": setting.name, "benchmark": setting.benchmark, "seed": seed, "checkpoints": checkpoints,
            "train_seconds": train_seconds, "score_seconds": score_seconds,
            "steps_per_second": learner.steps / max(train_seconds, 1e-9)}
