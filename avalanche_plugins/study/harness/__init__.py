"""What the study runner and any experiment share, written once (no command line: each caller
parses its own and passes plain values).

* :mod:`avalanche_plugins.study.harness.jobs` — the job protocol: frozen-dataclass jobs, cache keys with the code
  version, the worker initialiser, the resumable executors (:func:`~avalanche_plugins.study.harness.jobs.make_executor`).
* :mod:`avalanche_plugins.study.harness.protocol` — tune on validation, then test; ``--skip`` names.
* :mod:`avalanche_plugins.study.harness.results` — ``results.json`` / ``results.csv`` / ``report.md``, tables, the
  ``--report`` path, the accuracy plot.
* :mod:`avalanche_plugins.study.harness.data` — offline continual-learning streams (digits, MNIST from
  ``--data-root``) and the data checksum.
* :mod:`avalanche_plugins.study.harness.models` — the model zoo (MLP, small CNN, mini ResNet, tiny ViT) and the
  multi-head wrappers.
* :mod:`avalanche_plugins.study.harness.training` — training loops, the accuracy matrix, ACC, forgetting.
"""
