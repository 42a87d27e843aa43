"""The benchmark's jobs (a run or a timing measurement) and the streams they train on."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace

import torch

from avalanche_plugins.study.catalog import datasets as data
from benchmarks.grow_prune.learner import run_one, time_per_epoch
from benchmarks.grow_prune.settings import Setting


@dataclass(frozen=True)
class Job:
    """One run (``kind="run"``) or the masked/dense timing of a setting (``kind="timing"``)."""

    kind: str
    setting: Setting
    method: str = ""
    c: float = 1.0
    seed: int = 0


@functools.lru_cache(maxsize=4)
def _stream(dataset: str, scenario: str, n_experiences: int, data_root, subset: int | None = None):
    if subset is None:
        return data.make_stream(dataset, scenario, n_experiences=n_experiences, data_root=data_root, seed=0)
    full = data.make_stream(dataset, "permuted" if scenario == "random_labels" else scenario, n_experiences=1,
                       data_root=data_root, seed=0)
    xtr, ytr, xte, yte = data.CATALOG[dataset].arrays(data_root)
    if scenario == "random_labels":
        return replace(full, benchmark=_random_label_benchmark(xtr[:subset], n_experiences),
                       description=f"random-label MNIST ({n_experiences} experiences, first {subset} train images)")
    arrays = (xtr[:subset], ytr[:subset], xte[:subset // 2], yte[:subset // 2])
    bench = data._from_arrays(arrays, scenario, n_experiences, False, 0)
    return replace(full, benchmark=bench, description=f"{scenario} {dataset} ({n_experiences} experiences, "
                                                      f"first {subset} train / {subset // 2} test images)")


def _random_label_benchmark(x: torch.Tensor, n_experiences: int):
    """Random-label MNIST: the same images with fresh labels per experience (docs, "Streams")."""
    from avalanche.benchmarks import tensors_benchmark

    g = torch.Generator().manual_seed(0)
    labels = [torch.randint(0, 10, (len(x),), generator=g) for _ in range(n_experiences)]
    return tensors_benchmark(train_tensors=[[x, y] for y in labels], test_tensors=[[x, y] for y in labels],
                             task_labels=[0] * n_experiences)


def run_job(job: Job) -> dict:
    setting = job.setting
    stream = _stream(setting.dataset, setting.scenario, setting.n_experiences, setting.data_root, setting.subset)
    if job.kind == "timing":
        dense_s = time_per_epoch(setting, stream, None)
        masked_s = time_per_epoch(setting, stream, job.c)
        print(f"{setting.name}: masked/dense time per epoch {masked_s / dense_s:.2f}", flush=True)
        return {"kind": "timing", "setting": setting.name, "dense_s_per_epoch": dense_s,
                "masked_s_per_epoch": masked_s, "masked_over_dense": masked_s / dense_s, "compactness": job.c}
    row = run_one(setting, stream, job.method, job.c, job.seed)
    row["config"] = asdict(setting)
    ticket = f" ticket {row['ticket_acc']:.3f}/{row['ticket_taa']:.3f}" if row["ticket_acc"] is not None else ""
    ratio = f" ratio {row['newborn_grad_ratio']:.2f}" if row["newborn_grad_ratio"] else ""
    print(f"{setting.name:<18} {job.method:<17} c={job.c:.2f} seed {job.seed}: ACC {row['acc']:.3f} "
          f"TAA {row['taa']:.3f}{ticket}{ratio} ({row['wall_s']:.1f}s)", flush=True)
    return row
