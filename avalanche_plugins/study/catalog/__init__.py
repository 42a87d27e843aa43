"""What a study can name: datasets and streams, the model zoo, scenarios, diagnostics, and the
resolution of every other name a config gives (a strategy, a plugin, a user's ``module:function``).

* :mod:`~avalanche_plugins.study.catalog.datasets` — offline continual-learning streams (digits, MNIST,
  Fashion-MNIST, CIFAR from ``--data-root``) and the data checksum.
* :mod:`~avalanche_plugins.study.catalog.prepare` — ``avalanche-study data``: installs and prepares them.
* :mod:`~avalanche_plugins.study.catalog.zoo` — the model zoo (MLP, small CNN, mini ResNet, ResNet-18,
  tiny ViT, EfficientNet-Lite0 via :mod:`~avalanche_plugins.study.catalog.efficientnet`) and the
  multi-head wrappers.
* :mod:`~avalanche_plugins.study.catalog.scenarios` — scenario name → its dataset and defaults.
* :mod:`~avalanche_plugins.study.catalog.diagnostics` — the diagnostics a study can add to a run.
* :mod:`~avalanche_plugins.study.catalog.registry` — names → objects, argument checks, user modules.

The rule of this folder (tests/study/test_layout.py): it imports nothing else of the study; everything
else may import it.
"""
