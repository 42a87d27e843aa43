"""Comparative studies: one config → every strategy × scenario × seed, tables, figures, a report.

``python -m benchmarks.study CONFIG`` (YAML or TOML; README "Comparative studies") or, from
Python::

    from benchmarks.study import load_study, run_study

    result = run_study("studies/demo.yaml", out="out/demo", quick=True)
    print(result.tables["markdown"])    # also result.rows, result.summary, result.report

Modules: :mod:`~benchmarks.study.config` (format and validation), ``registry`` (names → objects,
argument checks), ``build`` (a run's stream, model, plugins, evaluator, strategy), ``runner``
(one job), ``api`` (tuning, test runs, outputs), ``stats``, ``tables``, ``figures``.
"""

from benchmarks.study.api import StudyResult, run_study
from benchmarks.study.config import Study, load_study
from benchmarks.study.registry import ConfigError

__all__ = ["ConfigError", "Study", "StudyResult", "load_study", "run_study"]
