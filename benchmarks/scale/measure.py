"""The child side of :mod:`benchmarks.scale`: one measurement = one job = one fresh process
(:func:`measure`; docs/benchmarks.md, "benchmarks.scale")."""

from __future__ import annotations

import copy
import importlib
import math
import resource
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

from avalanche_plugins.study.catalog.zoo import MLP, TinyViT, cifar_resnet
from avalanche_plugins.study.jobs import Timer, init_worker, seed_everything
from benchmarks.scale.runner import child_rss_gb, peak_rss_gb

__all__ = ["Config", "Job", "MODELS", "ESTIMATORS", "INFO", "measure", "middle_stage", "model_params", "rss_gb",
           "setting_for", "synthetic", "data_for"]

N_CLASSES = 100
INPUT_SHAPE = (3, 32, 32)
CIFAR_INPUT = ("CIFAR", INPUT_SHAPE, N_CLASSES)  # (data it is shaped as, input shape, classes) of a model
INPUTS = {"resnet18-mnist": ("MNIST", (1, 28, 28), 10)}  # ... where it is not CIFAR-100's
EPOCH_IMAGES = 5000  # one Split CIFAR-100 experience: the unit every ratio is expressed in
BATCH = 64


@dataclass(frozen=True)
class Config:
    """Sample counts and settings shared by every job of a run (part of each job's cache key)."""

    quick: bool = False
    threads: int = 1
    ref_images: int = 128  # images of the reference epoch timed in every process (per-image time)
    curvature_samples: int | None = None  # None: the library's DEFAULT_SAMPLES for the method
    hessian_samples: int = 32
    hessian_max_iter: int = 10
    hessian_max_params: int = 3_000_000
    fisher_samples: int = 32  # expected Fisher costs classes × samples backward passes
    readiness_samples: int = 256
    ads_samples: int = 64  # ArchitectureDrivenShiftMetric's default calibration_size (a test checks)
    anchors: int = 100
    gn_anchors: int = 100
    gn_iterations: int = 2
    masked_fraction: float = 0.5
    ewc_experiences: int = 3
    ewc_samples: int = 32
    penalty_reps: int = 20
    check_epoch_images: int = EPOCH_IMAGES


@dataclass(frozen=True)
class Job:
    model: str
    estimator: str
    seed: int
    config: Config


def _mlp(width):
    return lambda: MLP(INPUT_SHAPE, hidden=(width, width), n_classes=N_CLASSES)


def _vit(depth, dim):
    return lambda: TinyViT(image_size=32, patch=4, in_channels=3, n_classes=N_CLASSES, dim=dim, depth=depth, heads=4)


def _mnist_resnet18():
    """torchvision's ResNet-18 (7×7 stride-2 stem, max-pool), its stem taking 1 channel; 10 classes."""
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    return model


# name -> (family, builder)
MODELS: dict[str, tuple[str, object]] = {
    **{f"mlp-{w}": ("mlp", _mlp(w)) for w in (256, 512, 1024, 2048, 4096)},
    **{f"resnet{d}": ("resnet", (lambda d=d: cifar_resnet(d, N_CLASSES, 3))) for d in (8, 18, 34)},
    **{f"vit-d{d}-w{w}": ("vit", _vit(d, w)) for d, w in ((1, 64), (1, 128), (2, 64), (2, 128), (2, 256), (4, 128))},
    "resnet18-mnist": ("resnet-mnist", _mnist_resnet18),  # its own family: MNIST-shaped inputs (INPUTS)
}


def model_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def middle_stage(name: str) -> str:
    """Where the transport keys cut: the middle stage (``layer3`` of ResNet-18/34, as in issue 15).

    Example:
        >>> [middle_stage(m) for m in ("mlp-256", "resnet8", "resnet18", "vit-d4-w128")]
        ['features.1', 'layer2', 'layer3', 'blocks.1']
    """
    family = MODELS[name][0]
    if family == "mlp":
        return "features.1"  # after the first hidden layer
    if family.startswith("resnet"):
        return "layer2" if name == "resnet8" else "layer3"
    depth = int(name.split("-d")[1].split("-")[0])
    return f"blocks.{(depth - 1) // 2}"


def setting_for(job: Job) -> str:
    """What a measurement runs on, known before it runs (failed rows carry it too): its ``setting``
    in estimators.yaml, formatted with the run's config and the model's middle stage."""
    cfg, e = job.config, job.estimator
    samples = curvature_samples(e.split("_")[1], cfg) if e.startswith("curvature_") else None
    return INFO[e]["setting"].format(cfg=cfg, stage=middle_stage(job.model), samples=samples,
                                     percent=100 * cfg.masked_fraction)


