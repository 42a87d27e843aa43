"""LayerAdaptiveEWC in your own Avalanche run: Naive + the plugin, a schedule, and what it measured.

Task-incremental Split digits (scikit-learn's bundled 8×8 images, 5 tasks of 2 classes, nothing
downloaded), a multi-head MLP, plain Naive against LayerAdaptiveEWCPlugin with two λ_ℓ schedules:
``geometric`` (λ_ℓ = λ·α^-(ℓ-1), fixed in advance) and ``smoothed`` (a geometric fit of the measured
per-layer curvature s_ℓ). Prints final accuracy and the profile each plugin kept for the last
experience: λ_ℓ, and for ``smoothed`` s_ℓ, κ = max s / min s and the fitted ratio α̂. Naive forgets
little on this small stream, so expect close accuracies; ``python -m benchmarks.layer_adaptive_ewc``
is the tuned comparison. About 10 s (``--quick``: 3 tasks, ``geometric`` only, 4 s) on 2 CPU cores,
after the imports.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from avalanche.benchmarks import nc_benchmark
from avalanche.models import MultiHeadClassifier, MultiTaskModule
from avalanche.training.supervised import Naive
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

from avalanche_plugins import LayerAdaptiveEWCPlugin, quiet_evaluator, stream_accuracy


def split_digits(seed: int = 0):
    """5 tasks of 2 digit classes, labels 0/1 within each task (standardised 8×8 images)."""
    digits = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(digits.images, digits.target, test_size=0.25,
                                              stratify=digits.target, random_state=seed)
    mean, std = x_tr.mean(), x_tr.std()  # training statistics only
    data = [TensorDataset(torch.tensor((x - mean) / std, dtype=torch.float32).unsqueeze(1), torch.tensor(y))
            for x, y in ((x_tr, y_tr), (x_te, y_te))]
    return nc_benchmark(*data, n_experiences=5, task_labels=True, class_ids_from_zero_in_each_exp=True, seed=seed)


class MultiHeadMLP(MultiTaskModule):
    """A shared trunk and one 2-way head per task (Avalanche adds a head when a task arrives)."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = MultiHeadClassifier(64, initial_out_features=2)

    def forward_single_task(self, x, task_label):
        return self.head(self.trunk(x), task_label)


def train(benchmark, n_tasks: int, plugin=None, seed: int = 0) -> float:
    torch.manual_seed(seed)  # after nc_benchmark, which reseeds torch's global RNG
    model = MultiHeadMLP()
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=3,
                     plugins=[plugin] if plugin else [], evaluator=quiet_evaluator())  # no logging here
    for experience in benchmark.train_stream[:n_tasks]:
        strategy.train(experience)
    return stream_accuracy(strategy, benchmark.test_stream[:n_tasks])  # accuracy over every task seen


def main(quick: bool = False, out_dir="out/examples/01") -> dict:
    benchmark, n_tasks = split_digits(), 3 if quick else 5
    plugins = {"geometric": LayerAdaptiveEWCPlugin(ewc_lambda=100.0, schedule="geometric", alpha=2.0)}
    if not quick:  # "smoothed" measures s_ℓ after every experience (per-sample gradients of 64 samples)
        plugins["smoothed"] = LayerAdaptiveEWCPlugin(ewc_lambda=100.0, schedule="smoothed")
    results = {"naive": {"accuracy": train(benchmark, n_tasks)}}
    print(f"final accuracy over {n_tasks} tasks\n  naive      {results['naive']['accuracy']:.3f}")
    for name, plugin in plugins.items():
        accuracy = train(benchmark, n_tasks, plugin)
        last = plugin.profiles[-1]  # one EWCProfile per experience
        results[name] = {"accuracy": accuracy, **{k: getattr(last, k) for k in
                                                  ("layer_names", "lambdas", "spectrum", "kappa", "alpha_hat")}}
        print(f"  {name:<10} {accuracy:.3f}   λ_ℓ = {[round(v, 1) for v in last.lambdas]} on {last.layer_names}")
        if last.spectrum is not None:  # measured by "measured"/"smoothed" (or any schedule with log_profile=True)
            print(f"  {'':<16} s_ℓ = {[round(s, 2) for s in last.spectrum]}, κ = {last.kappa:.2f}, "
                  f"α̂ = {last.alpha_hat:.2f}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"written: {out / 'results.json'}")
    return results


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and kind to a shared machine
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 tasks, one schedule (seconds)")
    parser.add_argument("--out", default="out/examples/01", help="folder for results.json")
    args = parser.parse_args()
    main(quick=args.quick, out_dir=args.out)
