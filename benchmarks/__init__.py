"""Experiments that reproduce the five results (run from a checkout; not part of the wheel).

One module or package per experiment a study config cannot express (strategy comparisons are
``studies/*.yaml``, run by ``avalanche-study``), on the study's ground installed with the package
(:mod:`avalanche_plugins.study.jobs`, ``.report.files``, ``.catalog``) and the helpers here:
:mod:`benchmarks._cli` (the one command line), :mod:`benchmarks._results` (results files, tables)
and :mod:`benchmarks._training` (training loops on tensors). What each measures: docs/benchmarks.md.
``python -m benchmarks.NAME --help`` lists a study's options on top of the shared ones.
"""
