"""Edit cycles of Grow / Prune: counting training into cycles, and the trajectory-average accuracy
over the cycles (plain Python; shared by the plugins and the metrics).

A cycle is ``length`` units of training, in one of four units (``cycle_unit``):

* ``"epochs"`` (the default; ``epochs_per_cycle``): a cycle ends after every ``length``-th training
  epoch and the next edit comes at the start of the following epoch. On an online stream
  (``split_online_stream``) one *pass over an original experience's sub-stream* counts as one
  epoch (whatever ``train_epochs`` / ``train_passes`` each sub-experience gets): the clock then
  counts original experiences, and edits come at the first sub-experience of an original
  experience.
* ``"iterations"``: a cycle ends after every ``length``-th training iteration (optimizer step of the
  strategy's loop) and the next edit comes at the start of the following iteration, whatever
  the experience or sub-experience boundaries.
* ``"samples"``: a cycle ends at the first iteration at which the **stream samples** counted so far
  reach the next multiple of ``length``; the edit comes at the start of the following iteration.
  Stream samples are the samples of the experience being trained (``strategy.experience.dataset``,
  a sub-experience on an online stream), **replayed samples excluded**: Avalanche's
  ``ReplayPlugin`` concatenates ``batch_size`` samples of the experience and ``batch_size_mem`` of
  its buffer into each minibatch (its ``ReplayDataLoader`` iterates the experience's data, then
  the buffer's), so an iteration counts ``min(len(minibatch), b, left)``: ``b`` the loader's batch
  size for the experience's own data (ReplayPlugin's ``batch_size``, the plain loader's
  ``batch_size``), ``left`` what the epoch has not counted yet of the ``len(experience.dataset)``
  samples an epoch brings. So with ``ReplayPlugin(batch_size=1)`` and ``train_mb_size=10`` (Avalanche's
  ``online_replay.py``: 1 new + 10 replayed samples per minibatch) an iteration counts 1, and "every
  500 samples" means every 500 samples of the stream. Every epoch over an experience counts its
  samples again; a strategy that trains on a buffer in place of the experience (GDumb) counts the
  experience's size per epoch, on its first minibatches.
* ``"minibatch_samples"``: the same, counting every sample of every minibatch (``len(strategy.mb_y)``:
  everything the model trained on, replayed samples included), i.e. the clock ``"samples"`` was
  before it excluded replay.

For both sample clocks a minibatch that reaches two multiples at once ends two cycles (``cycle``
counts both) with one edit and one evaluation; the plugins refuse ``length < train_mb_size`` before
training so that plain minibatches never do.

Iterations and samples do not depend on how a stream is cut, so they are the natural unit on an
online stream (an edit every 500 stream samples, say) and mean the same on any stream. With
``scope="stream"`` the count runs across experiences; with ``scope="experience"`` it restarts at
every (original) experience, so a cycle never spans an experience boundary and a cycle that
ends with the experience brings no edit.
"""

from __future__ import annotations

from avalanche_plugins.core.checks import check_choice, check_int
from avalanche_plugins.core.parallel import global_count, world_size

__all__ = ["CYCLE_SCOPES", "CYCLE_UNITS", "SAMPLE_UNITS", "CycleClock", "check_sample_cycle", "cycle_settings",
           "minibatch_samples", "own_batch_size", "trajectory_average"]


CYCLE_SCOPES = ("stream", "experience")
CYCLE_UNITS = ("epochs", "iterations", "samples", "minibatch_samples")
SAMPLE_UNITS = ("samples", "minibatch_samples")


