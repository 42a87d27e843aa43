"""Metrics of the Grow / Prune study as Avalanche plugin metrics.

* :class:`CycleAccuracyMetric` — at the end of every edit cycle (every ``epochs_per_cycle``
  training epochs, counted like :class:`~avalanche_plugins.structural.plugins.CycleClock`), the
  *cumulative* test accuracy: accuracy over the test data of every experience seen so far
  (experiences ``0..i`` of the test stream while training experience ``i``; all of them with
  ``cumulative=False``). Emits ``CycleAccuracy/train_phase/train_stream/Task000/Exp001`` and the
  trajectory-average accuracy ``TAA = mean of the cycle accuracies so far`` under ``TAA/...``.
  Final ACC is the last cycle accuracy of the run (or Avalanche's stream accuracy).
* :class:`NewbornGradientMetric` — for every cycle that began with growth, the ratio of the mean
  per-unit gradient norm (``‖∂L/∂(incoming row, bias, BN affine)‖``, averaged over the cycle's
  iterations) of newborn units (recruited at the start of the cycle) to that of incumbents, and
  both groups' mean activation ``φ(z)``. "Forward-active but backward-starved" newborns show as
  ``NewbornActivation ≈ IncumbentActivation`` with ``NewbornGradientRatio ≪ 1``. Emits
  ``NewbornGradientRatio/...``, ``NewbornActivation/...`` and ``IncumbentActivation/...``.

Names follow Avalanche's template (``metric_name``); values reach every logger through the
``EvaluationPlugin``. Evaluation never changes the run: eval mode (restored), no gradients, and
the global RNG is restored after building the data loaders.
"""

from __future__ import annotations

import math
import warnings

import torch
from avalanche.evaluation import PluginMetric
from avalanche.evaluation.metric_results import MetricValue

from avalanche_plugins._avalanche.data import experience_batches, metric_name
from avalanche_plugins.core.calls import eval_mode, model_forward
from avalanche_plugins.core.checks import check_int

__all__ = ["CycleAccuracyMetric", "NewbornGradientMetric", "stream_accuracy", "trajectory_average",
           "quiet_evaluator"]


def trajectory_average(accuracies) -> float:
    """TAA: the mean of the accuracies evaluated along the trajectory.

    Example:
        >>> round(trajectory_average([0.5, 0.7, 0.9]), 6)
        0.7
    """
    values = [float(a) for a in accuracies]
    if not values:
        raise ValueError("accuracies is empty: TAA needs at least one evaluation")
    return sum(values) / len(values)


@torch.no_grad()
def stream_accuracy(strategy, experiences, *, batch_size: int = 256) -> float:
    """Top-1 accuracy of ``strategy.model`` over the union of ``experiences``' datasets (eval
    transforms; sample-weighted), on the strategy's device, in eval mode."""
    correct = total = 0
    model = strategy.model
    with eval_mode(model):
        for experience in experiences:
            data = experience.dataset
            data = data.eval() if hasattr(data, "eval") else data
            for x, y, t in experience_batches(strategy, dataset=data, batch_size=batch_size):
                pred = model_forward(model, x, torch.as_tensor(t).to(x.device)).argmax(1)
                correct += int((pred == y).sum())
                total += int(y.numel())
    if total == 0:
        raise ValueError("no test samples to evaluate")
    return correct / total


def quiet_evaluator(*metrics, loggers=()):
    """An ``EvaluationPlugin`` with ``metrics`` that does not warn about missing loggers."""
    from avalanche.training.plugins import EvaluationPlugin

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        return EvaluationPlugin(*metrics, loggers=list(loggers), collect_all=False)


class CycleAccuracyMetric(PluginMetric[float]):
    """Cumulative test accuracy at the end of every edit cycle, and TAA (module docstring).

    :param test_stream: the benchmark's test stream (indexable experiences).
    :param epochs_per_cycle, cycle_scope: the cycle definition; use the plugin's values.
    :param cumulative: evaluate on the experiences seen so far (True) or on the whole stream.
    :param eval_mb_size: evaluation batch size.

    ``trajectory`` holds ``(train iteration, accuracy)`` per cycle; ``taa`` its mean.
    """

    def __init__(self, test_stream, epochs_per_cycle: int = 1, *, cycle_scope: str = "stream",
                 cumulative: bool = True, eval_mb_size: int = 256):
        from avalanche_plugins.structural.plugins import CycleClock

        super().__init__()
        check_int("eval_mb_size", eval_mb_size)
        self.test_experiences = list(test_stream)
        if not self.test_experiences:
            raise ValueError("test_stream is empty")
        self.clock = CycleClock(epochs_per_cycle, cycle_scope)
        self.cumulative = cumulative
        self.eval_mb_size = eval_mb_size
        self.trajectory: list[tuple[int, float]] = []

    @property
    def taa(self) -> float:
        return trajectory_average([a for _, a in self.trajectory])

    def result(self) -> float | None:
        """The last cycle accuracy (None before the first cycle ended)."""
        return self.trajectory[-1][1] if self.trajectory else None

    def reset(self) -> None:
        self.trajectory = []

    def __str__(self) -> str:
        return "CycleAccuracy"

    def before_training_exp(self, strategy):
        self.clock.start_experience()

    def after_training_epoch(self, strategy):
        if not self.clock.end_epoch():
            return None
        current = getattr(strategy.experience, "current_experience", len(self.test_experiences) - 1)
        seen = self.test_experiences[:current + 1] if self.cumulative else self.test_experiences
        accuracy = stream_accuracy(strategy, seen, batch_size=self.eval_mb_size)
        x_plot = strategy.clock.train_iterations
        self.trajectory.append((x_plot, accuracy))
        return [MetricValue(self, metric_name("CycleAccuracy", strategy), accuracy, x_plot),
                MetricValue(self, metric_name("TAA", strategy), self.taa, x_plot)]


class NewbornGradientMetric(PluginMetric[float]):
    """Newborn/incumbent gradient ratio and activations per growth cycle (module docstring).

    :param grow_plugin: the :class:`~avalanche_plugins.structural.plugins.GrowPlugin` of the
        run (it measures; this metric emits). Attaching the metric turns the measurement on.
    """

    def __init__(self, grow_plugin):
        super().__init__()
        if not hasattr(grow_plugin, "newborn_log"):
            raise ValueError(f"grow_plugin must be a GrowPlugin, got {type(grow_plugin).__name__}")
        self.plugin = grow_plugin
        grow_plugin.track_newborn = True
        self._emitted = 0

    def result(self) -> float | None:
        """The last cycle's gradient ratio."""
        log = self.plugin.newborn_log
        return log[-1]["grad_ratio"] if log else None

    def reset(self) -> None:
        pass  # the plugin's log is the state

    def __str__(self) -> str:
        return "NewbornGradientRatio"

    def after_training_epoch(self, strategy):
        log = self.plugin.newborn_log
        values = []
        for record in log[self._emitted:]:
            for name, key in (("NewbornGradientRatio", "grad_ratio"), ("NewbornActivation", "newborn_act"),
                              ("IncumbentActivation", "incumbent_act")):
                if math.isfinite(record[key]):
                    values.append(MetricValue(self, metric_name(name, strategy), record[key],
                                              record["iteration"]))
        self._emitted = len(log)
        return values
