"""Quick start: Naive vs Avalanche's EWC vs this package's layer-adaptive EWC on a short stream.

``make demo`` runs it on Split digits (scikit-learn, offline);
``make demo DATASET=mnist DATA_ROOT=../shared/data`` on Split MNIST through Avalanche's
``SplitMNIST(dataset_root=...)``. Prints a table and writes ``demo_out/accuracy.png``.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from benchmarks.common.jobs import Timer
from benchmarks.common.results import (
    command_line,
    format_table,
    plot_final_accuracy,
    summarize,
    write_results,
)
from benchmarks.common.training import TrainConfig, run_strategy
from benchmarks.layer_adaptive_ewc import plugins_for

STRATEGIES = ("naive", "ewc", "lae_geometric", "lae_smoothed")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("digits", "mnist"), default="digits")
    parser.add_argument("--data-root", default=None, help="folder holding MNIST/raw (for --dataset mnist)")
    parser.add_argument("--out", default="demo_out")
    parser.add_argument("--seed", type=int, default=0)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.command = command_line(parser.prog, argv)
    if args.dataset == "mnist" and not args.data_root:
        parser.error("--dataset mnist needs --data-root (e.g. make demo DATASET=mnist DATA_ROOT=../shared/data)")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # Task-incremental (multi-head) Split: the setting where a regulariser has something to protect.
    cfg = TrainConfig(dataset=args.dataset, scenario="split", task_incremental=True, data_root=args.data_root,
                      epochs=3 if args.dataset == "digits" else 1, lr=0.05 if args.dataset == "digits" else 0.01,
                      ewc_lambda=1000.0, extra={"alpha": 2.0, "spectrum_samples": 128})
    rows = []
    with Timer() as total:
        for name in STRATEGIES:
            row = run_strategy(plugins_for, name, cfg, args.seed)
            rows.append(row)
            print(f"{name:<10} ACC {row['acc']:.3f}  forgetting {row['forgetting']:.3f}  ({row['wall_s']:.1f}s)")
    summary = summarize(rows, ["scenario", "strategy"], ["acc", "forgetting", "wall_s"])
    out = write_results(args.out, args, config={"args": vars(args), "train": cfg.__dict__}, rows=rows,
                        summary=summary, wall_seconds=total.seconds)
    plot_final_accuracy(rows, out / "accuracy.png", "demo: final accuracy per experience")
    print(format_table(summary, ["scenario", "strategy"], ["acc", "forgetting"]))
    print(f"plot: {out / 'accuracy.png'}")
    return {"rows": rows, "out": out}


if __name__ == "__main__":
    main()
