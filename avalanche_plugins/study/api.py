"""``run_study``: a validated study → tuning runs, test runs, tables, figures and a report.

1. Every strategy with a ``grid`` runs each setting once on the validation split with the
   study's ``tune_seed`` (diagnostics left out: accuracy, forgetting and BWT only); the setting
   with the best final average accuracy is chosen (:mod:`avalanche_plugins.study.jobs.protocol`).
2. Every strategy (at its chosen setting) runs on the test stream with seeds ``0..seeds-1``,
   every configured metric attached.
3. ``OUT/`` receives ``metrics.csv`` (every value every metric logged, tidy long format, tuning
   runs included with ``split=validation``), ``results.json`` / ``results.csv`` (runs, summary,
   chosen settings, tests), ``tables.md`` / ``tables.tex``, ``figures/*.png``, ``report.md``, the
   per-run CSVs and images under ``runs/`` and the resumable job cache ``jobs.jsonl``. On Ray each
   run's files come back with its row and are written here by the driver, before the row is cached
   (:class:`FilesToOut`), so they exist on the driver whichever node ran the job.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from avalanche_plugins.study.catalog.diagnostics import summary_scalars
from avalanche_plugins.study.catalog.registry import ErrorList, import_paths
from avalanche_plugins.study.contracts.rows import (
    Choice,
    RunRow,
    TuningFailed,
    choices_as_dict,
    choices_from_dict,
)
from avalanche_plugins.study.contracts.specs import ScenarioSpec, StrategySpec, apply_setting
from avalanche_plugins.study.describe.config import Study, read_study
from avalanche_plugins.study.jobs import Timer, make_executor, run_jobs
from avalanche_plugins.study.jobs.protocol import (
    expand_grid,
    is_skipped,
    setting_label,
)
from avalanche_plugins.study.report.files import print_report, write_results
from avalanche_plugins.study.report.markdown import report, tables_markdown, terminal_summary
from avalanche_plugins.study.report.provenance import study_provenance
from avalanche_plugins.study.report.stats import summarize_diagnostics, summarize_study
from avalanche_plugins.study.report.tables import (
    accuracy_matrix_tables,
    diagnostics_tables,
    failed_runs_table,
    latex_tables,
    markdown_tables,
)
from avalanche_plugins.study.run.job import (
    CONTEXT,
    FILES,
    StudyJob,
    failed_outside_the_method,
    lost_row,
    run_job,
    write_files,
)

__all__ = ["FilesToOut", "StudyResult", "failure_summary", "load_study", "make_study_executor", "plan_test_jobs",
           "plan_tuning_jobs", "report", "run_study", "write_outputs"]

TIDY_COLUMNS = ("phase", "stream", "training_experience", "experience", "task", "metric", "key", "value",
                "file", "step", "callback")


@dataclass
class StudyResult:
    """What a study produced, typed as :class:`~avalanche_plugins.study.contracts.rows.SavedStudy`
    reads it back: ``rows``, one :class:`~avalanche_plugins.study.contracts.rows.RunRow` per test run
    (scenario, strategy, setting, seed, split, ``scores``, ``costs``, accuracy matrix, status, error;
    ``row.as_dict()`` is its ``results.json`` form); ``tuning``: the validation runs; ``chosen``:
    ``{scenario: {strategy: Choice | TuningFailed}}``; ``summary``: per (scenario, strategy)
    statistics and tests; ``tables``: ``{"markdown", "latex", ...}``; ``report``, ``csv``: paths of
    ``report.md`` and ``metrics.csv``."""

    study: Study
    out: Path
    rows: tuple[RunRow, ...]
    tuning: tuple[RunRow, ...]
    chosen: dict[str, dict[str, Choice | TuningFailed]]
    summary: list[dict]
    tables: dict
    report: Path
    csv: Path
    figures: list[Path] = field(default_factory=list)
    wall_seconds: float = 0.0


def make_study_executor(executor: str = "local", *, workers: int = 1, threads: int = 1, address: str | None = None,
                        isolate: bool = True, wait_limit: float | None = None):
    """The job executor (:func:`~avalanche_plugins.study.jobs.make_executor`): a local pool of
    ``workers`` processes, or Ray (started locally with ``workers × threads`` CPUs, or joined at ``address``;
    ``wait_limit``: seconds jobs may wait with no node able to run one before the study stops); a job
    the executor loses (a dead worker or node, Ray's retries used up) becomes a failed row
    (:func:`~avalanche_plugins.study.run.job.lost_row`), not an error that stops the study."""
    return make_executor(executor, workers=workers, threads=threads, address=address, isolate=isolate,
                         wait_limit=wait_limit, lost_row=lost_row)


class FilesToOut:
    """An executor whose rows' shipped files (:data:`~avalanche_plugins.study.run.job.FILES`, from
    ``run_job(..., ship_files=True)`` on a Ray node) are written under ``out`` and taken out of the
    row as each row arrives, before :func:`run_jobs` caches it: a cached row's files exist on the driver."""

    def __init__(self, executor, out):
        self.executor, self.out = executor, Path(out)

    def map_unordered(self, fn, jobs):
        for job, ran in self.executor.map_unordered(fn, jobs):
            if isinstance(ran, dict) and FILES in ran:
                ran = dict(ran)
                write_files(self.out, ran.pop(FILES))
            yield job, ran

    def close(self) -> None:
        if hasattr(self.executor, "close"):
            self.executor.close()


