"""The typed values the study's parts hand one another: what a config asks for (specs, grids),
what a run gives back (rows, scores), and a saved study read back.

* :mod:`~avalanche_plugins.study.contracts.specs` — frozen strategy, scenario and diagnostic specs.
* :mod:`~avalanche_plugins.study.contracts.grid` — the grammar of tuning-grid keys.
* :mod:`~avalanche_plugins.study.contracts.rows` — ``RunRow``, ``Choice`` / ``TuningFailed``, ``SavedStudy``.
* :mod:`~avalanche_plugins.study.contracts.scores` — ACC, forgetting, BWT, FWT of one run.

The rule of this folder (tests/study/test_layout.py): it imports only itself and
:mod:`~avalanche_plugins.study.catalog`; ``describe``, ``run`` and ``report`` meet only here.
"""
