"""How the cost of every estimator, plugin and metric grows with model size (issue 15).

``python -m benchmarks.scale [--quick] [--models ...] [--estimators ...]`` times each estimator
on MLPs, CIFAR ResNets and tiny ViTs (synthetic CIFAR-shaped tensors), one process per
measurement with a timeout and a memory cap, and writes ``results.json`` / ``results.csv``,
``report.md`` (log-log slopes, issue 15's targets) and ``scale.png`` under ``--out``. Models,
measurements, runner and durations: docs/benchmarks.md, "benchmarks.scale".
"""

from benchmarks.scale.main import main

__all__ = ["main"]