def load_study(config, *, quick: bool = False, seeds: int | None = None, data_root=None, deep: bool = True,
               recipe_folder=None) -> Study:
    """Read and validate a study: a YAML/TOML path or an already parsed mapping
    (:func:`~avalanche_plugins.study.describe.config.read_study`: every error of the config at once, each
    naming its key); ``deep`` (default) then builds the model for every built-in scenario's input
    shape and class count and runs it on two zero inputs (the builder's
    :func:`~avalanche_plugins.study.run.build.check_model_builds`), every failure in one
    :class:`ConfigError`. ``quick``, ``seeds``, ``data_root``, ``recipe_folder``: as
    :func:`~avalanche_plugins.study.describe.config.read_study` takes them."""
    from avalanche_plugins.study.run.build import check_model_builds  # imports Avalanche

    study = read_study(config, quick=quick, seeds=seeds, data_root=data_root, recipe_folder=recipe_folder)
    if deep and study.model is not None:
        found = ErrorList()
        for i, scenario in enumerate(study.scenarios):
            with found.attempt(), import_paths(study.paths):
                check_model_builds(study.model, scenario, f"scenarios[{i}]")
        found.raise_if_any()
    return study


def _label(setting: dict) -> str:
    """``setting_label`` with grid keys shortened to the argument name where that is unambiguous
    (``LayerAdaptiveEWCPlugin.ewc_lambda`` → ``ewc_lambda``)."""
    short = [key.rpartition(".")[2] for key in setting]
    if len(set(short)) == len(short):
        setting = dict(zip(short, setting.values()))
    return setting_label(setting)


def _cells(study: Study, skip) -> list[tuple[ScenarioSpec, StrategySpec]]:
    """``(scenario, strategy spec for it)`` of every cell not skipped (recipes merged per scenario)."""
    return [(scenario, strategy.on(scenario.name)) for scenario in study.scenarios for strategy in study.strategies
            if not is_skipped(skip, scenario.name, strategy.name) and not is_skipped(skip, strategy.name)]


def _cell_label(setting: dict, strategy: StrategySpec) -> str:
    """The setting's label; a recipe without a grid is labelled by its recipe."""
    if not setting and strategy.recipe:
        return "recipe" + (f" ({', '.join(strategy.overridden)} overridden)" if strategy.overridden else "")
    return _label(setting)


def plan_tuning_jobs(study: Study, skip=()) -> list[tuple[StudyJob, dict]]:
    """``(job, setting)`` for every grid setting of every (scenario, strategy) with a grid."""
    jobs = []
    for scenario, strategy in _cells(study, skip):
        for setting in expand_grid(strategy.grid_values()) if strategy.grid else []:
            spec, training = apply_setting(strategy, study.training, setting)
            jobs.append((StudyJob(study.name, scenario, study.model, training, spec, _cell_label(setting, strategy), (),
                                  study.loggers, study.tune_seed, "validation",
                                  study.sources_of(scenario, study.model, spec), study.paths), setting))
    return jobs


def plan_test_jobs(study: Study, chosen: dict, skip=()) -> list[StudyJob]:
    """Every (scenario, strategy) at its chosen setting (``{}`` without a grid), every seed;
    ``chosen``: ``{scenario: {strategy: Choice | TuningFailed}}`` (or its JSON form)."""
    jobs = []
    chosen = choices_from_dict(chosen)
    for scenario, strategy in _cells(study, skip):
        choice = chosen.get(scenario.name, {}).get(strategy.name)
        if isinstance(choice, TuningFailed):
            continue  # nothing to test: _tuning_failures records the cell as failed
        setting = choice.setting if choice is not None else {}
        spec, training = apply_setting(strategy, study.training, setting)
        for seed in range(study.seeds):
            jobs.append(StudyJob(study.name, scenario, study.model, training, spec, _cell_label(setting, strategy),
                                 study.metrics, study.loggers, seed, "test",
                                 study.sources_of(scenario, study.model, spec, *study.metrics), study.paths))
    return jobs


