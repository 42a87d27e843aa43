"""Measuring latent knowledge with transport keys: is the first task forgotten, or only unreadable?

After a class-incremental run the first task's accuracy is near zero. TransportKeyMetric keeps a
snapshot of the model after that task (θ_A) and, whenever the task is evaluated later, fits a small
closed-form key (``channel``: a per-channel scale and shift; ``cross_channel``: a 1×1 linear map)
from the current model's activations at a stage to θ_A's, on 100 stored inputs, and evaluates
θ_A's later layers on the keyed current features. High stitched accuracy means the current early
layers still carry the task; recovery = (stitched − acc_AB) / (acc_A − acc_AB). The controls
(shuffled correspondences) show how much a key recovers without real shared structure. Stream:
class-incremental Split digits (scikit-learn's 8×8 images; nothing downloaded), a small CNN, Naive.
About 12 s (``--quick``: 3 experiences, 6 s) on 2 CPU cores, after the imports.
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from pathlib import Path

import torch
from avalanche.benchmarks import nc_benchmark
from avalanche.training.supervised import Naive
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

from avalanche_plugins import TransportKeyMetric, quiet_evaluator


def split_digits(seed: int = 0):
    """5 experiences of 2 digit classes, one shared 10-way head (standardised 8×8 images)."""
    digits = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(digits.images, digits.target, test_size=0.25,
                                              stratify=digits.target, random_state=seed)
    mean, std = x_tr.mean(), x_tr.std()  # training statistics only
    data = [TensorDataset(torch.tensor((x - mean) / std, dtype=torch.float32).unsqueeze(1), torch.tensor(y))
            for x, y in ((x_tr, y_tr), (x_te, y_te))]
    return nc_benchmark(*data, n_experiences=5, task_labels=False, seed=seed)


def small_cnn() -> nn.Module:
    """Named stages so the metric can cut the model there: block1 (8×8 maps), block2 (4×4)."""
    return nn.Sequential(OrderedDict(
        block1=nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()),
        block2=nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2)),
        pool=nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()),
        head=nn.Linear(32, 10)))


def main(quick: bool = False, out_dir="out/examples/05") -> dict:
    benchmark, n_experiences = split_digits(), 3 if quick else 5
    torch.manual_seed(0)
    model = small_cnn()
    keys = TransportKeyMetric(stages=["block1", "block2"], experiences=[0], n_anchors=100)  # only task A
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=3,
                     evaluator=quiet_evaluator(keys))
    for experience in benchmark.train_stream[:n_experiences]:
        strategy.train(experience)
        strategy.eval([benchmark.test_stream[0]])  # task A, evaluated after every later experience
    record = keys.history[-1]  # the last evaluation: task A after all the later training
    print(f"task A after {record['after'] + 1} experiences: acc_A (θ_A) {record['acc_checkpoint']:.3f}, "
          f"acc_AB (current model) {record['acc_updated']:.3f}")
    print(f"{'stage':<7} {'key':<14} {'control':<21} {'stitched acc':>12} {'recovery':>9}")
    for name, accuracy in record["acc"].items():
        part = dict(p.split("=") for p in name.split("/"))  # "stage=block1/family=channel[/control=...]"
        print(f"{part['stage']:<7} {part['family']:<14} {part.get('control', '-'):<21} {accuracy:>12.3f} "
              f"{record['recovery'][name]:>9.2f}")
    result = {k: record[k] for k in ("after", "acc_checkpoint", "acc_updated", "acc", "recovery")}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(f"written: {out / 'results.json'}")
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and kind to a shared machine
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 experiences (seconds)")
    parser.add_argument("--out", default="out/examples/05", help="folder for results.json")
    args = parser.parse_args()
    main(quick=args.quick, out_dir=args.out)
