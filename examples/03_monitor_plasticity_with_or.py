"""Monitoring plasticity with Optimization Readiness (OR) across a stream.

Before each experience is trained, OptimizationReadinessMetric scores how ready the current
checkpoint is to learn it: OR = S·R, with strength S = ‖g‖²/L (how steep the new task's loss is)
and reliability R = ‖g‖²/E‖ĝ_B‖² (how much minibatch gradients agree). It never changes the run.
With ``ground_truth_k`` it also measures the plasticity OR predicts, G^(k): the relative loss drop
after k SGD steps on the incoming data (on a functional copy of the model), so you can see whether
OR tracks it. Stream: Permuted digits (scikit-learn's 8×8 images; every experience is all 10
classes under a new fixed pixel permutation; nothing downloaded), a plain MLP trained with Naive.
Prints OR, S, R and G^(k) per experience and their Spearman correlation over the stream.
About 10 s (``--quick``: 4 experiences, 4 s) on 2 CPU cores, after the imports.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from avalanche.benchmarks import tensors_benchmark
from avalanche.training.supervised import Naive
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from avalanche_plugins import OptimizationReadinessMetric, quiet_evaluator, stream_accuracy
from avalanche_plugins.core.stats import spearman


def permuted_digits(n_experiences: int, seed: int = 0):
    """All 10 digit classes per experience, pixels shuffled by a fixed permutation per experience
    (the first unpermuted); flat standardised 64-pixel inputs."""
    digits = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(digits.data, digits.target, test_size=0.25,
                                              stratify=digits.target, random_state=seed)
    mean, std = x_tr.mean(), x_tr.std()  # training statistics only
    g = torch.Generator().manual_seed(seed)
    perms = [torch.arange(64)] + [torch.randperm(64, generator=g) for _ in range(n_experiences - 1)]

    def experiences(x, y):
        x = torch.tensor((x - mean) / std, dtype=torch.float32)
        return [(x[:, p], torch.tensor(y)) for p in perms]

    return tensors_benchmark(experiences(x_tr, y_tr), experiences(x_te, y_te), task_labels=[0] * n_experiences)


def main(quick: bool = False, out_dir="out/examples/03") -> dict:
    n_experiences = 4 if quick else 8
    benchmark = permuted_digits(n_experiences)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    readiness = OptimizationReadinessMetric(n_samples=512, ground_truth_k=10, ground_truth_lr=0.05,
                                            ground_truth_runs=8, seed=0)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1,
                     evaluator=quiet_evaluator(readiness))
    accuracy = []  # on the experience just trained: what the readiness was for
    for experience, test in zip(benchmark.train_stream, benchmark.test_stream):
        strategy.train(experience)  # OR of the incoming experience is measured first
        accuracy.append(stream_accuracy(strategy, [test]))

    rows = [{"experience": r["experience"], "OR": r["readiness"], "S": r["strength"], "R": r["reliability"],
             "loss": r["loss"], "gain": r["ground_truth"]["gain"], "accuracy": acc}  # one record per experience
            for r, acc in zip(readiness.history, accuracy)]
    rho = spearman([r["OR"] for r in rows], [r["gain"] for r in rows])
    print(f"{'exp':>3} {'OR':>8} {'S':>8} {'R':>7} {'loss':>6} {'G^(10)':>7} {'acc':>6}")
    for r in rows:
        print(f"{r['experience']:>3} {r['OR']:>8.3f} {r['S']:>8.3f} {r['R']:>7.3f} {r['loss']:>6.2f} "
              f"{r['gain']:>7.3f} {r['accuracy']:>6.3f}")
    print(f"Spearman(OR, G^(10)) over {len(rows)} experiences: {rho:.2f}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = {"rows": rows, "spearman": rho}
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(f"written: {out / 'results.json'}")
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and kind to a shared machine
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 experiences (seconds)")
    parser.add_argument("--out", default="out/examples/03", help="folder for results.json")
    args = parser.parse_args()
    main(quick=args.quick, out_dir=args.out)
