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

``JointTraining`` (one pass over every experience's data at once) is refused: a per-experience
quantity would describe experience 0 only.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

__all__ = [
    "Boundary", "at_experience_end", "at_origin", "current_boundary", "enter_boundary", "evaluated_experience_id",
    "locate_boundary"]

_TRACKER = "_boundary_tracker"


@dataclass(frozen=True)
class Boundary:
    """Where the current (sub-)experience sits.

    ``online``: a sub-experience of an online stream. ``access``: training may use the boundaries
    (always True offline). ``origin``: the experience to measure on (the original experience
    online, the strategy's experience otherwise). ``index``: the original experience's position
    among those trained so far (``strategy.clock.train_exp_counter`` offline). ``first`` /
    ``last``: first / last sub-experience of the original experience (both True offline).
    ``origin_id``: the original experience's ``current_experience`` (None when it has none).
    ``position`` / ``length``: the sub-experience's index (from 0) in its original experience and
    the length of that sub-stream (0 / None offline); ``stream_index``: the sub-experience's own
    ``current_experience`` in the online stream (None offline).
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


def enter_boundary(owner, strategy, component: str | None = None, *, needs_access: bool = False) -> Boundary:
    """Call at ``before_training_exp``: the :class:`Boundary` of the experience about to be
    trained, kept on ``owner`` for its later callbacks (:func:`current_boundary`).

    :param needs_access: the component changes training at the boundaries: on an online stream
        that hides them (``access_task_boundaries=False``) it is refused.
    :raises ValueError: ``JointTraining``, or a hidden-boundary online stream with
        ``needs_access``, naming ``component`` (default: ``owner``'s class).
    """
    from avalanche.training.supervised import JointTraining

    component = component or type(owner).__name__
    if isinstance(strategy, JointTraining):
        raise ValueError(f"{component} works per experience; JointTraining trains on all experiences "
                         "at once, so its per-experience quantities would describe experience 0 only")
    return locate_boundary(owner, strategy, component, needs_access=needs_access)


def locate_boundary(owner, strategy, component: str | None = None, *, needs_access: bool = False) -> Boundary:
    """:func:`enter_boundary` for an owner that only reports where training is (it accepts every
    strategy, JointTraining included): the :class:`Boundary` of ``strategy.experience``, counted
    on ``owner`` (call it once per experience, at ``before_training_exp``)."""
    component = component or type(owner).__name__
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
        if needs_access and not access:
            raise ValueError(
                f"{component} acts once per original experience of an online stream, but this stream hides "
                "its task boundaries from training (split_online_stream(..., access_task_boundaries=False)): "
                "build it with split_online_stream(..., access_task_boundaries=True), or train on the "
                "original stream")
        if first or tracker.position < 0:
            tracker.position, first = 0, True
            tracker.started += 1
        else:
            tracker.position += 1
        last = last or (length is not None and tracker.position + 1 >= length)
        boundary = Boundary(True, access, _view(origin), tracker.started - 1, first, last,
                            getattr(origin, "current_experience", None), tracker.position, length,
                            getattr(experience, "current_experience", None))
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
    sub-experience (its data, id and metric names); nothing changes offline."""
    if not boundary.online:
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
