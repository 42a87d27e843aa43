"""Experience boundaries: where a component acts, on the benchmark's experiences or on an online stream.

Every plugin and metric of the package acts per *experience* (a Fisher and an anchor, a curvature
profile, a readiness measurement, a transport snapshot, an edit cycle). On an ordinary stream an
experience is what ``strategy.train`` receives. On an online stream
(``avalanche.benchmarks.scenarios.online.split_online_stream``, the OnlineNaive-style setting) it
receives sub-experiences of a few samples; each carries its *original* experience
(``origin_experience``), whether it is the first / last sub-experience of it and the length of the
sub-stream. A component then acts at the boundaries of the original experience:

* what it measured "before the experience" it measures at the **first** sub-experience, and what it
  measured "after the experience" at the **last**, once per original experience, never once per
  sub-experience;
* it measures on the original experience's data (:func:`at_origin` shows it the original
  experience as ``strategy.experience``), within its usual sample budget;
* its records and metric names carry the original experience's id.

Avalanche exposes these attributes to *logging and metrics* on every online stream
(``experience.logging()``), but to *training* only when the stream was built with
``access_task_boundaries=True``. So a metric (which never changes the run) measures at the
boundaries of any online stream, and a plugin whose effect changes training at a boundary (EWC's
Fisher and anchor, Grow/Prune's edit cycles, a re-measured learning-rate profile) asks for
``access_task_boundaries=True`` and refuses before training without it (:func:`enter_boundary`
with ``needs_access=True``). The last sub-experience is recognised by ``is_last_subexp`` or by
counting ``sub_stream_length`` sub-experiences (Avalanche 0.6's splitter leaves
``is_last_subexp`` False when the experience size divides the experience exactly).

A **task-agnostic** stream (``split_continuous_linear_decay_stream``, same module) has no original
experiences at all: each sub-experience mixes samples of several experiences and carries
``origin_experience=None`` (and no ``access_task_boundaries`` option).
A component that acts or measures per original experience (``needs_origin=True``, or one that
needs the boundaries during training, ``needs_access=True``) refuses it before training with a
message that says so (no stream option can expose boundaries there) and what stream would do; a
component that needs neither (a fixed mask, an iteration or sample clock) runs there, with the
sub-experience being trained as "its" experience (:func:`at_origin` changes nothing).
:func:`stream_kind` tells the four kinds of stream apart.

``JointTraining`` (one pass over every experience's data at once) is refused: a per-experience
quantity would describe experience 0 only; the message says how to get the same i.i.d. bound with
the component attached (Naive on one experience made of the concatenated stream).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

__all__ = [
    "STREAM_KINDS", "Boundary", "at_experience_end", "at_origin", "current_boundary", "enter_boundary",
    "evaluated_experience_id", "locate_boundary", "stream_kind"]

#: what :func:`stream_kind` returns: the benchmark's experiences, an online split that exposes its
#: boundaries to training, one that hides them (Avalanche's default), a task-agnostic stream
STREAM_KINDS = ("experiences", "online", "online_hidden", "continuous")

_TRACKER = "_boundary_tracker"


@dataclass(frozen=True)
class Boundary:
    """Where the current (sub-)experience sits.

    ``online``: a sub-experience of an online stream. ``access``: training may use the boundaries
    (always True offline). ``origin``: the experience to measure on (the original experience
    online, the strategy's experience otherwise; None on a task-agnostic stream, ``continuous``,
    whose sub-experiences have no original experience). ``index``: the original experience's position
    among those trained so far (``strategy.clock.train_exp_counter`` offline). ``first`` /
    ``last``: first / last sub-experience of the original experience (both True offline).
    ``origin_id``: the original experience's ``current_experience`` (None when it has none).
    ``position`` / ``length``: the sub-experience's index (from 0) in its original experience and
    the length of that sub-stream (0 / None offline); ``stream_index``: the sub-experience's own
    ``current_experience`` in the online stream (None offline). On a task-agnostic stream the whole
    stream counts as one original experience: ``first`` at its first sub-experience, ``last`` at
    its last.
    """

    online: bool
    access: bool
    origin: object
    index: int
    first: bool
    last: bool
    origin_id: int | None = None
    position: int = 0
    length: int | None = None
    stream_index: int | None = None
    continuous: bool = False


class _Tracker:
    """Counts sub-experiences of the current original experience (plain data: picklable)."""

    def __init__(self):
        self.position = -1  # index of the current sub-experience in its original experience
        self.started = 0  # original experiences started
        self.boundary: Boundary | None = None

    def __getstate__(self):
        # the current boundary holds an experience (its dataset): a checkpoint, taken between
        # experiences, does not need it (enter_boundary sets it again)
        return {**self.__dict__, "boundary": None}


def _view(experience):
    return experience.logging() if hasattr(experience, "logging") else experience


def _online_attributes(experience):
    """``(origin, first, last, length, access)`` of an online sub-experience, or None."""
    view = _view(experience)
    try:
        origin = view.origin_experience
    except (AttributeError, ValueError):  # MaskedAttributeError is a ValueError
        return None
    return (origin, bool(view.is_first_subexp), bool(view.is_last_subexp),
            getattr(view, "sub_stream_length", None), bool(getattr(view, "access_task_boundaries", False)))


def stream_kind(experience) -> str:
    """Which of :data:`STREAM_KINDS` ``experience`` belongs to: ``"experiences"`` (a benchmark's
    own experience), ``"online"`` / ``"online_hidden"`` (a ``split_online_stream`` sub-experience
    whose boundaries training may / may not read: ``access_task_boundaries``) or ``"continuous"``
    (a sub-experience without an original experience, as ``split_continuous_linear_decay_stream``
    builds them)."""
    online = _online_attributes(experience)
    if online is None:
        return "experiences"
    if online[0] is None:
        return "continuous"
    return "online" if online[4] else "online_hidden"


_NEEDS_ACCESS = "changes training with the stream's original experiences (at their boundaries, or with their data)"
_NEEDS_ORIGIN = "measures once per original experience of the stream, on that experience's data"
_CONTINUOUS = ("this stream is task-agnostic: its sub-experiences have no original experience (origin_experience is "
               "None; split_continuous_linear_decay_stream draws each one from several experiences at once)")


def _joint_training_refusal(component: str) -> str:
    return (f"{component} works per experience; JointTraining trains on all experiences at once (one experience, "
            "their concatenation), so its per-experience quantities would describe experience 0 only. For the same "
            f"i.i.d. bound with {component} attached, train Naive (same model, optimizer and epochs) on one experience "
            "made of the concatenated stream: strategy.train(benchmark_from_datasets(train=[concat_datasets("
            "[e.dataset for e in benchmark.train_stream])]).train_stream[0]) (benchmark_from_datasets from "
            "avalanche.benchmarks.scenarios, concat_datasets from avalanche.benchmarks.utils)")


def _stream_refusal(component: str, kind: str, needs: str, *, changes_training: bool) -> str | None:
    """The refusal of a ``kind`` stream for a component that ``needs`` the original experiences
    (None: the stream gives it what it needs)."""
    head = f"{component} refuses this stream before training: it {needs}, but "
    if kind == "continuous":
        if changes_training:
            return (head + _CONTINUOUS + ", so there are no boundaries to give it, and no option of that stream "
                    "changes it. Train on the original stream (benchmark.train_stream), or on an online split "
                    "that keeps its experiences: split_online_stream(benchmark.train_stream, experience_size, "
                    "access_task_boundaries=True)")
        return (head + _CONTINUOUS + ", so there is no experience to measure. Attach it to a run on the original "
                "stream (benchmark.train_stream), or on split_online_stream(benchmark.train_stream, "
                "experience_size), whose sub-experiences keep their original experience (a metric needs no "
                "access_task_boundaries)")
    if kind == "online_hidden" and changes_training:
        return (head + "this online stream hides its original experiences' boundaries from training "
                "(split_online_stream(..., access_task_boundaries=False), the default): build it with "
                "split_online_stream(..., access_task_boundaries=True), or train on the original stream")
    return None


def enter_boundary(owner, strategy, component: str | None = None, *, needs_access: bool = False,
                   needs_origin: bool = False, needs: str | None = None) -> Boundary:
    """Call at ``before_training_exp``: the :class:`Boundary` of the experience about to be
    trained, kept on ``owner`` for its later callbacks (:func:`current_boundary`).

    :param needs_access: the component changes training with the original experiences (at their
        boundaries or with their data): refused on an online stream that hides them
        (``access_task_boundaries=False``) and on a task-agnostic stream.
    :param needs_origin: the component measures once per original experience, on its data (a
        metric): refused on a task-agnostic stream (any ``split_online_stream`` serves it).
    :param needs: what the component does with them, for the message (a phrase following its
        name, e.g. ``"edits units at the start of every original experience"``).
    :raises ValueError: ``JointTraining``, or a stream that lacks what the component needs,
        naming ``component`` (default: ``owner``'s class), the stream and what to train on instead.
    """
    from avalanche.training.supervised import JointTraining

    component = component or type(owner).__name__
    if isinstance(strategy, JointTraining):
        raise ValueError(_joint_training_refusal(component))
    if needs_access or needs_origin:
        default = _NEEDS_ACCESS if needs_access else _NEEDS_ORIGIN
        refusal = _stream_refusal(component, stream_kind(strategy.experience), needs or default,
                                  changes_training=needs_access)
        if refusal is not None:
            raise ValueError(refusal)
    return locate_boundary(owner, strategy, component)


def locate_boundary(owner, strategy, component: str | None = None) -> Boundary:
    """:func:`enter_boundary` for an owner that only reports where training is (it accepts every
    strategy and stream, JointTraining included): the :class:`Boundary` of ``strategy.experience``,
    counted on ``owner`` (call it once per experience, at ``before_training_exp``)."""
    tracker = owner.__dict__.get(_TRACKER)
    if tracker is None:
        tracker = owner.__dict__[_TRACKER] = _Tracker()
    experience = strategy.experience
    online = _online_attributes(experience)
    if online is None:
        boundary = Boundary(False, True, experience, strategy.clock.train_exp_counter, True, True,
                            getattr(experience, "current_experience", None))
    else:
        origin, first, last, length, access = online
        if first or tracker.position < 0:
            tracker.position, first = 0, True
            tracker.started += 1
        else:
            tracker.position += 1
        last = last or (length is not None and tracker.position + 1 >= length)
        boundary = Boundary(True, access, None if origin is None else _view(origin), tracker.started - 1, first,
                            last, getattr(origin, "current_experience", None), tracker.position, length,
                            getattr(experience, "current_experience", None), continuous=origin is None)
    tracker.boundary = boundary
    return boundary


def current_boundary(owner, strategy) -> Boundary:
    """The boundary :func:`enter_boundary` recorded for the experience being trained (offline: the
    strategy's current experience, for an owner that never entered one)."""
    tracker = owner.__dict__.get(_TRACKER)
    if tracker is None or tracker.boundary is None:
        experience = strategy.experience
        return Boundary(False, True, experience, strategy.clock.train_exp_counter, True, True,
                        getattr(experience, "current_experience", None))
    return tracker.boundary


@contextlib.contextmanager
def at_origin(strategy, boundary: Boundary):
    """While it runs, ``strategy.experience`` is the original experience of an online
    sub-experience (its data, id and metric names); nothing changes offline, nor on a task-agnostic
    stream (no original experience: the sub-experience being trained stays)."""
    if not boundary.online or boundary.origin is None:
        yield
        return
    experience = strategy.experience
    strategy.experience = boundary.origin
    try:
        yield
    finally:
        strategy.experience = experience


def at_experience_end(owner, strategy, measure):
    """``measure(boundary)`` once per original experience, at its end: after every experience
    offline, after the last sub-experience online (with ``strategy.experience`` the original one,
    :func:`at_origin`); ``None`` after the other sub-experiences."""
    boundary = current_boundary(owner, strategy)
    if not boundary.last:
        return None
    with at_origin(strategy, boundary):
        return measure(boundary)


def evaluated_experience_id(experience) -> int | None:
    """The id of the experience being evaluated: its original experience's on an online stream
    (whose snapshots and records are keyed by the original experience), its own otherwise."""
    online = _online_attributes(experience)
    if online is not None:
        return getattr(online[0], "current_experience", None)
    return getattr(experience, "current_experience", None)