def _choose(tuning: list[tuple[StudyJob, dict]], rows: list[RunRow]) -> tuple[list[RunRow], dict]:
    """The tuning rows with their grid settings, and per (scenario, strategy) the setting with the
    best finite validation accuracy (the first on ties) or, where none has one, a :class:`TuningFailed`."""
    rows = [replace(row, setting_values=setting) for (_, setting), row in zip(tuning, rows)]
    best: dict = {}
    for row in rows:
        if math.isfinite(row.acc) and (row.cell not in best or row.acc > best[row.cell].acc):
            best[row.cell] = row
    chosen: dict = {}
    for row in rows:
        scenario, strategy = row.cell
        if row.cell not in best:
            errors = sorted({r.error or "NaN accuracy" for r in rows if r.cell == row.cell})
            chosen.setdefault(scenario, {})[strategy] = TuningFailed(
                f"every grid setting failed on the validation split: {'; '.join(errors)}")
            continue
        winner = best[row.cell]
        chosen.setdefault(scenario, {})[strategy] = Choice(winner.setting_values, winner.setting, winner.acc)
    return rows, chosen


def _tuning_failures(study: Study, chosen: dict) -> list[RunRow]:
    """A failed test row per seed of every cell whose grid failed entirely (never scored)."""
    return [RunRow(scenario, strategy, "—", seed, "test", accuracy_matrix=[], metrics=[], status="tuning",
                   error=choice.failed)
            for scenario, strategies in chosen.items() for strategy, choice in strategies.items()
            if isinstance(choice, TuningFailed) for seed in range(study.seeds)]


def run_study(config, *, out, quick: bool = False, seeds: int | None = None, executor: str = "local",
              workers: int = 1, threads: int = 1, address: str | None = None, data_root=None,
              skip=(), progress: bool = True, command: str | None = None, echo: bool = False,
              isolate: bool = True, wait_limit: float | None = None) -> StudyResult:
    """Run a study (a config path, a mapping or a loaded :class:`Study`) into ``out``; see the
    module docstring. ``seeds`` replaces the config's seed count (a loaded study's too); ``quick``
    applies its ``quick:`` overrides (``quick`` and ``data_root`` with a loaded study: a
    ``ValueError`` before anything runs, pass them to :func:`load_study`); ``executor`` is ``"local"`` (``workers`` processes) or ``"ray"`` (``address``).
    ``isolate`` (default): every job in a fresh process, so its peak memory is its own; ``False``
    reuses worker processes (faster to start, memory then includes the jobs before).
    ``command``: the command line that started the study, recorded in ``results.json``;
    ``echo``: print the tables when done. On Ray, every run's files (``runs/``, logger folders) come
    back with its row and are written under ``out`` (:class:`FilesToOut`); while no node can run a
    job the study says so on stderr, and ``wait_limit`` (seconds, None: no limit) stops it with
    :class:`~avalanche_plugins.study.jobs.NoNodeCanRun` naming the lost nodes and the jobs not
    done (finished rows stay in ``jobs.jsonl``: a rerun resumes)."""
    study = _with_overrides(config, quick, seeds, data_root) if isinstance(config, Study) else \
        load_study(config, quick=quick, seeds=seeds, data_root=data_root)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pool = make_study_executor(executor, workers=workers, threads=threads, address=address, isolate=isolate,
                               wait_limit=wait_limit)
    run = functools.partial(run_job, log_dir=str(out))
    if executor == "ray":  # the node that runs a job may not see this out folder: its files come back with the row
        pool, run = FilesToOut(pool, out), functools.partial(run_job, ship_files=True)
    cache = out / "jobs.jsonl"
    with Timer() as total, contextlib.closing(pool) if hasattr(pool, "close") else contextlib.nullcontext():
        tuning = plan_tuning_jobs(study, skip)
        tuning_rows = run_jobs(run, [job for job, _ in tuning], cache=cache, executor=pool,
                               desc="tuning (validation)", progress=progress, retry=failed_outside_the_method)
        tuning_rows, chosen = _choose(tuning, [RunRow.from_dict(row) for row in tuning_rows])
        test_rows = run_jobs(run, plan_test_jobs(study, chosen, skip), cache=cache, executor=pool,
                             desc="runs (test)", progress=progress, retry=failed_outside_the_method)
        test_rows = [RunRow.from_dict(row) for row in test_rows] + _tuning_failures(study, chosen)
    return write_outputs(study, out, test_rows, tuning_rows, chosen, total.seconds, command=command, echo=echo)


def _with_overrides(study: Study, quick: bool, seeds: int | None, data_root) -> Study:
    """A loaded study with ``seeds`` applied; ``quick`` and ``data_root`` change what reading the
    config resolves (its ``quick:`` overrides, the scenarios' data), so with a loaded study they are
    refused, not ignored."""
    given = [name for name, value in (("quick", quick), ("data_root", data_root)) if value not in (False, None)]
    if given:
        raise ValueError(f"run_study: {' and '.join(given)} apply when a config is read; pass them to "
                         f"load_study(config, {', '.join(f'{g}=...' for g in given)}) or give run_study the "
                         "config itself, not a loaded Study")
    if seeds is None:
        return study
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"run_study: seeds must be a positive int, got {seeds!r}")
    return replace(study, seeds=seeds)


