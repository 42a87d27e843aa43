"""Every diagnostic of the package in one Avalanche run, into TensorBoard and a tidy CSV.

One EvaluationPlugin carries Avalanche's accuracy / loss / forgetting and all five diagnostics:
layer sensitivity (s_ℓ, κ, α̂), Optimization Readiness, Architecture-Driven Shift (predicted vs
realised), transport keys (task A's stitched accuracy) and Grow's cycle accuracy / newborn-unit
gradients. Its loggers are Avalanche's TensorboardLogger (scalars, per-layer dicts as one scalar
each, figures as images) and TidyCSVLogger (one row per value: phase, stream, training experience,
experience, metric, key, value, step; figures as PNG files), so a figure or a table is one
``pandas.read_csv`` away. Stream: class-incremental Split digits (scikit-learn's 8×8 images;
nothing downloaded), a small CNN grown from 30 % to 60 % of its channels. The script reads both
outputs back and prints which metrics each holds. ``tensorboard --logdir out/examples/06/tb`` shows
them. About 20 s (``--quick``: 3 experiences, 11 s) on 2 CPU cores, after the
imports.
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter, OrderedDict
from pathlib import Path

import torch
from avalanche.benchmarks import nc_benchmark
from avalanche.evaluation.metrics import accuracy_metrics, forgetting_metrics, loss_metrics
from avalanche.logging import TensorboardLogger
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.supervised import Naive
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import TensorDataset

from avalanche_plugins import (
    ArchitectureDrivenShiftMetric,
    CycleAccuracyMetric,
    GrowPlugin,
    LayerSensitivityMetric,
    NewbornGradientMetric,
    OptimizationReadinessMetric,
    TidyCSVLogger,
    TransportKeyMetric,
)


def split_digits(seed: int = 0):
    """5 experiences of 2 digit classes, one shared 10-way head (standardised 8×8 images)."""
    digits = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(digits.images, digits.target, test_size=0.25,
                                              stratify=digits.target, random_state=seed)
    mean, std = x_tr.mean(), x_tr.std()  # training statistics only
    data = [TensorDataset(torch.tensor((x - mean) / std, dtype=torch.float32).unsqueeze(1), torch.tensor(y))
            for x, y in ((x_tr, y_tr), (x_te, y_te))]
    return nc_benchmark(*data, n_experiences=5, task_labels=False, seed=seed)


def main(quick: bool = False, out_dir="out/examples/06") -> dict:
    out = Path(out_dir)
    benchmark, n_experiences = split_digits(), 3 if quick else 5
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(
        block1=nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()),
        block2=nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2)),
        pool=nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), head=nn.Linear(32, 10)))
    grow = GrowPlugin(0.6, seed_compactness=0.3, grow_fraction_per_cycle=0.15, track_newborn=True)
    tensorboard = TensorboardLogger(tb_log_dir=str(out / "tb"))
    tidy = TidyCSVLogger(out / "metrics.csv", context={"example": "06", "seed": 0})  # fixed leading columns
    evaluator = EvaluationPlugin(
        accuracy_metrics(experience=True, stream=True), loss_metrics(stream=True), forgetting_metrics(experience=True),
        LayerSensitivityMetric(),                                    # s_ℓ, κ, α̂ after each experience
        OptimizationReadinessMetric(n_samples=256),                  # OR before each experience
        ArchitectureDrivenShiftMetric(calibration_size=32),          # predicted, then realised shift
        TransportKeyMetric(stages=["block1", "block2"], experiences=[0], controls=False),
        CycleAccuracyMetric(benchmark.test_stream, epochs_per_cycle=1), NewbornGradientMetric(grow),
        loggers=[tensorboard, tidy])
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1 if quick else 2,
                     plugins=[grow], evaluator=evaluator)
    for experience in benchmark.train_stream[:n_experiences]:
        strategy.train(experience)
        strategy.eval(benchmark.test_stream[:n_experiences])
    tensorboard.writer.close()  # flush the event file
    tidy.close()

    # read back what TensorBoard will show (every event: size_guidance 0 keeps them all)
    events = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0, "images": 0}).Reload()
    tb_values = Counter()  # metric name -> values logged (a dict value counts once per key)
    for kind, read in (("scalars", events.Scalars), ("images", events.Images)):
        for tag in events.Tags()[kind]:
            tb_values[tag.split("/")[0]] += len(read(tag))
    with open(out / "metrics.csv", newline="") as f:
        csv_rows = Counter(row["metric"] for row in csv.DictReader(f))
    print(f"{'metric':<26} {'TensorBoard values':>18} {'CSV rows':>9}")
    for metric in sorted(set(tb_values) | set(csv_rows)):
        print(f"{metric:<26} {tb_values[metric]:>18} {csv_rows[metric]:>9}")
    print(f"written: {out / 'tb'} (tensorboard --logdir {out / 'tb'}) and {out / 'metrics.csv'}")
    return {"tensorboard_values": dict(tb_values), "csv_rows": dict(csv_rows)}


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and kind to a shared machine
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 experiences, 1 epoch each (seconds)")
    parser.add_argument("--out", default="out/examples/06", help="folder for tb/ and metrics.csv")
    args = parser.parse_args()
    main(quick=args.quick, out_dir=args.out)
