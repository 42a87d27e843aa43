"""One job of a study: build its stream, model, plugins, evaluator and strategy
(:mod:`~avalanche_plugins.study.run.build`), train and evaluate it and return its row
(:mod:`~avalanche_plugins.study.run.job`), with the per-iteration watchers of online streams
(:mod:`~avalanche_plugins.study.run.watch`).

The rule of this folder (tests/study/test_layout.py): it imports none of ``describe`` and ``report``;
below it only ``contracts``, ``catalog`` and ``jobs``.
"""
