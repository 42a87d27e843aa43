"""Comparative studies: one config → every strategy × scenario × seed, tables, figures, a report.

``python -m avalanche_plugins.study CONFIG`` (YAML or TOML; README "Comparative studies") or, from
Python::

    from avalanche_plugins.study import load_study, run_study

    result = run_study("studies/demo.yaml", out="out/demo", quick=True)
    print(result.tables["markdown"])    # also result.rows, result.summary, result.report

Modules: :mod:`~avalanche_plugins.study.describe.config` (format and validation), ``registry`` (names → objects,
argument checks), ``build`` (a run's stream, model, plugins, evaluator, strategy), ``runner``
(one job), ``api`` (tuning, test runs, outputs), ``markdown`` (``report.md``, ``tables.md``, the
terminal summary, from the saved results), ``rows`` (typed run rows, chosen settings, a saved
study read back), ``stats``, ``tables``, ``figures``.
"""

from avalanche_plugins.study.api import StudyResult, load_study, run_study
from avalanche_plugins.study.catalog.registry import ConfigError
from avalanche_plugins.study.describe.config import Study

__all__ = ["ConfigError", "Study", "StudyResult", "load_study", "run_study"]
