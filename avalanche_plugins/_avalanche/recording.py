"""The base of this package's Avalanche metrics: what every metric keeps, returns and emits.

Every metric of the package measures something at a strategy callback and emits it through
Avalanche's ``EvaluationPlugin`` (so it reaches every logger). They share one contract:

* ``history`` — one record (a dict or dataclass) per measurement, in order; the run's full log.
* ``result()`` — the headline value of the last record (None before the first).
* ``reset()`` — forget everything (a fresh run).
* ``emit(strategy, {name: value})`` — ``MetricValue`` objects named with Avalanche's
  ``Name/phase/stream/TaskNNN/ExpNNN`` template, at the strategy's iteration count; None values
  are skipped.
* ``measuring(strategy)`` — a context that restores torch's RNG state (CPU and the strategy's CUDA
  device) on exit: measuring must never change the training run. ``experience_batches`` already
  restores the CPU RNG after building its loader; ``measuring`` also covers direct
  ``dataset[i]`` reads through random training transforms (the transport metric's anchors) and the
  CUDA generator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from avalanche.evaluation import PluginMetric
from avalanche.evaluation.metric_results import MetricValue

from avalanche_plugins._avalanche.data import metric_name, preserved_rng
from avalanche_plugins._avalanche.distributed import check_distributed

__all__ = ["RecordingMetric"]

TResult = TypeVar("TResult")


class RecordingMetric(PluginMetric[TResult], Generic[TResult]):
    """A ``PluginMetric`` with a ``history`` of records (module docstring).

    Subclasses set ``result_key`` (the record field ``result()`` returns) or override
    :meth:`result_of`, and override :meth:`reset_state` when they hold more than ``history``.
    """

    result_key: str | None = None
    #: works under Avalanche's distributed training (:mod:`avalanche_plugins._avalanche.distributed`);
    #: a subclass that does sets it True, one that does not is refused there before training
    supports_distributed: bool = False

    def __init__(self):
        super().__init__()
        self.history: list = []

    def before_training(self, strategy):
        """Under torchrun: refuse before training unless the metric supports it (Avalanche checks
        only ``strategy.plugins``, not the evaluator's metrics)."""
        check_distributed(self, strategy)

    def result(self) -> TResult | None:
        """The headline value of the last record (None before the first)."""
        return self.result_of(self.history[-1]) if self.history else None

    def result_of(self, record) -> TResult:
        if self.result_key is None:
            return record
        return record[self.result_key] if isinstance(record, Mapping) else getattr(record, self.result_key)

    def reset(self) -> None:
        """Forget the history and any pending state (a fresh run)."""
        self.history = []
        self.reset_state()

    def reset_state(self) -> None:
        """Clear state beyond ``history`` (override when there is some)."""

    def emit(self, strategy, values: Mapping[str, Any], x: int | None = None) -> list[MetricValue]:
        """``MetricValue`` objects for ``{name: value}`` (None skipped) at iteration ``x``
        (default: the strategy's training iterations)."""
        x = strategy.clock.train_iterations if x is None else x
        return [MetricValue(self, metric_name(name, strategy), value, x)
                for name, value in values.items() if value is not None]

    @staticmethod
    def measuring(strategy):
        """Context restoring the CPU (and the strategy device's) RNG state on exit."""
        return preserved_rng(strategy.device)
