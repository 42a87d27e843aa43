"""Saved rows → what a reader gets: statistics across seeds (:mod:`~avalanche_plugins.study.report.stats`),
tables (:mod:`~avalanche_plugins.study.report.tables`), figures (:mod:`~avalanche_plugins.study.report.figures`),
the provenance of every number (:mod:`~avalanche_plugins.study.report.provenance`), ``report.md`` and the
terminal summary (:mod:`~avalanche_plugins.study.report.markdown`) and the results files
(:mod:`~avalanche_plugins.study.report.files`).

The rule of this folder (tests/study/test_layout.py): it imports none of ``describe`` and ``run``;
below it only ``contracts``, ``catalog`` and ``jobs``.
"""
