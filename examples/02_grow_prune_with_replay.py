"""Grow / Prune next to Replay: structural plasticity as one more plugin in the list.

Class-incremental Split digits (scikit-learn's 8×8 images, 5 experiences of 2 classes, nothing
downloaded), an MLP, Avalanche's ReplayPlugin in every run, and three ways to use the hidden units:
all of them (dense), PrunePlugin (start dense, remove 20 % of the active units per cycle with
rewinding, down to half) and GrowPlugin (start from a random 20 %, recruit the units that would fire
most, up to half). A cycle is one training epoch. CycleAccuracyMetric gives the accuracy on the
classes seen so far at the end of every cycle and its trajectory average (TAA). Prints final
accuracy, TAA and the fraction of hidden units in use. About 14 s (``--quick``: 5 s) on
2 CPU cores, after the imports.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch
from avalanche.benchmarks import nc_benchmark
from avalanche.training.plugins import ReplayPlugin
from avalanche.training.supervised import Naive
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

from avalanche_plugins import CycleAccuracyMetric, GrowPlugin, PrunePlugin, quiet_evaluator


def split_digits(seed: int = 0):
    """5 experiences of 2 digit classes, one shared 10-way head (standardised 8×8 images)."""
    digits = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(digits.images, digits.target, test_size=0.25,
                                              stratify=digits.target, random_state=seed)
    mean, std = x_tr.mean(), x_tr.std()  # training statistics only
    data = [TensorDataset(torch.tensor((x - mean) / std, dtype=torch.float32).unsqueeze(1), torch.tensor(y))
            for x, y in ((x_tr, y_tr), (x_te, y_te))]
    return nc_benchmark(*data, n_experiences=5, task_labels=False, seed=seed)


def train(benchmark, structural, epochs: int, seed: int = 0) -> dict:
    torch.manual_seed(seed)  # after nc_benchmark, which reseeds torch's global RNG
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 10))  # the head is never masked; the two hidden layers are
    cycles = CycleAccuracyMetric(benchmark.test_stream, epochs_per_cycle=1)  # same cycle as the plugins
    plugins = [ReplayPlugin(mem_size=100)] + ([structural] if structural else [])
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=epochs,
                     plugins=plugins, evaluator=quiet_evaluator(cycles))
    for experience in benchmark.train_stream:
        strategy.train(experience)
    in_use = structural.masks.compactness() if structural else 1.0  # fraction of hidden units active
    return {"accuracy": cycles.result(), "taa": cycles.taa, "units_in_use": in_use, "cycles": len(cycles.history)}


def main(quick: bool = False, out_dir="out/examples/02") -> dict:
    benchmark, epochs = split_digits(), 1 if quick else 3
    runs = {  # a fresh plugin per run: plugins keep their masks
        "dense": lambda: None,
        "prune": lambda: PrunePlugin(0.5, prune_fraction_per_cycle=0.2, epochs_per_cycle=1, rewind_to="init"),
        "grow": lambda: GrowPlugin(0.5, seed_compactness=0.2, grow_fraction_per_cycle=0.1, epochs_per_cycle=1,
                                   outgoing="zero"),  # newborn units start with zero outgoing weights
    }
    results = {name: train(benchmark, make(), epochs) for name, make in runs.items()}
    print(f"Split digits + Replay(100), {epochs} epoch(s) per experience")
    print(f"  {'run':<6} {'final acc':>9} {'TAA':>6} {'units in use':>12}")
    for name, r in results.items():
        print(f"  {name:<6} {r['accuracy']:>9.3f} {r['taa']:>6.3f} {r['units_in_use']:>12.2f}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"written: {out / 'results.json'}")
    return results


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and kind to a shared machine
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # Avalanche 0.6's ReplayPlugin warns on itself
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one epoch per experience (seconds)")
    parser.add_argument("--out", default="out/examples/02", help="folder for results.json")
    args = parser.parse_args()
    main(quick=args.quick, out_dir=args.out)