def cycle_settings(epochs_per_cycle, cycle_unit: str, cycle_length) -> tuple[str, int]:
    """``(unit, length)`` of the cycle a component's arguments ask for, checked: ``epochs_per_cycle``
    (default 1) with ``cycle_unit="epochs"``, ``cycle_length`` with ``"iterations"`` / ``"samples"``
    (``cycle_length`` may repeat ``epochs_per_cycle`` with ``"epochs"``).

    Example:
        >>> cycle_settings(None, "epochs", None), cycle_settings(3, "epochs", None)
        (('epochs', 1), ('epochs', 3))
        >>> cycle_settings(None, "samples", 500)
        ('samples', 500)
        >>> cycle_settings(2, "iterations", 100)
        Traceback (most recent call last):
        ...
        ValueError: epochs_per_cycle=2 counts epochs, but cycle_unit='iterations': give the cycle length as cycle_length=... only
    """
    check_choice("cycle_unit", cycle_unit, CYCLE_UNITS)
    if cycle_unit == "epochs":
        if epochs_per_cycle is not None and cycle_length is not None and epochs_per_cycle != cycle_length:
            raise ValueError(f"epochs_per_cycle={epochs_per_cycle} and cycle_length={cycle_length} disagree "
                             "(with cycle_unit='epochs' both are the epochs per cycle): give one of them")
        length = epochs_per_cycle if epochs_per_cycle is not None else (cycle_length if cycle_length is not None else 1)
        check_int("epochs_per_cycle", length)
        return cycle_unit, length
    if epochs_per_cycle is not None:
        raise ValueError(f"epochs_per_cycle={epochs_per_cycle} counts epochs, but cycle_unit={cycle_unit!r}: "
                         "give the cycle length as cycle_length=... only")
    if cycle_length is None:
        raise ValueError(f"cycle_unit={cycle_unit!r} needs cycle_length (the {cycle_unit} per cycle)")
    check_int("cycle_length", cycle_length)
    return cycle_unit, cycle_length


def minibatch_samples(strategy) -> int:
    """The training samples of the current iteration, replayed ones included (what a
    ``"minibatch_samples"`` clock counts)."""
    targets = getattr(strategy, "mb_y", None)
    return int(len(targets)) if targets is not None else int(len(strategy.mb_x))


def own_batch_size(strategy) -> int | None:
    """How many samples of the experience's own data (``strategy.adapted_dataset``) the strategy's
    training loader puts in a minibatch, or None when it does not say.

    Avalanche's multi-dataset loaders (``ReplayDataLoader``, ``TaskBalancedDataLoader``, duck-typed
    on their ``datasets`` / ``batch_sizes``) list the experience's data first (whole or split by
    task) and a replay buffer after it: the batch sizes of the leading datasets that make up
    ``adapted_dataset`` add up to the answer. A plain ``DataLoader`` answers its ``batch_size``."""
    loader = getattr(strategy, "dataloader", None)
    datasets, sizes = getattr(loader, "datasets", None), getattr(loader, "batch_sizes", None)
    if datasets is None or sizes is None:
        size = getattr(loader, "batch_size", None)
        return int(size) if isinstance(size, int) else None
    own = len(strategy.adapted_dataset) if getattr(strategy, "adapted_dataset", None) is not None else None
    total = batch = 0
    for dataset, size in zip(datasets, sizes):
        if own is not None and total >= own:
            break
        total += len(dataset)
        batch += int(size)
    return batch or None


def _experience_size(strategy) -> int:
    experience = getattr(strategy, "experience", None)
    data = getattr(experience, "dataset", None)
    return len(data) if data is not None else len(strategy.adapted_dataset)


