"""Comparative studies: one config → every strategy × scenario × seed, tables, figures, a report.

``python -m avalanche_plugins.study CONFIG`` (YAML or TOML; README "Comparative studies") or, from
Python::

    from avalanche_plugins.study import load_study, run_study

    result = run_study("studies/demo.yaml", out="out/demo", quick=True)
    print(result.tables["markdown"])    # also result.rows, result.summary, result.report

Layout (docs/study.md, one import rule per folder): :mod:`~avalanche_plugins.study.api` (plan → run →
choose → write) over :mod:`~avalanche_plugins.study.describe` (a config → a typed ``Study``),
:mod:`~avalanche_plugins.study.run` (one job → its row) and :mod:`~avalanche_plugins.study.report` (rows →
statistics, tables, figures, report), which import none of one another; below them
:mod:`~avalanche_plugins.study.contracts` (specs, grid keys, typed rows, scores),
:mod:`~avalanche_plugins.study.catalog` (datasets, zoo, scenarios, diagnostics, names) and
:mod:`~avalanche_plugins.study.jobs` (executors, the cache, the protocol); ``cli`` reads the command line.
"""

from avalanche_plugins.study.api import StudyResult, load_study, run_study
from avalanche_plugins.study.catalog.registry import ConfigError
from avalanche_plugins.study.describe.config import Study

__all__ = ["ConfigError", "Study", "StudyResult", "load_study", "run_study"]
