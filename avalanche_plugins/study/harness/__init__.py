"""What every benchmark shares, written once.

* :mod:`avalanche_plugins.study.harness.cli` — the one parser (``--data-root``, ``--quick``, ``--seeds``,
  ``--workers``, ``--threads``, ``--no-progress``, ``--out``, ``--skip``, ``--report``).
* :mod:`avalanche_plugins.study.harness.jobs` — the job protocol: frozen-dataclass jobs, cache keys with the code
  version, the worker initialiser, the resumable executor.
* :mod:`avalanche_plugins.study.harness.results` — ``results.json`` / ``results.csv`` / ``report.md``, tables, the
  ``--report`` path, the accuracy plot.
* :mod:`avalanche_plugins.study.harness.data` — offline continual-learning streams (digits, MNIST from
  ``--data-root``) and the data checksum.
* :mod:`avalanche_plugins.study.harness.models` — the model zoo (MLP, small CNN, mini ResNet, tiny ViT) and the
  multi-head wrappers.
* :mod:`avalanche_plugins.study.harness.training` — training loops, the accuracy matrix, ACC, forgetting.
"""