def write_outputs(study: Study, out: Path, test_rows, tuning_rows, chosen, wall_seconds: float, *,
                  command: str | None = None, echo: bool = False) -> StudyResult:
    """Tidy CSV, results.json (with per-scenario provenance), tables, figures and report of
    finished runs. Rows are :class:`~avalanche_plugins.study.contracts.rows.RunRow` s (or their JSON form),
    ``chosen`` is ``{scenario: {strategy: Choice | TuningFailed}}`` (or its JSON form); the
    :class:`StudyResult` holds them typed, ``results.json`` their JSON forms."""
    from avalanche_plugins.study.report.figures import make_figures

    test_rows, tuning_rows = [RunRow.of(row) for row in test_rows], [RunRow.of(row) for row in tuning_rows]
    csv_path = out / "metrics.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*CONTEXT, *TIDY_COLUMNS], extrasaction="ignore")
        writer.writeheader()
        for row in [*tuning_rows, *test_rows]:
            writer.writerows(row.metrics or [])
    metrics = [m for row in test_rows for m in row.metrics or []]
    run_rows, tuning_rows = [row.without_metrics() for row in test_rows], [row.without_metrics() for row in tuning_rows]
    runs, tuning, chosen = [row.as_dict() for row in run_rows], [row.as_dict() for row in tuning_rows], \
        choices_as_dict(chosen)
    names = [s.name for s in study.strategies]
    summary = summarize_study(run_rows, study.reference, names)
    diagnostics = summarize_diagnostics(metrics, summary_scalars(), names)
    tables = {"markdown": markdown_tables(summary, study.reference), "latex": latex_tables(summary, study.reference),
              "failed": failed_runs_table(summary), "matrices": accuracy_matrix_tables(summary),
              "diagnostics": diagnostics_tables(diagnostics)}
    if diagnostics:
        tables["latex"] += "\n\n" + diagnostics_tables(diagnostics, latex=True)
    (out / "tables.md").write_text(tables_markdown(tables) + "\n")
    (out / "tables.tex").write_text(tables["latex"] + "\n")
    figures = make_figures(run_rows, metrics, out / "figures", names)
    data = study_provenance(study.scenarios, study.sources, [*run_rows, *tuning_rows])
    write_results(out, command=command, data=data, config=study.as_dict(), rows=runs, summary=summary,
                  wall_seconds=wall_seconds, extra={"study": study.name, "source": study.source, "reference": study.reference,
                         "chosen": chosen, "tuning": tuning, "tables": tables, "diagnostics": diagnostics,
                         "figures": [p.relative_to(out).as_posix() for p in figures]})
    print_report(out / "results.json", report, out_dir=out, echo=False)
    if echo:
        print(terminal_summary(out / "results.json"), flush=True)
    return StudyResult(study, out, tuple(run_rows), tuple(tuning_rows), choices_from_dict(chosen), summary, tables,
                       out / "report.md", csv_path, figures, wall_seconds)


def failure_summary(rows, tuning=()) -> str | None:
    """Why a study's exit status is not 0, or None: runs (test or tuning) that failed for a reason
    outside the method (``runner.OUTSIDE_THE_METHOD``: an import, the config, the data, a callback),
    or no test run that finished. Each distinct cause is named once, with how many runs it stopped.
    A diverged run is a result of the method and alone does not fail the study.

    Example:
        >>> rows = [{"status": "error", "error": "ConfigError: no module 'm'"}] * 3
        >>> print(failure_summary(rows))
        3 of 3 runs failed outside the method: 3 × ConfigError: no module 'm'
        >>> failure_summary([{"status": "ok"}, {"status": "diverged", "error": "inf"}]) is None
        True
    """
    rows, tuning = [RunRow.of(r) for r in rows], [RunRow.of(r) for r in tuning]
    runs = [r for r in rows + tuning if r.status != "tuning"]
    outside = [r for r in runs if failed_outside_the_method(r)]
    if outside:
        causes = Counter(r.error or r.status for r in outside)
        return (f"{len(outside)} of {len(runs)} runs failed outside the method: "
                + "; ".join(f"{n} × {cause}" for cause, n in causes.most_common()))
    finished = [r for r in rows if r.status == "ok"]
    if rows and not finished:
        causes = Counter(r.error or r.status for r in rows)
        return (f"none of the {len(rows)} test runs finished: "
                + "; ".join(f"{n} × {cause}" for cause, n in causes.most_common()))
    return None
