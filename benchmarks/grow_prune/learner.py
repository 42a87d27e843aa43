"""One Grow / Prune / dense run of a setting: its plugin, its clocks, the newborn-unit course, and the masked/dense cost per epoch."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from avalanche_plugins import (
    CycleAccuracyMetric,
    FixedMaskPlugin,
    GrowPlugin,
    NewbornGradientMetric,
    PrunePlugin,
    quiet_evaluator,
    retrain_ticket,
    stream_accuracy,
)
from avalanche_plugins.structural.cycles import CycleClock
from avalanche_plugins.study.jobs import Timer, seed_everything
from avalanche_plugins.study.jobs.environment import quiet_deprecations
from benchmarks.grow_prune.settings import (
    _LEAKY,
    GROW_VARIANTS,
    Setting,
    make_model,
    make_optimizer,
    uses_leaky,
)


class DelayedEditClock(CycleClock):
    """Stream-scope cycles, the edit ``edit_epoch`` epochs into each (docs, "Fixed budget").

    Example:
        >>> clock = DelayedEditClock(epochs_per_cycle=4, edit_epoch=3)
        >>> [epoch for epoch in range(12) if (clock.edit_due(), clock.end_epoch())[0]]
        [7, 11]
    """

    def __init__(self, epochs_per_cycle: int, edit_epoch: int):
        super().__init__(epochs_per_cycle, "stream")
        if not 0 <= edit_epoch < epochs_per_cycle:
            raise ValueError(f"edit_epoch must be in [0, {epochs_per_cycle}), got {edit_epoch}")
        self.edit_epoch = edit_epoch

    def edit_due(self) -> bool:
        return self.epoch >= self.epochs_per_cycle and self.epoch % self.epochs_per_cycle == self.edit_epoch


def make_plugin(method: str, setting: Setting, c: float, seed: int):
    scope = "experience" if setting.n_experiences == 1 else "stream"
    if method == "dense":
        return None
    if method in ("prune", "prune+norewind"):
        fraction = 1 - c ** (1 / setting.edits)  # IMP: (1 - f)^edits = c
        plugin = PrunePlugin(c, prune_fraction_per_cycle=min(1.0, fraction + 1e-9),
                             epochs_per_cycle=setting.epochs_per_cycle,
                             rewind_to="init" if method == "prune" else None, cycle_scope=scope, seed=seed,
                             activation=_LEAKY if setting.leaky else torch.relu)
    else:
        seed_c = c / 2
        activation = _LEAKY if uses_leaky(setting, method) else torch.relu
        plugin = GrowPlugin(c, seed_compactness=seed_c, grow_fraction_per_cycle=(c - seed_c) / setting.edits + 1e-9,
                            epochs_per_cycle=setting.epochs_per_cycle, score="activation", threshold=0.0,
                            cycle_scope=scope, seed=seed, activation=activation, track_newborn=True,
                            **GROW_VARIANTS[method])
    if setting.edit_epoch:
        plugin.clock = DelayedEditClock(setting.epochs_per_cycle, setting.edit_epoch)
    return plugin


class NewbornCourse:
    """Newborn/incumbent gradient ratio after every growth of a :class:`GrowPlugin` (an Avalanche
    plugin placed after it; ``events``: docs/benchmarks.md, "Newborn course")."""

    def __init__(self, grow: GrowPlugin, bin: int = 10):
        from avalanche.core import SupervisedPlugin

        self.grow, self.bin, self.events, self._seen = grow, bin, [], 0
        self._new = self._old = 0.0
        self._n = 0
        self.plugin = type("NewbornCoursePlugin", (SupervisedPlugin,), {"after_backward": self._after_backward})()

    def _after_backward(self, strategy, **kwargs):
        masks = self.grow.masks
        if masks is None or not self.grow.history:
            return
        if len(self.grow.history) != self._seen:
            self._seen = len(self.grow.history)
            self.events.append({"edit": self._seen, "iteration": strategy.clock.train_iterations, "ratio": []})
            self._new = self._old = 0.0
            self._n = 0
        newborn, active = masks.newborn(), masks.masks
        grads = masks.unit_grad_norms()
        new = torch.cat([g[newborn[k]] for k, g in grads.items()])
        old = torch.cat([g[active[k] & ~newborn[k]] for k, g in grads.items()])
        if not new.numel() or not old.numel():
            return
        self._new += float(new.mean())
        self._old += float(old.mean())
        self._n += 1
        if self._n == self.bin:
            self.events[-1]["ratio"].append(self._new / self._old if self._old > 0 else float("nan"))
            self._new = self._old = 0.0
            self._n = 0


def steps_to_parity(ratios, bin: int = 10, window: int = 3) -> tuple[int | None, int]:
    """Iterations after insertion until the newborn gradient ratio reaches 1 ("Newborn course").

    Example:
        >>> steps_to_parity([0.2, 0.5, 0.9, 1.2, 1.3, 1.1], bin=10, window=2)
        (40, 60)
    """
    r = np.asarray(ratios, dtype=float)
    for i in range(window - 1, len(r)):
        if np.nanmean(r[i - window + 1:i + 1]) >= 1.0:
            return (i + 1) * bin, len(r) * bin
    return None, len(r) * bin


class CurrentTaskAccuracy:
    """Test accuracy on each experience right after training on it, as an Avalanche plugin."""

    def __init__(self, test_stream):
        from avalanche.core import SupervisedPlugin

        self.test, self.values = list(test_stream), []
        self.plugin = type("CurrentTaskAccuracyPlugin", (SupervisedPlugin,),
                           {"after_training_exp": self._after_exp})()

    def _after_exp(self, strategy, **kwargs):
        i = strategy.experience.current_experience
        self.values.append(stream_accuracy(strategy, [self.test[i]], batch_size=512))


def replay(setting: Setting):
    from avalanche.training.plugins import ReplayPlugin

    return [ReplayPlugin(mem_size=10 * setting.replay_per_class)] \
        if setting.n_experiences > 1 and setting.replay_per_class else []


def run_one(setting: Setting, stream, method: str, c: float, seed: int, *, ticket: bool = True) -> dict:
    from avalanche.training.supervised import Naive

    seed_everything(seed)
    leaky = uses_leaky(setting, method)
    model = make_model(setting, stream.n_classes, stream.input_shape, leaky)
    plugin = make_plugin(method, setting, c, seed)
    scope = "experience" if setting.n_experiences == 1 else "stream"
    cycles = CycleAccuracyMetric(stream.benchmark.test_stream, setting.epochs_per_cycle, cycle_scope=scope)
    metrics = [cycles] + ([NewbornGradientMetric(plugin)] if isinstance(plugin, GrowPlugin) else [])
    course = NewbornCourse(plugin) if isinstance(plugin, GrowPlugin) else None
    current = CurrentTaskAccuracy(stream.benchmark.test_stream) if setting.n_experiences > 1 else None
    extra = [x.plugin for x in (course, current) if x is not None]
    strategy = Naive(model=model, optimizer=make_optimizer(setting, model.parameters()),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=setting.batch_size,
                     train_epochs=setting.epochs, eval_mb_size=512, device="cpu",
                     plugins=[p for p in [plugin] if p is not None] + replay(setting) + extra,
                     evaluator=quiet_evaluator(*metrics))
    with Timer() as timer, quiet_deprecations():
        for experience in stream.benchmark.train_stream:
            strategy.train(experience, num_workers=0)
    row = {"setting": setting.name, "method": method, "compactness": c if plugin else 1.0, "seed": seed,
           "acc": stream_accuracy(strategy, list(stream.benchmark.test_stream), batch_size=512),
           "taa": cycles.taa, "trajectory": list(cycles.history), "wall_s": timer.seconds,
           "ticket_acc": None, "ticket_taa": None, "newborn_grad_ratio": None}
    if plugin is not None:
        row["final_compactness"] = plugin.masks.compactness()
        row["edits"] = plugin.history
    if isinstance(plugin, GrowPlugin):
        ratios = [r["grad_ratio"] for r in plugin.newborn_log if math.isfinite(r["grad_ratio"])]
        row["newborn_grad_ratio"] = float(np.mean(ratios)) if ratios else None
        row["newborn_log"] = plugin.newborn_log
        row["newborn_course"] = course.events
        parity = [steps_to_parity(e["ratio"], course.bin) for e in course.events]
        row["steps_to_parity"] = [p[0] for p in parity]
        row["steps_observed"] = [p[1] for p in parity]
    if current is not None:
        row["current_task_acc"] = current.values
        row["plasticity"] = float(np.mean(current.values))
    if plugin is not None and ticket and setting.ticket:
        with quiet_deprecations():
            result = retrain_ticket(
                plugin.masks.masks, lambda: make_model(setting, stream.n_classes, stream.input_shape, leaky),
                stream, optimizer_factory=lambda p: make_optimizer(setting, p),
                train_epochs=setting.epochs, train_mb_size=setting.batch_size,
                plugins_factory=lambda: replay(setting), seed=seed + 1000,
                epochs_per_cycle=setting.epochs_per_cycle, cycle_scope=scope, activation=plugin.activation)
        row["ticket_acc"], row["ticket_taa"] = result.acc, result.taa
    return row


def time_per_epoch(setting: Setting, stream, c: float | None, repeats: int = 3) -> float:
    """Seconds per epoch on the first experience, dense (``c`` None) or masked at ``c``
    (the minimum over ``repeats``)."""
    from avalanche.training.supervised import Naive

    best = math.inf
    for r in range(repeats):
        seed_everything(r)
        model = make_model(setting, stream.n_classes, stream.input_shape)
        plugins = [] if c is None else [_RandomMaskPlugin(c, r)]
        strategy = Naive(model=model, optimizer=make_optimizer(setting, model.parameters()),
                         criterion=nn.CrossEntropyLoss(), train_mb_size=setting.batch_size, train_epochs=2,
                         device="cpu", plugins=plugins, evaluator=quiet_evaluator())
        with Timer() as timer:
            strategy.train(stream.benchmark.train_stream[0], num_workers=0)
        best = min(best, timer.seconds / 2)
    return best


class _RandomMaskPlugin(FixedMaskPlugin):
    """A fixed random mask at compactness ``c`` (timing only)."""

    def __init__(self, c, seed):
        super().__init__({"_": torch.ones(1)})  # placeholder: the real mask is drawn below
        self.c, self.seed = c, seed

    def _masks_created(self, strategy):
        g = torch.Generator().manual_seed(self.seed)
        self.masks.set_masks({name: torch.randperm(n, generator=g) < max(1, round(self.c * n))
                              for name, n in self.masks.sizes().items()})