class CycleClock:
    """Counts training epochs, iterations or samples into edit cycles (module docstring).

    The epoch clock (``end_epoch`` after every counted epoch, ``edit_due`` at the start of every
    epoch):

    Example:
        >>> clock = CycleClock(epochs_per_cycle=2, scope="stream")
        >>> events = []
        >>> for epoch in range(5):
        ...     events.append((clock.edit_due(), clock.end_epoch()))
        >>> events  # (edit at the start of the epoch, cycle ends after it)
        [(False, False), (False, True), (True, False), (False, True), (True, False)]

    The sample clocks (``count_iteration(strategy)`` after every iteration, which is
    ``end_iteration(samples)`` with the samples the unit counts, ``edit_due`` at the start of every
    iteration), minibatches of 10, 10, 10, 4 (an epoch's last) and 10 samples, 25 per cycle:

        >>> clock = CycleClock(unit="samples", length=25)
        >>> [(clock.edit_due(), clock.end_iteration(n)) for n in (10, 10, 10, 4, 10)]
        [(False, False), (False, False), (False, True), (True, False), (False, False)]
        >>> clock.count, clock.cycle
        (44, 1)
    """

    # class defaults: a clock pickled before the unit existed (an epoch clock) restores as one
    unit, length, count, _due = "epochs", None, 0, False
    # the epoch whose stream samples are being counted: (experience counter, epoch), what it has left
    _epoch_key, _left, _own_batch = None, 0, None
    # a "samples" clock pickled before it excluded replay goes on counting every minibatch sample
    _excludes_replay = False

    def __init__(self, epochs_per_cycle: int | None = None, scope: str = "stream", *, unit: str = "epochs",
                 length: int | None = None):
        unit, length = cycle_settings(epochs_per_cycle, unit, length)
        check_choice("cycle_scope", scope, CYCLE_SCOPES)
        self.unit, self.length, self.scope = unit, length, scope
        self.epochs_per_cycle = length if unit == "epochs" else None
        self.epoch = 0  # epochs done in the current scope (epoch clock)
        self.count = 0  # iterations / samples done in the current scope (iteration and sample clocks)
        self.cycle = 0  # cycles completed (all scopes)
        self._due = False  # iteration and sample clocks: the last counted iteration ended a cycle
        self._excludes_replay = True

    @property
    def counts_epochs(self) -> bool:
        return self.unit == "epochs"

    def start_experience(self) -> None:
        if self.scope == "experience":
            self.epoch = self.count = 0
            self._due = False

    def edit_due(self) -> bool:
        """Epochs: True at the start of the first epoch of every cycle but the first. Iterations and
        samples: True at the start of the iteration after the one that ended a cycle."""
        if self.unit == "epochs":
            return self.epoch > 0 and self.epoch % self.epochs_per_cycle == 0
        return self._due

    def end_epoch(self) -> bool:
        """Count one epoch; True if it completed a cycle (epoch clock)."""
        self.epoch += 1
        ended = self.epoch % self.epochs_per_cycle == 0
        self.cycle += int(ended)
        return ended

    def count_iteration(self, strategy) -> bool:
        """After a training iteration of ``strategy``: count what the unit counts (one iteration, the
        iteration's stream samples, or all its samples); True if a cycle ended (iteration and sample
        clocks)."""
        return self.end_iteration(self.iteration_amount(strategy))

    def iteration_amount(self, strategy) -> int:
        """What the current iteration adds to the clock (module docstring)."""
        if self.unit == "iterations":
            return 1
        # samples are the group's under torchrun: W ranks train a minibatch of the same size each
        if self.unit == "minibatch_samples" or not self._excludes_replay:
            return global_count(minibatch_samples(strategy))
        clock = getattr(strategy, "clock", None)
        key = (getattr(clock, "train_exp_counter", None), getattr(clock, "train_exp_epochs", None))
        if key != self._epoch_key:  # a new epoch (or experience): it brings the experience's samples
            share = -(-_experience_size(strategy) // world_size())  # a rank's share of the experience
            self._epoch_key, self._left, self._own_batch = key, share, own_batch_size(strategy)
        n = minibatch_samples(strategy)
        own = max(0, min(n, self._left, self._own_batch if self._own_batch is not None else n))
        self._left -= own
        return global_count(own)

    def end_iteration(self, samples: int = 1) -> bool:
        """Count one iteration of ``samples`` training samples; True if it completed a cycle (or
        several: ``cycle`` counts each) (iteration and sample clocks)."""
        before = self.count // self.length
        self.count += 1 if self.unit == "iterations" else int(samples)
        ended = self.count // self.length - before
        self.cycle += ended
        self._due = ended > 0
        return self._due


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


def check_sample_cycle(component: str, clock: CycleClock, strategy) -> None:
    """Before training: a sample clock's cycle must hold at least one minibatch (``train_mb_size``),
    else one minibatch would end several cycles at once (the group's minibatch under torchrun)."""
    mb_size = getattr(strategy, "train_mb_size", None)
    mb_size = global_count(mb_size) if isinstance(mb_size, int) else mb_size
    if clock.unit in SAMPLE_UNITS and isinstance(mb_size, int) and clock.length < mb_size:
        raise ValueError(f"{component}: cycle_length={clock.length} samples is shorter than one minibatch "
                         f"(train_mb_size={mb_size}), so one minibatch would end several cycles: choose "
                         f"cycle_length >= {mb_size}, or cycle_unit='iterations'")
