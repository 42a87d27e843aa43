"""Experiments that reproduce the five results (run from a checkout; not part of the wheel).

* :mod:`benchmarks._cli` — the one command line of every benchmark (here, not in the wheel).
* :mod:`avalanche_plugins.study.harness` (installed with the package) — one job protocol with a
  resumable executor, results files and ``--report``, data, the model zoo, hand-written training
  loops on tensors. Avalanche strategies are trained by one harness, the study runner
  ``avalanche-study`` (strategy comparisons: ``studies/*.yaml``).
* One module or package per experiment a study config cannot express (the standard baselines are
  ``studies/baselines.yaml`` and ``studies/baselines_mnist.yaml``, the layer-adaptive EWC grid
  ``studies/layer_adaptive_ewc_*.yaml``): :mod:`benchmarks.lae_costs` (its cost ratios),
  :mod:`benchmarks.grow_prune`, :mod:`benchmarks.plasticity_ranking` (with the SCR task source
  :mod:`benchmarks.scr`), :mod:`benchmarks.ads_zoo`, :mod:`benchmarks.transport_keys`.

``python -m benchmarks.NAME --help`` lists a study's options on top of the shared ones.
"""
