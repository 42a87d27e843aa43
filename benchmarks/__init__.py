"""Experiments that reproduce the five results (run from a checkout; not part of the wheel).

* :mod:`benchmarks._cli` — the one command line of every benchmark (here, not in the wheel).
* The study's ground, installed with the package: :mod:`avalanche_plugins.study.jobs` (one job
  protocol with a resumable executor), :mod:`avalanche_plugins.study.report.files` (results files and
  ``--report``), :mod:`avalanche_plugins.study.catalog` (data, the model zoo); the hand-written
  training loops on tensors are :mod:`benchmarks._training`'s. Avalanche strategies are trained by the study runner
  ``avalanche-study`` (strategy comparisons: ``studies/*.yaml``).
* One module or package per experiment a study config cannot express (the standard baselines are
  ``studies/baselines.yaml`` and ``studies/baselines_mnist.yaml``, the layer-adaptive EWC grid
  ``studies/layer_adaptive_ewc_*.yaml``): :mod:`benchmarks.lae_costs` (its cost ratios),
  :mod:`benchmarks.grow_prune`, :mod:`benchmarks.plasticity_ranking` (with the SCR task source
  :mod:`benchmarks.scr`), :mod:`benchmarks.ads_zoo`, :mod:`benchmarks.transport_keys`.

``python -m benchmarks.NAME --help`` lists a study's options on top of the shared ones.
"""
