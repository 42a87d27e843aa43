"""Metrics of the Grow / Prune study as Avalanche plugin metrics.

* :class:`CycleAccuracyMetric` — at the end of every edit cycle (every ``epochs_per_cycle``
  training epochs, or ``cycle_length`` iterations / samples with ``cycle_unit``, counted like
  :class:`~avalanche_plugins.structural.cycles.CycleClock`), the
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

Before training ``CycleAccuracyMetric`` runs the pre-flight and one evaluation forward on the
test stream (a strategy that cannot evaluate yet, ICaRL before its class means, is refused there,
named). On an online stream an epoch clock's epoch is one pass over an original experience's
sub-stream, an iteration or sample clock counts as on any stream (its cycles may end inside an
original experience), and the accuracy covers the original experiences seen so far. A newborn-gradient cycle that measured no
iteration is kept in ``history`` (``iterations == 0``) and logs nothing.

Names follow Avalanche's template (``metric_name``); values reach every logger through the
``EvaluationPlugin``. Evaluation never changes the run: eval mode (restored), no gradients, and
the global RNG is restored after building the data loaders.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader

from avalanche_plugins._avalanche.boundaries import current_boundary, enter_boundary
from avalanche_plugins._avalanche.data import TransientCache
from avalanche_plugins._avalanche.evaluation import stream_accuracy
from avalanche_plugins._avalanche.preflight import preflight
from avalanche_plugins._avalanche.recording import RecordingMetric
from avalanche_plugins.core.calls import eval_mode, model_forward
from avalanche_plugins.core.checks import check_int
from avalanche_plugins.core.outputs import logits_of
from avalanche_plugins.structural.cycles import (
    CycleClock,
    check_sample_cycle,
    trajectory_average,
)

__all__ = ["CycleAccuracyMetric", "NewbornGradientMetric"]


class CycleAccuracyMetric(RecordingMetric[float]):
    """Cumulative test accuracy at the end of every edit cycle, and TAA (module docstring).

    :param test_stream: the benchmark's test stream (indexable experiences).
    :param epochs_per_cycle, cycle_scope, cycle_unit, cycle_length: the cycle definition
        (:class:`~avalanche_plugins.structural.cycles.CycleClock`); use the plugin's values.
    :param cumulative: evaluate on the experiences seen so far (True) or on the whole stream.
    :param eval_mb_size: evaluation batch size.
    :param eval_samples: samples of each test experience evaluated at a cycle: every
        ``⌈n / eval_samples⌉``-th of an experience of ``n`` (all of them when ``n`` is not larger,
        or for None), the same samples at every cycle, for every strategy and seed. Evaluating
        the seen experiences at every cycle is most of the metric's cost (17 % of training on
        Split Fashion-MNIST at 5 epochs per experience with the whole 2,000-sample experiences);
        the default 500 has a standard error of at most 2.2 / √k points on k experiences, and,
        as every method is evaluated on the same samples, far less in a comparison of methods
        (docs/RESULTS.md, "What the diagnostics cost").

    The test experiences' evaluation batches are read once and kept for the run (up to 1 GiB:
    :func:`~avalanche_plugins._avalanche.evaluation.stream_accuracy`'s cache): every later cycle
    only runs the model on them.

    ``history`` holds ``(train iteration, accuracy)`` per cycle; ``taa`` its mean.
    """

    supports_distributed = True  # under torchrun: whole test experiences, the group's sample clock (_avalanche.distributed)

    def __init__(self, test_stream, epochs_per_cycle: int | None = None, *, cycle_scope: str = "stream",
                 cycle_unit: str = "epochs", cycle_length: int | None = None,
                 cumulative: bool = True, eval_mb_size: int = 256, eval_samples: int | None = 500):
        super().__init__()
        check_int("eval_mb_size", eval_mb_size)
        if eval_samples is not None:
            check_int("eval_samples", eval_samples)
        self.eval_samples = eval_samples
        self.test_experiences = list(test_stream)
        if not self.test_experiences:
            raise ValueError("test_stream is empty")
        self.clock = CycleClock(epochs_per_cycle, cycle_scope, unit=cycle_unit, length=cycle_length)
        self.cumulative = cumulative
        self.eval_mb_size = eval_mb_size
        self._test_batches = TransientCache()  # each test experience read once (stream_accuracy's cache)

    def reset_state(self) -> None:
        self._test_batches = TransientCache()

    @property
    def taa(self) -> float:
        return trajectory_average([a for _, a in self.history])

    def result_of(self, record: tuple[int, float]) -> float:
        """The last cycle accuracy (None before the first cycle ended)."""
        return record[1]

    def __str__(self) -> str:
        return "CycleAccuracy"

    def before_training_exp(self, strategy):
        boundary = enter_boundary(self, strategy, "CycleAccuracyMetric")
        # before any training: evaluation must run at the cycle points (ICaRL's does not before its
        # class means exist), on the model and on the test stream's first batch
        preflight(self, strategy, self._probe, layer_map=False, takes_output_transform=False)
        if boundary.first:
            self.clock.start_experience()
        check_sample_cycle("CycleAccuracyMetric", self.clock, strategy)

    def _probe(self, model, loss_fn, x, y, task_labels):
        """The model's evaluation forward on two test samples of the first test experience."""
        data = self.test_experiences[0].dataset
        data = data.eval() if hasattr(data, "eval") else data
        batch = next(iter(DataLoader(data, batch_size=2, collate_fn=getattr(data, "collate_fn", None))))
        inputs = batch[0].to(x.device)
        tasks = torch.as_tensor(batch[2]) if len(batch) >= 3 else torch.zeros(len(inputs), dtype=torch.long)
        with eval_mode(model), torch.no_grad():
            logits_of(model_forward(model, inputs, tasks.to(x.device)))

    def after_training_iteration(self, strategy):
        if self.clock.counts_epochs or not self.clock.count_iteration(strategy):
            return None
        return self._cycle_ended(strategy, current_boundary(self, strategy))

    def after_training_epoch(self, strategy):
        if not self.clock.counts_epochs:
            return None
        boundary = current_boundary(self, strategy)
        if boundary.online and not (boundary.last and strategy.clock.train_exp_epochs == strategy.train_epochs - 1):
            return None  # online: one pass over the original experience's sub-stream is one epoch
        if not self.clock.end_epoch():
            return None
        return self._cycle_ended(strategy, boundary)

    def _cycle_ended(self, strategy, boundary):
        current = boundary.origin_id if boundary.origin_id is not None else len(self.test_experiences) - 1
        seen = self.test_experiences[:current + 1] if self.cumulative else self.test_experiences
        accuracy = stream_accuracy(strategy, seen, batch_size=self.eval_mb_size, cache=self._test_batches,
                                   samples_per_experience=self.eval_samples)
        self.history.append((strategy.clock.train_iterations, accuracy))
        return self.emit(strategy, {"CycleAccuracy": accuracy, "TAA": self.taa})


