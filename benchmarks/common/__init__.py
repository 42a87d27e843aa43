"""What every benchmark shares, written once.

* :mod:`benchmarks.common.cli` — the one parser (``--data-root``, ``--quick``, ``--seeds``,
  ``--workers``, ``--threads``, ``--no-progress``, ``--out``, ``--skip``, ``--report``).
* :mod:`benchmarks.common.jobs` — the job protocol: frozen-dataclass jobs, cache keys with the code
  version, the worker initialiser, the resumable executor.
* :mod:`benchmarks.common.results` — ``results.json`` / ``results.csv`` / ``report.md``, tables, the
  ``--report`` path, the accuracy plot.
* :mod:`benchmarks.common.data` — offline continual-learning streams (digits, MNIST from
  ``--data-root``) and the data checksum.
* :mod:`benchmarks.common.models` — the model zoo (MLP, small CNN, mini ResNet, tiny ViT) and the
  multi-head wrappers.
* :mod:`benchmarks.common.training` — training loops, the accuracy matrix, ACC, forgetting.
"""
