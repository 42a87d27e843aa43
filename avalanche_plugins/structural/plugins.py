"""Grow and Prune as Avalanche plugins: unit-level structural plasticity on a continual stream.

"On the Stability of Growth in Structural Plasticity" (arXiv 2605.15435) compares two edit
operators on hidden units (neurons / conv channels; the head is never masked):

* **Prune** (:class:`PrunePlugin`): iterative magnitude pruning at unit level with rewinding
  (lottery-ticket protocol). Each cycle removes the lowest-scoring fraction of the active units of
  every masked layer and rewinds *all* weights (survivors, head, BN statistics) bit for bit to the
  snapshot taken at ``rewind_to``; this repeats until the target compactness.
* **Grow** (:class:`GrowPlugin`): starts from a random sparse seed mask and each cycle recruits the
  masked units that would fire most often (post-activation above ``threshold`` on a minibatch, as
  if unmasked) or would receive the largest loss gradient; in place, no rewinding, newborn units
  are added, never swapped in. Insertion interventions (optimizer state, incoming / outgoing
  weights, newborn learning rate) are documented in :mod:`avalanche_plugins.structural.masks`.

**Cycles.** A cycle is ``epochs_per_cycle`` training epochs, or with ``cycle_unit="iterations"`` /
``"samples"`` / ``"minibatch_samples"`` ``cycle_length`` training iterations / stream samples (the
experience's own samples, replayed ones not counted) / minibatch samples (everything trained on,
replay included) (:mod:`avalanche_plugins.structural.cycles`; an iteration or sample cycle's edit
comes at the start of the iteration after the cycle ended, within an epoch). Edits happen at the start of every cycle but the first (Prune first trains the dense net, Grow first trains the seed), until every
masked layer has its target number of units ``max(1, round(c·units))``; later cycles only serve
as evaluation checkpoints. With ``cycle_scope="stream"`` the epoch count runs across
experiences, so a cycle may span an experience boundary and edits happen during the continual
stream (with one epoch per experience and ``epochs_per_cycle=1``: one edit at the start of every
experience after the first). With ``cycle_scope="experience"`` the count restarts with each
experience, so all edits of a cycle happen within one experience (at epochs ``k, 2k, …`` of it);
use it for a single-experience (IID) run or long experiences.

Per cycle Prune removes ``max(1, round(f·active))`` units of a layer (IMP: a fraction of what is
left) and Grow adds ``max(1, round(g·units))`` (a fraction of the full width), clipped at the
target. Scores are computed on ``score_samples`` random samples of the current experience
(evaluation transforms, seeded by ``seed + cycle``; the global RNG is not touched).

Masks are applied from the first ``before_training_exp`` (after the strategy's model adaptation);
parameters stay exact through ``before_update`` / ``after_update``, so a strategy whose training
loop never calls them (MER) is refused before training, and a strategy that replaces the model
(GDumb) gets the masks re-bound to the new one (``_MaskedTraining``). On an online stream
(``split_online_stream``) an epoch clock counts one pass over an original experience's
sub-stream as one epoch (edits at the first sub-experience of an original experience), while an
iteration or sample clock counts as on any stream (``cycle_unit="samples"`` is the natural choice
there); either way the stream must grant ``access_task_boundaries=True``
(:mod:`avalanche_plugins._avalanche.boundaries`: scores are computed on the original experience's
data, and ``cycle_scope="experience"`` restarts at its first sub-experience). Everything is plain Python and
tensors, so Avalanche checkpoints (dill) restore the run exactly; call
:func:`avalanche_plugins.fix_checkpoint_pickling` once for torch 2.14 optimizers.

**Masks in the model's state.** The masks are ``unit_mask`` buffers of the masked layers
(:mod:`avalanche_plugins.structural.hooks`), so ``strategy.model.state_dict()`` holds them and
``load_state_dict`` restores the mask a state was saved with, the masked units frozen at the loaded
values. Avalanche's ``EarlyStoppingPlugin`` therefore returns to its best epoch's model *and* mask;
put it before the editing plugin in ``plugins`` (its snapshot, at the start of an epoch, is then
the model it evaluated, before that epoch's edit), and an edit due at the epoch where it stops
training waits for the next epoch that runs. ``plugin.masks.export()`` gives the compact model's
state dict for a plain copy of the architecture (:meth:`UnitMasks.export`). Prune's rewinding
restores weights, never masks.

:func:`retrain_ticket` evaluates the final mask as a winning ticket; the metrics
(:class:`~avalanche_plugins.structural.metrics.CycleAccuracyMetric`,
:class:`~avalanche_plugins.structural.metrics.NewbornGradientMetric`) live in
:mod:`avalanche_plugins.structural.metrics`. The module is a little over 400 lines because the
three plugins share one masked-training base (mask creation, sync after model adaptation,
optimizer-step hooks) that only makes sense next to them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.supervised import Naive

from avalanche_plugins._avalanche.boundaries import at_origin, current_boundary, enter_boundary
from avalanche_plugins._avalanche.data import experience_example, experience_tensors
from avalanche_plugins._avalanche.distributed import (
    check_distributed,
    global_batch_size,
    plain_model,
)
from avalanche_plugins._avalanche.evaluation import quiet_evaluator, stream_accuracy
from avalanche_plugins._avalanche.loop import require_callbacks
from avalanche_plugins._avalanche.preflight import describe_error
from avalanche_plugins.core.calls import is_multitask
from avalanche_plugins.core.checks import check_choice, check_int
from avalanche_plugins.structural import (
    Interventions,
    UnitMasks,
    check_compactness,
    layer_counts,
    unit_scores,
)
from avalanche_plugins.structural.cycles import (
    CYCLE_SCOPES,
    CycleClock,
    check_sample_cycle,
)
from avalanche_plugins.structural.interventions import check_fresh_optimizer
from avalanche_plugins.structural.metrics import CycleAccuracyMetric

__all__ = ["FixedMaskPlugin", "PrunePlugin", "GrowPlugin",
           "TicketResult", "retrain_ticket"]


class _MaskedTraining(SupervisedPlugin, supports_distributed=True):
    """Creates the :class:`UnitMasks` at the first experience and keeps parameters exact.

    Before every experience it checks that the strategy's loop calls the callbacks the masks need
    (:func:`~avalanche_plugins._avalanche.loop.require_callbacks`; MER's does not) and follows the
    strategy's model: a strategy that replaced ``strategy.model`` (GDumb's fresh copy per
    experience, a user's template) gets the masks re-bound to the new model (:meth:`_rebind`), and
    at the first epoch of every experience the masked entries are re-snapshotted, so a reset of the
    weights in place (FromScratchTraining, after this plugin's ``before_training_exp``) freezes the
    masked units at their reset values. ``rebound`` lists the experiences whose model was new.
    """

    _edits = False  # the editing plugins change training at experience boundaries

    def __init__(self, *, activation: Callable = torch.relu):
        super().__init__()
        self.activation = activation
        self.masks: UnitMasks | None = None
        self.rebound: list[int] = []

    def _masks_created(self, strategy) -> None:  # subclasses set the initial mask
        pass

    def _required_callbacks(self) -> list[str]:
        return ["before_update", "after_update"]

    def before_training_exp(self, strategy, **kwargs):
        name = type(self).__name__
        check_distributed(self, strategy)  # under torchrun (avalanche_plugins._avalanche.distributed)
        boundary = enter_boundary(self, strategy, name, needs_access=self._edits)
        require_callbacks(name, strategy, self._required_callbacks(),
                          "the masked units' parameters are re-imposed around every optimizer step")
        self._refuse(strategy, boundary)  # before the masks exist: a refused run leaves the model as it was
        if self.masks is None:
            try:
                self.masks = UnitMasks(plain_model(strategy), experience_example(strategy), activation=self.activation)
            except Exception as error:  # no maskable layer, dict inputs, a model's own assert (ICaRL), ...
                kind = type(error) if isinstance(error, (ValueError, TypeError)) else RuntimeError
                raise kind(f"{name} refuses this model before training: {describe_error(error)}"
                           + ("" if kind is type(error) else f" ({type(error).__name__})")) from error
            self._masks_created(strategy)
        elif self.masks.model is not plain_model(strategy):
            self._rebind(strategy, boundary)
        else:
            # after Avalanche's model adaptation (a grown or added head), before any step
            self.masks.sync(experience_example(strategy) if is_multitask(plain_model(strategy)) else None)

    def _refuse(self, strategy, boundary) -> None:
        """Checks of the settings against the strategy, before any mask or training (subclasses)."""

    def _rebind(self, strategy, boundary) -> None:
        """Bind the masks to the strategy's new model: same layers and widths, the current masks
        applied (masked units output exactly 0 from the first step), unit ages and the last growth
        carried over; the masked entries are frozen at the new model's values."""
        old = self.masks
        new = UnitMasks(plain_model(strategy), experience_example(strategy), activation=self.activation)
        if new.sizes() != old.sizes():
            raise ValueError(f"{type(self).__name__}: {type(strategy).__name__} replaced the model by one whose "
                             f"maskable layers differ ({old.sizes()} -> {new.sizes()}), so the masks cannot "
                             "follow it; give the strategy a model of the same architecture")
        new.set_masks(old.masks)
        new.steps, new.last_grow_step = old.steps, old.last_grow_step
        new.born = {k: v.clone() for k, v in old.born.items()}
        new.interventions, new._grown_with = old.interventions, old.newborn_interventions
        self.masks = new
        self.rebound.append(boundary.index)

    def before_training_epoch(self, strategy, **kwargs):
        if strategy.clock.train_exp_epochs == 0:  # after every plugin's before_training_exp
            self.masks.set_masks(self.masks.masks)

    def before_update(self, strategy, **kwargs):
        self.masks.before_step()

    def after_update(self, strategy, **kwargs):
        self.masks.after_step(strategy.optimizer)

    def after_training_epoch(self, strategy, **kwargs):
        self.masks.restore()


def _clock_epoch_ends(boundary, strategy) -> bool:
    """Whether the epoch just trained counts on the cycle clock: every epoch offline; on an online
    stream one pass over an original experience's sub-stream (its last epoch of its last
    sub-experience) counts as one epoch, so cycles count original experiences, in samples."""
    return not boundary.online or (boundary.last and strategy.clock.train_exp_epochs == strategy.train_epochs - 1)


class FixedMaskPlugin(_MaskedTraining, supports_distributed=True):
    """Train with a fixed unit mask ``{layer name: bool tensor}`` (a ticket; no edits).

    :param mask: the mask, or a :class:`UnitMasks` whose current masks are copied.
    """

    def __init__(self, mask: Mapping[str, torch.Tensor] | UnitMasks, *, activation: Callable = torch.relu):
        super().__init__(activation=activation)
        masks = mask.masks if isinstance(mask, UnitMasks) else mask
        if not isinstance(masks, Mapping) or not masks:
            raise ValueError(f"mask must be a non-empty {{layer name: bool tensor}} or UnitMasks, got {mask!r}")
        self.mask = {name: torch.as_tensor(m, dtype=torch.bool).cpu().clone() for name, m in masks.items()}

    def _masks_created(self, strategy):
        self.masks.set_masks(self.mask)


class _EditingPlugin(_MaskedTraining, supports_distributed=True):
    """Shared cycle logic of Prune and Grow."""

    def __init__(self, target_compactness, epochs_per_cycle, score, threshold, cycle_scope,
                 score_samples, seed, activation, scores, cycle_unit="epochs", cycle_length=None):
        super().__init__(activation=activation)
        check_compactness("target_compactness", target_compactness)
        check_choice("cycle_scope", cycle_scope, CYCLE_SCOPES)
        clock = CycleClock(epochs_per_cycle, cycle_scope, unit=cycle_unit, length=cycle_length)
        check_choice("score", score, scores)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise ValueError(f"threshold must be a finite number, got {threshold!r}")
        check_int("score_samples", score_samples)
        check_int("seed", seed, minimum=0)
        self.target_compactness = target_compactness
        self.score, self.threshold = score, threshold
        self.score_samples, self.seed = score_samples, seed
        self.clock = clock
        self.targets: dict[str, int] = {}
        self.history: list[dict] = []  # one record per edit
        self._warned_scope = False

    @property
    def done(self) -> bool:
        """Every masked layer has its target number of active units."""
        return self.masks is not None and self.masks.active_counts() == self.targets

    _edits = True

    def before_training_exp(self, strategy, **kwargs):
        super().before_training_exp(strategy, **kwargs)
        boundary = current_boundary(self, strategy)
        if boundary.first:
            self.clock.start_experience()
        if (self.clock.counts_epochs and self.clock.scope == "experience"
                and strategy.train_epochs <= self.clock.epochs_per_cycle
                and not boundary.online and not self._warned_scope):
            self._warned_scope = True
            warnings.warn(f"cycle_scope='experience' with train_epochs={strategy.train_epochs} <= "
                          f"epochs_per_cycle={self.clock.epochs_per_cycle}: no edit can happen",
                          stacklevel=2)

    def _refuse(self, strategy, boundary) -> None:
        check_sample_cycle(type(self).__name__, self.clock, strategy)

    def before_training_epoch(self, strategy, **kwargs):
        super().before_training_epoch(strategy, **kwargs)
        if not self.clock.counts_epochs or getattr(strategy, "_stop_training", False):
            # a plugin before this one stopped training (EarlyStoppingPlugin, having reloaded its best
            # state): the epoch will not run, so the edit waits for the next epoch that does
            return
        boundary = current_boundary(self, strategy)
        at_start = not boundary.online or (boundary.first and strategy.clock.train_exp_epochs == 0)
        if at_start and self.clock.edit_due() and not self.done:
            self._edit(strategy)

    def before_training_iteration(self, strategy, **kwargs):
        if not self.clock.counts_epochs and self.clock.edit_due() and not self.done:
            self._edit(strategy)

    def after_training_iteration(self, strategy, **kwargs):
        if not self.clock.counts_epochs and self.clock.count_iteration(strategy):
            self._cycle_ended(strategy)

    def after_training_epoch(self, strategy, **kwargs):
        super().after_training_epoch(strategy, **kwargs)
        if (self.clock.counts_epochs and _clock_epoch_ends(current_boundary(self, strategy), strategy)
                and self.clock.end_epoch()):
            self._cycle_ended(strategy)

    def _cycle_ended(self, strategy) -> None:  # Grow closes its newborn record
        pass

    def _scores(self, strategy) -> dict[str, torch.Tensor]:
        if self.score == "weight_norm":
            return unit_scores(self.masks, "weight_norm")
        with at_origin(strategy, current_boundary(self, strategy)):
            x, y, t = experience_tensors(strategy, n_samples=self.score_samples,
                                         seed=self.seed + self.clock.cycle)
        return unit_scores(self.masks, self.score, x, y, loss_fn=strategy._criterion,
                           threshold=self.threshold, task_labels=t)

    def _record(self, strategy, edited: dict) -> None:
        self.history.append({
            "cycle": self.clock.cycle, "iteration": strategy.clock.train_iterations,
            "experience": current_boundary(self, strategy).origin_id,
            "units": {name: idx.tolist() for name, idx in edited.items()},
            "active": self.masks.active_counts(), "compactness": self.masks.compactness()})


class PrunePlugin(_EditingPlugin, supports_distributed=True):
    """Iterative unit pruning with rewinding, until ``target_compactness`` (module docstring).

    :param target_compactness: fraction of hidden units kept at the end, in (0, 1].
    :param prune_fraction_per_cycle: fraction of the *active* units of each layer removed per
        cycle, in (0, 1].
    :param epochs_per_cycle: training epochs per cycle (default 1; epoch clock only).
    :param score: ``"weight_norm"`` (``‖W_in[u]‖``, magnitude pruning) or ``"activation"``.
    :param rewind_to: ``"init"`` (the weights when the masks are created), an int ``k`` (after
        ``k`` training iterations; ``0`` is ``"init"``) or None (no rewinding, plain iterative
        pruning).
    :param threshold: activation threshold of the ``activation`` score.
    :param reset_optimizer: clear the optimizer state after each rewind (a restarted run).
    :param cycle_scope: ``"stream"`` or ``"experience"``.
    :param cycle_unit, cycle_length: ``"epochs"`` (``epochs_per_cycle``), or ``"iterations"`` /
        ``"samples"`` (stream samples: replayed ones not counted) / ``"minibatch_samples"`` (every
        sample trained on) with ``cycle_length`` of them per cycle
        (:mod:`avalanche_plugins.structural.cycles`; ``"samples"`` suits online streams).

    Example::

        prune = PrunePlugin(0.3, prune_fraction_per_cycle=0.2, epochs_per_cycle=1)
        strategy = Naive(model=model, optimizer=optimizer, plugins=[prune, ReplayPlugin(50)])
        for experience in benchmark.train_stream:
            strategy.train(experience)
        prune.masks.compactness(), prune.history[-1]["active"]
    """

    def __init__(self, target_compactness: float, prune_fraction_per_cycle: float = 0.2,
                 epochs_per_cycle: int | None = None, score: str = "weight_norm", rewind_to="init", *,
                 threshold: float = 0.0, reset_optimizer: bool = True, cycle_scope: str = "stream",
                 cycle_unit: str = "epochs", cycle_length: int | None = None,
                 score_samples: int = 256, seed: int = 0, activation: Callable = torch.relu):
        super().__init__(target_compactness, epochs_per_cycle, score, threshold, cycle_scope,
                         score_samples, seed, activation, ("weight_norm", "activation"), cycle_unit, cycle_length)
        check_compactness("prune_fraction_per_cycle", prune_fraction_per_cycle)
        if rewind_to is not None and rewind_to != "init":
            check_int("rewind_to", rewind_to, minimum=0)
        self.prune_fraction = prune_fraction_per_cycle
        self.rewind_to = 0 if rewind_to == "init" else rewind_to
        self.reset_optimizer = reset_optimizer
        self.rewind_state: dict[str, torch.Tensor] | None = None
        self._iterations = 0

    def _snapshot(self, strategy) -> None:
        self.rewind_state = {k: v.detach().clone() for k, v in plain_model(strategy).state_dict().items()}

    def _masks_created(self, strategy):
        self.targets = layer_counts(self.masks.sizes(), self.target_compactness)
        if self.rewind_to == 0:
            self._snapshot(strategy)

    def _refuse(self, strategy, boundary) -> None:
        super()._refuse(strategy, boundary)
        if self._iterations == 0 and self.rewind_to:
            # the first prune ends the first cycle: refuse a rewind point the run cannot reach first
            clock, first_prune = self.clock, None
            if clock.unit == "iterations":
                first_prune, how = clock.length, "iterations"
            elif clock.unit in ("samples", "minibatch_samples"):  # the group's minibatches under torchrun
                first_prune = math.ceil(clock.length / global_batch_size(strategy))
                how = f"minibatches of {global_batch_size(strategy)} samples to reach {clock.length} samples"
            elif clock.epochs_per_cycle <= strategy.train_epochs and not boundary.online:
                per_epoch = math.ceil(len(strategy.adapted_dataset) / global_batch_size(strategy))
                first_prune = clock.epochs_per_cycle * per_epoch
                how = f"{clock.epochs_per_cycle} epoch(s) of {per_epoch} minibatches"
            if first_prune is not None and self.rewind_to > first_prune:
                raise ValueError(f"PrunePlugin: rewind_to={self.rewind_to} iterations, but the first prune comes after "
                                 f"{first_prune} ({how}): choose rewind_to <= that, or 'init'")

    def after_training_iteration(self, strategy, **kwargs):
        super().after_training_iteration(strategy, **kwargs)
        self._iterations += 1
        if self.rewind_to is not None and self.rewind_state is None and self._iterations >= self.rewind_to:
            self._snapshot(strategy)

    def _edit(self, strategy):
        active = self.masks.active_counts()
        counts = {name: max(self.targets[name], n - max(1, round(self.prune_fraction * n)))
                  for name, n in active.items()}
        removed = self.masks.prune(self._scores(strategy), counts)
        if self.rewind_to is not None:
            if self.rewind_state is None:
                raise RuntimeError(f"rewind_to={self.rewind_to} iterations, but only "
                                   f"{self._iterations} ran before the first prune")
            self.masks.rewind(self.rewind_state)
            if self.reset_optimizer:
                strategy.optimizer.state.clear()
        self._record(strategy, removed)


class GrowPlugin(_EditingPlugin, supports_distributed=True):
    """Grow from a sparse seed mask to ``target_compactness``, in place (module docstring).

    :param target_compactness: fraction of hidden units active at the end, in (0, 1].
    :param seed_compactness: fraction active at the start (a random, seeded subset of each
        layer), in (0, target_compactness].
    :param grow_fraction_per_cycle: fraction of each layer's *full width* recruited per cycle.
    :param epochs_per_cycle: training epochs per cycle (default 1; epoch clock only).
    :param score: ``"activation"`` (how often ``φ(z_u) > threshold``, as if unmasked) or
        ``"gradient"`` (``‖∂L/∂W_out[:, u]‖`` with zero outgoing weights).
    :param threshold: activation threshold.
    :param optimizer_state, incoming, outgoing, newborn_lr, newborn_lr_halflife: insertion
        interventions (:class:`~avalanche_plugins.structural.interventions.Interventions`).
    :param cycle_scope: ``"stream"`` or ``"experience"``.
    :param cycle_unit, cycle_length: ``"epochs"`` (``epochs_per_cycle``), or ``"iterations"`` /
        ``"samples"`` (stream samples: replayed ones not counted) / ``"minibatch_samples"`` (every
        sample trained on) with ``cycle_length`` of them per cycle
        (:mod:`avalanche_plugins.structural.cycles`; ``"samples"`` suits online streams).

    :param track_newborn: also measure, during each cycle that began with growth, the mean per-unit
        gradient norm of newborn and incumbent units and their mean activation (``newborn_log``;
        :class:`~avalanche_plugins.structural.metrics.NewbornGradientMetric` emits them). Off by
        default: it costs one pass over the gradients per iteration.

    Example::

        grow = GrowPlugin(0.3, seed_compactness=0.1, grow_fraction_per_cycle=0.05,
                          outgoing="zero", optimizer_state="fresh", track_newborn=True)
        strategy = Naive(model=model, optimizer=optimizer, plugins=[grow],
                         evaluator=EvaluationPlugin(NewbornGradientMetric(grow)))
    """

    def __init__(self, target_compactness: float, seed_compactness: float,
                 grow_fraction_per_cycle: float = 0.1, epochs_per_cycle: int | None = None,
                 score: str = "activation", threshold: float = 0.0, *, optimizer_state: str = "keep",
                 incoming: str = "as_is", outgoing: str = "as_is", newborn_lr: float = 1.0,
                 newborn_lr_halflife: float = 100.0, cycle_scope: str = "stream",
                 cycle_unit: str = "epochs", cycle_length: int | None = None,
                 score_samples: int = 256, seed: int = 0, activation: Callable = torch.relu,
                 track_newborn: bool = False):
        super().__init__(target_compactness, epochs_per_cycle, score, threshold, cycle_scope,
                         score_samples, seed, activation, ("activation", "gradient"), cycle_unit, cycle_length)
        if not isinstance(track_newborn, bool):
            raise TypeError(f"track_newborn must be a bool, got {type(track_newborn).__name__}")
        check_compactness("seed_compactness", seed_compactness)
        if seed_compactness > target_compactness:
            raise ValueError(f"seed_compactness={seed_compactness} must not exceed "
                             f"target_compactness={target_compactness}")
        check_compactness("grow_fraction_per_cycle", grow_fraction_per_cycle)
        self.seed_compactness = seed_compactness
        self.grow_fraction = grow_fraction_per_cycle
        self.interventions = Interventions(optimizer_state, incoming, outgoing, newborn_lr,
                                           newborn_lr_halflife)
        self.track_newborn = track_newborn
        self.newborn_log: list[dict] = []  # one record per cycle that began with growth
        self._acc = None

    def _refuse(self, strategy, boundary) -> None:
        super()._refuse(strategy, boundary)
        if self.interventions.optimizer_state == "fresh":
            try:
                check_fresh_optimizer(strategy.optimizer)
            except ValueError as error:
                raise ValueError(f"GrowPlugin refuses the optimizer before training: {error}") from None

    def distributed_refusal(self) -> str | None:
        """Why this plugin refuses torchrun (None: it runs there)."""
        if self.track_newborn:
            return ("track_newborn=True measures newborn/incumbent activations on each rank's own training "
                    "minibatches, which differ between ranks; build it with track_newborn=False, or run in one process")
        return None

    def _required_callbacks(self) -> list[str]:
        tracked = ["before_forward", "after_forward", "after_backward"] if self.track_newborn else []
        return [*super()._required_callbacks(), *tracked]

    def _masks_created(self, strategy):
        needs = {"outgoing='zero'": self.interventions.outgoing == "zero", "score='gradient'": self.score == "gradient"}
        no_consumer = [name for name, layer in self.masks.layers.items() if layer.outgoing is None]
        if any(needs.values()) and no_consumer:
            # up front, not at the first growth an experience later (the model is left as it was)
            self.masks.detach()
            self.masks = None
            what = " and ".join(k for k, v in needs.items() if v)
            raise ValueError(f"GrowPlugin refuses this model before training: {what} needs the consumer (the "
                             f"layer reading its units) of every masked layer, and none was found for "
                             f"{no_consumer} (non-sequential model); use outgoing='as_is' / score='activation'")
        sizes = self.masks.sizes()
        self.targets = layer_counts(sizes, self.target_compactness)
        seeds = layer_counts(sizes, self.seed_compactness)
        generator = torch.Generator().manual_seed(self.seed)
        initial = {}
        for name, n in sizes.items():
            mask = torch.zeros(n, dtype=torch.bool)
            mask[torch.randperm(n, generator=generator)[:seeds[name]]] = True
            initial[name] = mask
        self.masks.set_masks(initial)

    def _edit(self, strategy):
        sizes, active = self.masks.sizes(), self.masks.active_counts()
        counts = {name: min(self.targets[name], n + max(1, round(self.grow_fraction * sizes[name])))
                  for name, n in active.items()}
        recruited = self.masks.grow(self._scores(strategy), counts, interventions=self.interventions,
                                    optimizer=strategy.optimizer)
        self._record(strategy, recruited)
        if self.track_newborn:
            self._acc = {"cycle": self.clock.cycle, "iterations": 0, "newborn_grad": 0.0,
                         "incumbent_grad": 0.0, "newborn_act": 0.0, "incumbent_act": 0.0,
                         "n_newborn": sum(int(m.sum()) for m in self.masks.newborn().values())}

    # ------------------------------------------------------------------- newborn diagnostics

    def _split(self, per_unit: dict[str, torch.Tensor]) -> tuple[float, float]:
        """Mean over newborn units and over incumbent (active, not newborn) units, pooled."""
        newborn, active = self.masks.newborn(), self.masks.masks
        values = {"new": [], "old": []}
        for name, v in per_unit.items():
            values["new"].append(v[newborn[name]])
            values["old"].append(v[active[name] & ~newborn[name]])
        if not values["new"]:  # nothing captured (no layer output recorded): nothing measured
            return float("nan"), float("nan")
        new, old = torch.cat(values["new"]), torch.cat(values["old"])
        return (float(new.mean()) if new.numel() else float("nan"),
                float(old.mean()) if old.numel() else float("nan"))

    def before_forward(self, strategy, **kwargs):
        if self._acc is not None:
            self.masks.record_outputs(True)  # training forwards only, not evaluations

    def after_forward(self, strategy, **kwargs):
        if self._acc is not None:
            outputs = self.masks.pop_outputs()
            self.masks.record_outputs(False)
            means = self.masks.unit_activation_means(outputs)
            new, old = self._split(means)
            self._acc["newborn_act"] += new
            self._acc["incumbent_act"] += old

    def after_backward(self, strategy, **kwargs):
        if self._acc is not None:
            new, old = self._split(self.masks.unit_grad_norms())
            self._acc["newborn_grad"] += new
            self._acc["incumbent_grad"] += old
            self._acc["iterations"] += 1

    def _cycle_ended(self, strategy) -> None:
        """Close the newborn record of the cycle that just ended (it began with growth)."""
        acc = self._acc
        if acc is not None:
            n = acc.pop("iterations")  # 0: no iteration measured, every value NaN (never logged)
            record = {k: (v / n if n else float("nan")) if k not in ("cycle", "n_newborn") else v
                      for k, v in acc.items()}
            record["iterations"] = n
            record["grad_ratio"] = record["newborn_grad"] / record["incumbent_grad"] \
                if record["incumbent_grad"] > 0 else float("nan")
            record["iteration"] = strategy.clock.train_iterations
            self.newborn_log.append(record)
            self._acc = None


# ------------------------------------------------------------------------------- tickets


@dataclass
class TicketResult:
    """Retrained-ticket evaluation: final cumulative accuracy, trajectory-average accuracy."""

    acc: float
    taa: float
    trajectory: list[tuple[int, float]] = field(default_factory=list)  # (iteration, accuracy)
    compactness: float = 1.0


def retrain_ticket(mask, model_factory: Callable[[], torch.nn.Module], stream, *,
                   optimizer_factory: Callable | None = None, train_epochs: int = 1,
                   train_mb_size: int = 32, eval_mb_size: int = 256,
                   plugins_factory: Callable[[], list] | None = None, epochs_per_cycle: int | None = None,
                   cycle_scope: str = "stream", cycle_unit: str = "epochs", cycle_length: int | None = None,
                   seed: int = 0, device="cpu",
                   activation: Callable = torch.relu) -> TicketResult:
    """Winning-ticket evaluation: freeze ``mask``, re-initialise, retrain on ``stream`` from scratch.

    ``torch.manual_seed(seed)``, ``model = model_factory()`` (fresh weights), then Avalanche's
    ``Naive`` with :class:`FixedMaskPlugin` (plus ``plugins_factory()``, e.g. a ``ReplayPlugin``)
    trains on every experience of ``stream.train_stream``. ACC is the accuracy on the test data of
    all experiences after the last one; TAA the mean of the cycle accuracies
    (:class:`~avalanche_plugins.structural.metrics.CycleAccuracyMetric`: cumulative test accuracy
    at the end of every ``epochs_per_cycle`` epochs, or ``cycle_length`` iterations / samples with
    ``cycle_unit``).

    :param mask: ``{layer name: bool tensor}`` or a :class:`UnitMasks` (its current masks).
    :param stream: an Avalanche benchmark (``train_stream``/``test_stream``) or an object with a
        ``.benchmark`` holding one.
    :param optimizer_factory: ``params -> optimizer`` (default ``SGD(lr=0.01)``).
    """
    benchmark = getattr(stream, "benchmark", stream)
    torch.manual_seed(seed)
    model = model_factory()
    optimizer = (optimizer_factory or (lambda p: torch.optim.SGD(p, lr=0.01)))(model.parameters())
    fixed = FixedMaskPlugin(mask, activation=activation)
    cycles = CycleAccuracyMetric(benchmark.test_stream, epochs_per_cycle, cycle_scope=cycle_scope,
                                 cycle_unit=cycle_unit, cycle_length=cycle_length, eval_mb_size=eval_mb_size)
    strategy = Naive(model=model, optimizer=optimizer, criterion=torch.nn.CrossEntropyLoss(),
                     train_mb_size=train_mb_size, train_epochs=train_epochs, eval_mb_size=eval_mb_size,
                     device=device, plugins=[fixed, *(plugins_factory() if plugins_factory else [])],
                     evaluator=quiet_evaluator(cycles))
    for experience in benchmark.train_stream:
        strategy.train(experience, num_workers=0)
    acc = stream_accuracy(strategy, list(benchmark.test_stream), batch_size=eval_mb_size)
    taa = cycles.taa if cycles.history else acc
    return TicketResult(acc=acc, taa=taa, trajectory=list(cycles.history),
                        compactness=fixed.masks.compactness())

