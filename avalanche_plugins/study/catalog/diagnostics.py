"""The catalog of diagnostics: what each metric needs from the run, what it emits, its figure.

One table, read by the validator (arguments the study supplies or may choose), the builder (what
each metric gets from the run: :func:`configured_metrics`, :func:`always_metrics`,
:func:`run_analyses`), the runner (the names of the accuracies it reads back) and the figures (one
per figure key, in catalog order). Adding a diagnostic that needs something from the run is one
:class:`Diagnostic` entry in :data:`CATALOG`; a metric without an entry takes only its config
kwargs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ACCURACY", "ALWAYS", "ATTACHED", "AUTO", "CATALOG", "TASK_IL_ACCURACY", "Diagnostic", "RunContext", "always_metrics",
           "check_kwargs", "configured_metrics", "figure_keys", "run_analyses",
           "summary_scalars"]

ALWAYS = ("accuracy_metrics", "forgetting_metrics", "bwt_metrics")  # Avalanche's helpers attached to every run
ATTACHED = (*ALWAYS, "TaskILAccuracyMetric")  # what the study attaches itself: never named in a config
ACCURACY = "Top1_Acc_Exp"  # what R[i, j] is read from (Avalanche's per-experience accuracy)
TASK_IL_ACCURACY = "Top1_TaskIL_Acc_Exp"  # the task-IL matrix (``_avalanche.task_il.TaskILAccuracyMetric``)
AUTO = "auto"  # a value of an optional argument that asks the study to choose it


@dataclass
class RunContext:
    """What a run offers its metrics: its ``Stream``, model and (built) plugins."""

    stream: object
    model: object
    plugins: list = field(default_factory=list)

    def editing(self) -> list:
        """The run's structural plugins (Grow / Prune / FixedMask: masks and a cycle clock)."""
        return [p for p in self.plugins if hasattr(p, "masks") and hasattr(p, "clock")]


@dataclass(frozen=True)
class Diagnostic:
    """One catalog entry. ``injected``: arguments the study always supplies (never in a config);
    ``optional``: arguments the study chooses when the config leaves them out or says ``auto``;
    ``prepare(kwargs, run)``: the final kwargs for one run (``None``: leave the metric off this
    run); ``figure``: the key of its figure in :mod:`avalanche_plugins.study.report.figures`;
    ``summary``: ``(emitted scalar, column title)`` pairs the report's Diagnostics table gives,
    per strategy, as the mean over seeds of each run's mean of the logged values (whichever
    component logged them: ``LayerAdaptiveEWCPlugin(log_profile=True)`` logs the same κ and α̂ as
    ``LayerSensitivityMetric``). A metric that measures on a sample of each experience also gives
    the samples its values rest on (``...SamplesUsed``: fewer than asked where an experience is
    smaller), so the table shows when an estimate rests on a few samples."""

    injected: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    prepare: Callable[[dict, RunContext], dict | None] | None = None
    figure: str | None = None
    summary: tuple[tuple[str, str], ...] = ()


def _cycle_accuracy(kwargs: dict, run: RunContext) -> dict:
    """The run's test stream, and the cycle of its Grow / Prune plugin."""
    kwargs["test_stream"] = run.stream.benchmark.test_stream
    editing = run.editing()
    if editing:  # the plugin's clock: its unit, length and scope (a config's own values win)
        clock = editing[0].clock
        kwargs.setdefault("cycle_unit", getattr(clock, "unit", "epochs"))
        if kwargs["cycle_unit"] == "epochs":
            kwargs.setdefault("epochs_per_cycle", clock.epochs_per_cycle)
        elif kwargs["cycle_unit"] == getattr(clock, "unit", "epochs"):
            kwargs.setdefault("cycle_length", clock.length)
        kwargs.setdefault("cycle_scope", clock.scope)
    return kwargs


def _newborn(kwargs: dict, run: RunContext) -> dict | None:
    """The run's ``GrowPlugin(track_newborn=True)``; runs without one go without the metric."""
    growing = [p for p in run.plugins if getattr(p, "track_newborn", False)]
    if not growing:
        return None
    kwargs["grow_plugin"] = growing[0]
    return kwargs