class NewbornGradientMetric(RecordingMetric[float]):
    """Newborn/incumbent gradient ratio and activations per growth cycle (module docstring).

    :param grow_plugin: the :class:`~avalanche_plugins.structural.plugins.GrowPlugin` of the run,
        built with ``track_newborn=True`` (the plugin measures; this metric emits and keeps the
        records in ``history``).
    """

    result_key = "grad_ratio"  # result(): the last growth cycle's gradient ratio
    supports_distributed = False  # refused under torchrun: distributed_refusal

    def __init__(self, grow_plugin):
        super().__init__()
        if not hasattr(grow_plugin, "newborn_log"):
            raise ValueError(f"grow_plugin must be a GrowPlugin, got {type(grow_plugin).__name__}")
        if not grow_plugin.track_newborn:
            raise ValueError("grow_plugin does not measure newborn gradients: build it with "
                             "GrowPlugin(..., track_newborn=True)")
        self.plugin = grow_plugin

    def __str__(self) -> str:
        return "NewbornGradientRatio"

    @staticmethod
    def distributed_refusal() -> str:
        return ("the newborn and incumbent activations it logs are means over each rank's own training "
                "minibatches, which differ between ranks; run it in one process (GrowPlugin itself runs under "
                "torchrun with track_newborn=False)")

    def after_training_epoch(self, strategy):
        values = []
        for record in self.plugin.newborn_log[len(self.history):]:
            self.history.append(record)
            if not record.get("iterations", 1):  # nothing measured in the cycle: nothing logged
                continue
            values += self.emit(strategy, {name: record[key] if math.isfinite(record[key]) else None
                                           for name, key in (("NewbornGradientRatio", "grad_ratio"),
                                                             ("NewbornActivation", "newborn_act"),
                                                             ("IncumbentActivation", "incumbent_act"))},
                                x=record["iteration"])
        return values
