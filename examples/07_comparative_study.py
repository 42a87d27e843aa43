"""A comparative study from Python instead of the CLI: one config dict → tuned runs, tables, report.

``run_study`` takes the same config as ``avalanche-study run CONFIG`` (YAML/TOML there, a dict
here; format in docs/study.md): scenarios, a model, strategies (any Avalanche
strategy class by name, or Naive + plugins), hyper-parameter grids, metrics, seeds. Each grid is
tuned on a validation split with one seed; every strategy then runs at its chosen setting on the
test stream with every seed; the result holds the per-run rows, Markdown/LaTeX tables (mean ± std
and a 95 % bootstrap interval over seeds, paired tests against the reference, best in bold) and
``report.md`` with the figures. Here: Naive, EWC, LwF and LayerAdaptiveEWC on task-incremental Split digits
(scikit-learn's 8×8 images; nothing downloaded), with Optimization Readiness attached to every run.
Needs the ``[study]`` extra (``pip install 'avalanche-plugins[study]'``).
About 80 s (``--quick``: one seed, one epoch, one grid value; 17 s) on 2 CPU cores, after
the imports.
"""

from __future__ import annotations

import argparse

from avalanche_plugins.study import run_study
from avalanche_plugins.study.contracts.rows import Choice

STUDY = {
    "name": "regularisers_on_split_digits",
    "seeds": 3,
    "reference": "Naive",  # the paired tests compare every strategy with this one
    "scenarios": [{"name": "split_digits_task", "benchmark": "split_digits", "n_experiences": 5,
                   "task_incremental": True}],
    "model": {"name": "mlp", "kwargs": {"hidden": [64, 64]}},  # or "my_package.models:make_model"
    "training": {"optimizer": "sgd", "lr": 0.05, "epochs": 3, "batch_size": 32},
    "strategies": [
        {"name": "Naive"},
        {"name": "EWC", "kwargs": {"ewc_lambda": 100}, "grid": {"ewc_lambda": [100, 1000]}},
        {"name": "LwF", "kwargs": {"alpha": 1.0, "temperature": 2.0}},  # any avalanche.training strategy
        {"name": "LayerAdaptiveEWC",  # Naive + this package's plugin; the grid reaches into its kwargs
         "plugins": [{"name": "LayerAdaptiveEWCPlugin", "kwargs": {"ewc_lambda": 100, "schedule": "geometric"}}],
         "grid": {"LayerAdaptiveEWCPlugin.ewc_lambda": [100, 1000]}},
    ],
    "metrics": [{"name": "OptimizationReadinessMetric", "kwargs": {"n_samples": 256}}],  # beside ACC/forgetting/BWT
    "quick": {"seeds": 1, "training": {"epochs": 1}, "grid": 1,  # what quick=True changes
              "metrics": {"OptimizationReadinessMetric": {"n_samples": 128, "n_batches": 16}}},
}


def main(quick: bool = False, out_dir="out/examples/07"):
    result = run_study(STUDY, out=out_dir, quick=quick, progress=False)  # workers=2 / executor="ray" scale it
    print(result.tables["markdown"])  # the paper table; result.tables["latex"] is the same in LaTeX
    for scenario, strategies in result.chosen.items():
        for strategy, choice in strategies.items():  # a Choice, or TuningFailed where every setting failed
            said = f"{choice.label} (ACC {choice.val_acc:.3f})" if isinstance(choice, Choice) else choice.failed
            print(f"chosen on validation: {scenario} / {strategy}: {said}")
    for row in result.rows:  # a RunRow per (scenario, strategy, setting, seed) test run
        print(f"{row.strategy:<17} seed {row.seed}  ACC {row.acc:.3f}  forgetting {row.score('forgetting'):.3f}")
    print(f"report: {result.report}   every logged value: {result.csv}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, one epoch, first grid value")
    parser.add_argument("--out", default="out/examples/07", help="folder for the study's outputs")
    args = parser.parse_args()
    main(quick=args.quick, out_dir=args.out)
