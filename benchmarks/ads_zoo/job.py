"""One job: train an architecture on the old task, predict its shift (ADS and the naive
predictors), train it on the new task and measure the realised shift and calibration; and the old
and new task of each scenario as tensors (the task source of a job)."""

from __future__ import annotations

import copy
import functools
import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from avalanche_plugins.ads import architecture_driven_shift, distance_path, logit_shift
from avalanche_plugins.core.stats import expected_calibration_error
from avalanche_plugins.study.catalog import datasets
from avalanche_plugins.study.jobs import Timer, seed_everything
from benchmarks._training import accuracy, train_minibatches
from benchmarks.ads_zoo.settings import SCENARIOS, ScenarioConfig
from benchmarks.ads_zoo.zoo import Arch, build_arch

LOADERS = {name: datasets.CATALOG[name.partition("_")[2]].arrays for name in SCENARIOS}  # scenario -> arrays


@functools.cache
def scenario_data(name: str, data_root, seed: int = 0) -> dict:
    """Old/new training tensors and old test tensors of a scenario (cached per process)."""
    if name not in LOADERS:
        raise ValueError(f"scenario must be one of {SCENARIOS}, got {name!r}")
    xtr, ytr, xte, yte = LOADERS[name](data_root)
    if name == "permuted_mnist":
        perm = torch.randperm(xtr[0].numel(), generator=torch.Generator().manual_seed(seed))
        new_x = xtr.reshape(len(xtr), -1)[:, perm].reshape(xtr.shape)
        data = {"old": (xtr, ytr), "new": (new_x, ytr), "old_test": (xte, yte)}
    else:
        old, new, old_test = ytr < 5, ytr >= 5, yte < 5
        data = {"old": (xtr[old], ytr[old]), "new": (xtr[new], ytr[new]), "old_test": (xte[old_test], yte[old_test])}
    data["input_shape"] = tuple(xtr.shape[1:])
    return data


def subset(x, y, n, generator):
    """At most ``n`` random rows of ``(x, y)`` drawn with ``generator`` (all of them, undrawn, if fewer)."""
    if len(x) <= n:
        return x, y
    idx = torch.randperm(len(x), generator=generator)[:n]
    return x[idx], y[idx]


@dataclass(frozen=True)
class Job:
    scenario: str
    arch: Arch
    seed: int
    config: ScenarioConfig
    data_root: str | None = None


def _samples(data: dict, cfg, g: torch.Generator):
    """The job's train / old-task test / calibration subsets, drawn from ``g`` in this order."""
    old_x, old_y = subset(*data["old"], cfg.max_train, g)
    new_x, new_y = subset(*data["new"], cfg.max_train, g)
    test = subset(*data["old_test"], cfg.max_test, g)
    cal_old = old_x[torch.randperm(len(old_x), generator=g)[:cfg.calibration]]
    cal_idx = torch.randperm(len(new_x), generator=g)[:cfg.calibration]
    return (old_x, old_y), (new_x, new_y), test, cal_old, (new_x[cal_idx], new_y[cal_idx])


def run_job(job: Job) -> dict:
    """Train on the old task, compute ADS and the naive predictors, train on the new task, measure."""
    cfg = job.config
    data = scenario_data(job.scenario, job.data_root)
    seed_everything(job.seed)
    g = torch.Generator().manual_seed(job.seed)
    (old_x, old_y), (new_x, new_y), (test_x, test_y), cal_old, (cal_new_x, cal_new_y) = _samples(data, cfg, g)
    model = build_arch(job.arch, data["input_shape"])
    row = {"scenario": job.scenario, "arch": job.arch.name, "family": job.arch.family, "design": job.arch.design,
           "seed": job.seed, "n_params": sum(p.numel() for p in model.parameters())}
    with Timer() as t_old:
        train_minibatches(model, old_x, old_y, epochs=cfg.old_epochs, lr=cfg.old_lr, batch_size=cfg.batch_size,
                          optimizer="adam", generator=g)
    steps = cfg.new_epochs * math.ceil(len(new_x) / cfg.batch_size)
    loss_fn = nn.CrossEntropyLoss()
    cpu_ads = time.process_time()
    with Timer() as t_ads:  # the logit path; the loss and budget paths differ only in P (same terms)
        res = architecture_driven_shift(model, loss_fn, cal_old, cal_new_x, cal_new_y, lr=cfg.new_lr, steps=steps,
                                        path="logit")
    cpu_ads = time.process_time() - cpu_ads
    budget = cfg.new_lr * steps
    loss_path = distance_path(res.new_loss, res.descent_rate, budget)
    with Timer() as t_probe:
        probe = architecture_driven_shift(model, loss_fn, cal_old, cal_new_x, cal_new_y, lr=cfg.new_lr,
                                          steps=steps, path="probe", probe_steps=10)
    with Timer() as t_first:
        stepped = copy.deepcopy(model)
        train_minibatches(stepped, cal_new_x, cal_new_y, epochs=1, lr=cfg.new_lr, batch_size=len(cal_new_x),
                          optimizer="sgd", generator=torch.Generator().manual_seed(0))
        first_step = logit_shift(model, stepped, cal_old)
    with torch.no_grad():
        logits_before = model(test_x)
    before = copy.deepcopy(model)
    cpu_truth = time.process_time()
    with Timer() as t_truth:
        train_minibatches(model, new_x, new_y, epochs=cfg.new_epochs, lr=cfg.new_lr, batch_size=cfg.batch_size,
                          optimizer="sgd", generator=g)
        shift = logit_shift(before, model, test_x)
    cpu_truth = time.process_time() - cpu_truth
    with torch.no_grad():
        logits_after = model(test_x)
    finite = math.isfinite(shift)
    row.update(
        ads_logit=res.ads, ads=budget * res.unit_shift, ads_loss=loss_path * res.unit_shift,
        first_order_logit=res.path_factor * res.first_order_shift, first_order_loss=loss_path * res.first_order_shift,
        ads_probe=probe.ads, first_step=first_step, realised_shift=shift if finite else None,
        diverged=not finite, decay=probe.decay, path_factor=budget, loss_path_factor=loss_path,
        logit_path_factor=res.path_factor, new_logit_speed=res.new_first_order_shift, descent_rate=res.descent_rate,
        new_loss=res.new_loss, grad_norm=res.grad_norm, layer_names=res.layer_names,
        architecture_terms=res.architecture_terms, data_terms=res.data_terms, steps=steps,
        acc_old_before=accuracy(logits_before, test_y), acc_old_after=accuracy(logits_after, test_y) if finite else None,
        ece_before=expected_calibration_error(logits_before, test_y),
        ece_after=expected_calibration_error(logits_after, test_y) if finite else None,
        old_train_s=t_old.seconds, ads_s=t_ads.seconds, ads_probe_s=t_probe.seconds, first_step_s=t_first.seconds,
        truth_s=t_truth.seconds, time_ratio=t_ads.seconds / t_truth.seconds,
        ads_cpu_s=cpu_ads, truth_cpu_s=cpu_truth, n_old_train=len(old_x), n_new_train=len(new_x),
        n_old_test=len(test_x),
    )
    return row


def warmup() -> None:
    """A worker's first ``torch.func`` calls (a one-off setup cost), outside any job's timings."""
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(4, 4)
    for path in ("logit", "probe"):
        architecture_driven_shift(net, nn.CrossEntropyLoss(), x, x, torch.tensor([0, 1, 0, 1]), lr=0.1,
                                  steps=2, path=path, probe_steps=2)