def _transport(kwargs: dict, run: RunContext) -> dict:
    """``stages`` absent asks for ``auto``: the metric chooses up to three stages itself
    (``TransportKeyMetric(stages="auto")``, on a detached copy of the run's model)."""
    kwargs.setdefault("stages", AUTO)
    return kwargs


CATALOG: dict[str, Diagnostic] = {  # config name -> entry, in figure order
    "OptimizationReadinessMetric": Diagnostic(figure="readiness", summary=(("OptimizationReadiness", "OR"),
                                                                            ("ORSamplesUsed", "OR samples"))),
    "ArchitectureDrivenShiftMetric": Diagnostic(figure="ads", summary=(("ADS", "ADS predicted"),
                                                                        ("ADSRealisedShift", "ADS realised"),
                                                                        ("ADSSamplesUsed", "ADS samples"))),
    "TransportKeyMetric": Diagnostic(optional=("stages",), prepare=_transport, figure="transport"),
    "LayerSensitivityMetric": Diagnostic(figure="curvature", summary=(("LayerSensitivityKappa", "κ"),
                                                                      ("LayerSensitivityAlphaHat", "α̂"),
                                                                      ("LayerSensitivitySamplesUsed", "κ samples"))),
    "CycleAccuracyMetric": Diagnostic(injected=("test_stream",), prepare=_cycle_accuracy, figure="structural"),
    "NewbornGradientMetric": Diagnostic(injected=("grow_plugin",), prepare=_newborn, figure="structural"),
}
_PLAIN = Diagnostic()


def check_kwargs(name: str, kwargs: Mapping) -> tuple[dict, tuple[str, ...], tuple[str, ...]]:
    """``(kwargs to check, injected, optional)`` of a configured metric: an optional argument
    given as ``auto`` is the study's to choose, so it is not checked."""
    entry = CATALOG.get(name, _PLAIN)
    kwargs = {k: v for k, v in kwargs.items() if not (k in entry.optional and v == AUTO)}
    return kwargs, entry.injected, entry.optional


def configured_metrics(specs: Sequence, run: RunContext, *, factory: Callable, value: Callable) -> list:
    """The configured metrics of one run (their ``MetricSpec`` s), built by ``factory(name)`` with the spec's kwargs
    (each through ``value``) and what the catalog says the run supplies; a helper returning
    several metrics contributes all of them."""
    made_all = []
    for spec in specs:
        kwargs = {k: value(v) for k, v in spec.kwargs.items()}
        entry = CATALOG.get(spec.name, _PLAIN)
        if entry.prepare is not None:
            kwargs = entry.prepare(kwargs, run)
            if kwargs is None:
                continue
        made = factory(spec.name)(**kwargs)
        made_all += list(made) if isinstance(made, (list, tuple)) else [made]
    return made_all


def always_metrics(task_il: bool) -> list:
    """Accuracy, forgetting and BWT per experience and stream (and the task-IL accuracy)."""
    import avalanche.evaluation.metrics as metrics

    out = [metric for name in ALWAYS for metric in getattr(metrics, name)(experience=True, stream=True)]
    if task_il:
        from avalanche_plugins._avalanche.task_il import TaskILAccuracyMetric

        out.append(TaskILAccuracyMetric())
    return out


def run_analyses(run: RunContext) -> list:
    """Metrics the study adds by itself: the compactness of every structural plugin."""
    if not run.editing():
        return []
    from avalanche_plugins.structural.compactness_metric import CompactnessMetric

    return [CompactnessMetric(p) for p in run.editing()]


def summary_scalars() -> dict[str, str]:
    """``{emitted scalar: column title}`` of the report's Diagnostics table, in catalog order."""
    return {name: title for entry in CATALOG.values() for name, title in entry.summary}


def figure_keys() -> list[str]:
    """The diagnostics' figure keys, once each, in catalog order."""
    return list(dict.fromkeys(entry.figure for entry in CATALOG.values() if entry.figure))