def curvature_samples(method: str, cfg: Config) -> int:
    """Samples of a ``layer_curvature`` measurement: the library's default for the method (the
    adapters' ``DEFAULT_SAMPLES``), the exact Hessian capped at ``hessian_samples``."""
    from avalanche_plugins.layer_adaptive import DEFAULT_SAMPLES

    n = cfg.curvature_samples or DEFAULT_SAMPLES[method]
    return min(n, cfg.hessian_samples) if method == "hessian" else n


def synthetic(job: Job, n: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` standard-normal images of the job's model's input shape and uniform labels of its
    classes (CIFAR-100's unless ``INPUTS`` names the model), seeded with ``job.seed + offset``."""
    _, shape, classes = INPUTS.get(job.model, CIFAR_INPUT)
    g = torch.Generator().manual_seed(job.seed + offset)
    return torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g)


def data_for(models) -> dict:
    """``results.json``'s ``data``: the seeded tensors :func:`synthetic` draws for ``models``, per input kind."""
    kinds = [{"name": f"synthetic {name}-shaped tensors", "shape": list(shape), "classes": classes, "seeded": True}
             for name, shape, classes in dict.fromkeys(INPUTS.get(m, CIFAR_INPUT) for m in models)]
    return kinds[0] if len(kinds) == 1 else {"name": "synthetic tensors", "seeded": True, "inputs": kinds}


def rss_gb() -> float:
    """Current resident set size (``/proc/self/status``; the peak where that is unavailable)."""
    rss = child_rss_gb("self")
    return peak_rss_gb() if rss is None else rss


def train_images(model: nn.Module, x: torch.Tensor, y: torch.Tensor, masks=None) -> float:
    """Seconds of one SGD pass (lr 0.01, momentum 0.9, batch 64, train mode) over ``(x, y)``;
    ``masks`` (a ``UnitMasks``) steps the optimizer keeping masked units exact."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(xb), yb).backward()
        masks.step(opt) if masks is not None else opt.step()

    step(x[:8], y[:8])  # warm-up (allocator, first-call dispatch), not timed
    start = time.perf_counter()
    for s in range(0, x.shape[0], BATCH):
        step(x[s:s + BATCH], y[s:s + BATCH])
    return time.perf_counter() - start


def _epoch(images: str):
    def run(model, job):
        x, y = synthetic(job, getattr(job.config, images))
        return {"time_s": train_images(model, x, y), "images": x.shape[0]}
    return run


def _curvature(method):
    def run(model, job):
        from avalanche_plugins.layer_adaptive import layer_curvature

        cfg = job.config
        n = curvature_samples(method, cfg)
        extra = {"max_iter": cfg.hessian_max_iter} if method == "hessian" else {}
        x, y = synthetic(job, n)
        with Timer() as timer:
            spec = layer_curvature(model, nn.CrossEntropyLoss(), x, y, method=method, **extra)
        kappa = float(spec.kappa)
        return {"time_s": timer.seconds, "samples": n, "n_layers": len(spec.names), "note": "",
                "kappa": kappa if math.isfinite(kappa) else None}
    return run


def _on_synthetic(samples: str, module: str, function: str, *leading, **options):
    """Times ``avalanche_plugins.<module>.<function>(*leading, model, CrossEntropyLoss(), x, y,
    **options)`` on ``getattr(config, samples)`` synthetic images (imported in the child, as every
    estimator)."""
    def run(model, job):
        estimate = getattr(importlib.import_module(f"avalanche_plugins.{module}"), function)
        x, y = synthetic(job, getattr(job.config, samples))
        with Timer() as timer:
            estimate(*leading, model, nn.CrossEntropyLoss(), x, y, **options)
        return {"time_s": timer.seconds, "samples": x.shape[0]}
    return run


def run_ads(model, job):
    """What ``ArchitectureDrivenShiftMetric``'s defaults compute before an experience: ADS on the
    logit path with ``calibration_size`` old and new samples, SGD momentum folded into the step
    (``lr / (1 − μ)``), one epoch of 5,000 images in steps, then the old set's logits."""
    from avalanche_plugins.ads import architecture_driven_shift, model_outputs

    n = job.config.ads_samples
    old_x, _ = synthetic(job, n, 1)
    new_x, new_y = synthetic(job, n, 2)
    steps = math.ceil(EPOCH_IMAGES / BATCH)
    with Timer() as timer:
        architecture_driven_shift(model, nn.CrossEntropyLoss(), old_x, new_x, new_y, lr=0.01 / (1 - 0.9),
                                  steps=steps, optimizer="sgd", path="logit")
        model_outputs(model, old_x, None, 1024)
    return {"time_s": timer.seconds, "samples": 2 * n}


def _stage_pair(model, job, anchors: int):
    """θ_A (the model) and θ_AB (a copy with seeded 1 % weight noise), both in eval mode, the
    middle stage and ``anchors`` seeded anchor images."""
    drifted = copy.deepcopy(model)
    g = torch.Generator().manual_seed(job.seed + 3)
    with torch.no_grad():
        for p in drifted.parameters():
            p.add_(0.01 * p.std().nan_to_num(0.0) * torch.randn(p.shape, generator=g))
    anchor_images, _ = synthetic(job, anchors, 4)
    return model.eval(), drifted.eval(), middle_stage(job.model), anchor_images


def _transport(family):
    def run(model, job):
        from avalanche_plugins.transport import fit_transport_key, stage_activations

        theta_a, theta_ab, stage, xa = _stage_pair(model, job, job.config.anchors)
        with Timer() as total:
            with torch.no_grad():
                u, v = stage_activations(theta_ab, stage, xa), stage_activations(theta_a, stage, xa)
            with Timer() as fit:
                fit_transport_key(u, v, family)
        return {"time_s": total.seconds, "fit_s": fit.seconds, "samples": xa.shape[0]}
    return run


def run_gauss_newton(model, job):
    from avalanche_plugins.transport import (
        fit_transport_key,
        gauss_newton_key,
        stage_activations,
        stitch,
    )

    cfg = job.config
    theta_a, theta_ab, stage, xa = _stage_pair(model, job, cfg.gn_anchors)
    with torch.no_grad():
        key = fit_transport_key(stage_activations(theta_ab, stage, xa), stage_activations(theta_a, stage, xa),
                                "cross_channel")
    stitched = stitch(theta_ab, theta_a, stage, key)
    with Timer() as timer:
        gauss_newton_key(key, stitched, xa, iterations=cfg.gn_iterations)
    return {"time_s": timer.seconds, "samples": xa.shape[0]}


def run_unit_masks(model, job):
    from avalanche_plugins.structural import UnitMasks

    x, _ = synthetic(job, 2)
    with Timer() as timer:
        masks = UnitMasks(model, x)
    return {"time_s": timer.seconds, "n_layers": len(masks.names)}


def run_masked_epoch(model, job):
    """One epoch of ``ref_images`` images with a seeded random ``masked_fraction`` of every maskable
    layer's units off (``UnitMasks.step`` keeps them exact); ``measure`` divides by the dense
    reference epoch timed after it in the same process."""
    from avalanche_plugins.structural import UnitMasks

    cfg = job.config
    x, y = synthetic(job, cfg.ref_images)
    masks = UnitMasks(model, x[:2])
    g = torch.Generator().manual_seed(job.seed + 5)
    masks.set_masks({name: torch.randperm(n, generator=g) >= round(cfg.masked_fraction * n)
                     for name, n in masks.sizes().items()})
    return {"time_s": train_images(model, x, y, masks=masks), "images": x.shape[0],
            "compactness": masks.compactness()}


def run_ewc_penalty(model, job):
    """Median time of one penalty forward + backward, LayerAdaptiveEWC (defaults) vs Avalanche's
    ``EWCPlugin``, both after the same ``ewc_experiences`` experiences of a real ``Naive``
    strategy (each plugin computed its own importances)."""
    from avalanche.benchmarks import tensors_benchmark
    from avalanche.training.plugins import EWCPlugin
    from avalanche.training.supervised import Naive

    from avalanche_plugins import LayerAdaptiveEWCPlugin, quiet_evaluator

    cfg = job.config
    data = [list(synthetic(job, cfg.ewc_samples, 10 + e)) for e in range(cfg.ewc_experiences)]
    bench = tensors_benchmark(train_tensors=data, test_tensors=data, task_labels=[0] * cfg.ewc_experiences)
    ewc, lae = EWCPlugin(ewc_lambda=1.0), LayerAdaptiveEWCPlugin(1.0)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=cfg.ewc_samples, train_epochs=1,
                     device="cpu", plugins=[ewc, lae], evaluator=quiet_evaluator())
    for experience in bench.train_stream:
        strategy.train(experience, num_workers=0)
    ewc_s, lae_s = penalty_times(model, ewc, lae, anchors=cfg.ewc_experiences, repetitions=cfg.penalty_reps)
    return {"time_s": lae_s, "penalty_ms_lae": 1e3 * lae_s, "penalty_ms_ewc": 1e3 * ewc_s,
            "lae_over_ewc": lae_s / ewc_s}


def penalty_times(model, ewc, lae, *, anchors: int, repetitions: int) -> tuple[float, float]:
    """Median seconds of the penalty's forward + backward alone, ``(ewc, lae)``, each plugin
    holding ``anchors`` experiences, timed alternately ``repetitions`` times on ``model``."""
    times = {"ewc": [], "lae": []}
    for _ in range(repetitions):
        for name, plugin in (("ewc", ewc), ("lae", lae)):
            fake = types.SimpleNamespace(clock=types.SimpleNamespace(train_exp_counter=anchors),
                                         model=model, device="cpu", loss=torch.zeros(1, requires_grad=True) * 1.0)
            start = time.perf_counter()
            plugin.before_backward(fake)
            fake.loss.sum().backward()
            times[name].append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
    return float(np.median(times["ewc"])), float(np.median(times["lae"]))


# name -> function(model, job) -> row fields, "time_s" the timed part (what each is: estimators.yaml)
ESTIMATORS: dict[str, object] = {
    "epoch": _epoch("ref_images"),
    "epoch_5000": _epoch("check_epoch_images"),
    "curvature_fisher": _curvature("fisher"),
    "curvature_hessian": _curvature("hessian"),
    "fisher_expected": _on_synthetic("fisher_samples", "layer_adaptive", "fisher_diagonal", "expected"),
    "fisher_empirical": _on_synthetic("fisher_samples", "layer_adaptive", "fisher_diagonal", "empirical"),
    "readiness_sampled": _on_synthetic("readiness_samples", "readiness", "optimization_readiness", estimator="sampled"),
    "readiness_per_sample": _on_synthetic("readiness_samples", "readiness", "optimization_readiness",
                                          estimator="per_sample"),
    "ads": run_ads,
    "key_channel": _transport("channel"),
    "key_cross_channel": _transport("cross_channel"),
    "gauss_newton_key": run_gauss_newton,
    "unit_masks": run_unit_masks,
    "masked_epoch": run_masked_epoch,
    "ewc_penalty": run_ewc_penalty,
}
INFO: dict[str, dict] = yaml.safe_load(Path(__file__).with_name("estimators.yaml").read_text(encoding="utf-8"))


def measure(job: Job, report=None) -> dict:
    """One measurement (run in its own process by :class:`benchmarks.scale.runner.ProcessExecutor`).

    ``report(dict)`` receives what is known before the estimator runs (model size, memory before),
    so a measurement that is killed still has them. Returns the row."""
    init_worker(job.config.threads, job.seed)
    family, build = MODELS[job.model]
    fn, what = ESTIMATORS[job.estimator], INFO[job.estimator]["what"]
    rss_base = rss_gb()
    model = build()
    row = {"model": job.model, "family": family, "params": model_params(model), "estimator": job.estimator,
           "what": what, "setting": setting_for(job), "seed": job.seed, "threads": job.config.threads,
           "rss_base_gb": rss_base}
    with torch.no_grad():
        model.eval()(torch.zeros_like(synthetic(job, 2)[0]))  # first-call overheads out of the timing
    row["rss_before_gb"] = rss_gb()
    if report is not None:
        report(dict(row))
    out = fn(model, job)
    row["peak_rss_gb"] = peak_rss_gb()
    row.update(out)
    ref = out
    if job.estimator != "epoch":  # the reference epoch, in this process, after the estimator
        seed_everything(job.seed)
        ref = ESTIMATORS["epoch"](build(), job)
    row["ref_s_per_image"] = ref["time_s"] / ref["images"]
    row["epoch5000_s"] = EPOCH_IMAGES * row["ref_s_per_image"]
    if job.estimator == "epoch":  # the row stands for the 5,000-image epoch; measured_s is what ran
        row["measured_s"], row["time_s"] = row["time_s"], row["epoch5000_s"]
    row["ratio"] = row["time_s"] / row["epoch5000_s"]
    if job.estimator in ("masked_epoch", "epoch_5000"):  # per image, over the dense reference's
        row["over_dense"] = (row["time_s"] / row["images"]) / row["ref_s_per_image"]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    row["cpu_s"] = usage.ru_utime + usage.ru_stime  # the whole process: wall time on an idle machine
    row["status"] = "ok"
    return row
