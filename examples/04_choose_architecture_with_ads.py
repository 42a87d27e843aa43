"""Choosing among candidate architectures with Architecture-Driven Shift (ADS), then checking the choice.

You have trained the first task and must pick a model for a stream. ADS predicts, before any
training on the next task, how far each candidate's old-task logits will move when it learns that
task (from the architecture's fan-ins and one JVP per layer on 32 old and 32 new samples), so the
candidates can be ranked by predicted forgetting pressure at the cost of a few forward passes. The
script then trains every candidate on the next task anyway and compares the ranking with the
realised shift (Spearman). Stream: class-incremental Split digits (scikit-learn's 8×8 images, first
two experiences; nothing downloaded); candidates: MLPs of different widths and depths, plain SGD.
About 10 s (``--quick``: 4 candidates, 7 s) on 2 CPU cores, after the imports.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from pathlib import Path

import torch
from avalanche.benchmarks import nc_benchmark
from avalanche.training.supervised import Naive
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from avalanche_plugins import quiet_evaluator
from avalanche_plugins.ads import architecture_driven_shift, logit_shift
from avalanche_plugins.core.stats import spearman

LR, BATCH, EPOCHS = 0.05, 32, 5  # one plain-SGD budget for both tasks


def split_digits(seed: int = 0):
    """5 experiences of 2 digit classes, one shared 10-way head (standardised 8×8 images)."""
    digits = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(digits.images, digits.target, test_size=0.25,
                                              stratify=digits.target, random_state=seed)
    mean, std = x_tr.mean(), x_tr.std()  # training statistics only
    data = [TensorDataset(torch.tensor((x - mean) / std, dtype=torch.float32).unsqueeze(1), torch.tensor(y))
            for x, y in ((x_tr, y_tr), (x_te, y_te))]
    return nc_benchmark(*data, n_experiences=5, task_labels=False, seed=seed)


def mlp(*widths: int) -> nn.Module:
    layers, n_in = [nn.Flatten()], 64
    for width in widths:
        layers += [nn.Linear(n_in, width), nn.ReLU()]
        n_in = width
    return nn.Sequential(*layers, nn.Linear(n_in, 10))


def tensors(experience, n=None):
    """(x, y) of an experience's dataset, the first ``n`` samples of a seeded shuffle."""
    x, y, _ = next(iter(DataLoader(experience.dataset, batch_size=len(experience.dataset))))
    keep = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))[:n]
    return x[keep], y[keep]


def main(quick: bool = False, out_dir="out/examples/04") -> dict:
    benchmark = split_digits()
    old, new = benchmark.train_stream[0], benchmark.train_stream[1]
    candidates = {"mlp-16": (16,), "mlp-256": (256,), "mlp-64x64": (64, 64), "mlp-32x32x32": (32, 32, 32)}
    if not quick:
        candidates |= {"mlp-64": (64,), "mlp-512": (512,), "mlp-256x256": (256, 256), "mlp-16x16x16": (16, 16, 16)}
    old_cal, (new_cal_x, new_cal_y) = tensors(old, 32)[0], tensors(new, 32)  # ADS's calibration samples
    old_test_x = tensors(benchmark.test_stream[0])[0]  # where the realised shift is measured
    steps = EPOCHS * math.ceil(len(new.dataset) / BATCH)  # SGD steps the next task will take
    predicted, realised = {}, {}
    for name, widths in candidates.items():
        torch.manual_seed(0)
        model = mlp(*widths)
        strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
                         criterion=nn.CrossEntropyLoss(), train_mb_size=BATCH, train_epochs=EPOCHS,
                         evaluator=quiet_evaluator())
        strategy.train(old)  # the first task: what you have when you choose
        ads = architecture_driven_shift(model, nn.CrossEntropyLoss(), old_cal, new_cal_x, new_cal_y,
                                        lr=LR, steps=steps, path="logit")  # no training on the new task
        predicted[name] = ads.ads
        before = copy.deepcopy(model)
        strategy.train(new)  # only to verify the prediction
        realised[name] = logit_shift(before, model, old_test_x)
    ranking = sorted(candidates, key=predicted.get)  # least predicted shift first
    rho = spearman([predicted[n] for n in candidates], [realised[n] for n in candidates])
    print(f"{'candidate':<14} {'predicted (ADS)':>15} {'realised shift':>14}")
    for name in ranking:
        print(f"{name:<14} {predicted[name]:>15.2f} {realised[name]:>14.2f}")
    print(f"choice: {ranking[0]};  Spearman(predicted, realised) over {len(ranking)} candidates: {rho:.2f}")
    result = {"ranking": ranking, "predicted": predicted, "realised": realised, "spearman": rho}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(f"written: {out / 'results.json'}")
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and kind to a shared machine
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 candidates (seconds)")
    parser.add_argument("--out", default="out/examples/04", help="folder for results.json")
    args = parser.parse_args()
    main(quick=args.quick, out_dir=args.out)
