"""What the study runner watches in every run, whatever plugins and metrics are attached.

* :class:`DivergenceWatch` (a ``SupervisedPlugin`` the runner puts first): after every training
  forward pass and backward pass, and every evaluation forward pass, it checks that the model
  outputs, the loss and the gradients are finite, and otherwise ends the run with
  :class:`Diverged` — ``diverged at experience k, epoch e, iteration i (loss = nan)`` — before any
  plugin or metric sees the non-finite values. A diverged run is never scored. On an online stream
  (``split_online_stream``) ``k`` is the *original* experience and the sub-experience follows:
  ``diverged at experience 2 (sub-experience 5 of 0..22, stream sub-experience 51), epoch 0,
  iteration 0 (loss = nan)`` — the sub-experience's index within the original experience, and
  its index in the online stream (Avalanche's own numbering).
* :func:`time_callbacks` wraps the strategy callbacks of each attached plugin and metric so that
  the time spent in them is added up per object (the "diagnostics time" column) and an exception
  raised in one of them becomes :class:`CallbackFailed`, naming the object's class, the callback
  and the experience.

Both are callables stored on the instances (no closures), so a plugin stays picklable.
"""

from __future__ import annotations

import dis
import time

import torch
from avalanche.core import SupervisedPlugin

from avalanche_plugins._avalanche.boundaries import evaluated_experience_id, locate_boundary

__all__ = ["CALLBACKS", "CallbackFailed", "DivergenceWatch", "Diverged", "time_callbacks"]

CALLBACKS = tuple(n for n in dir(SupervisedPlugin) if n.startswith(("before_", "after_")))


class Diverged(FloatingPointError):
    """A run whose loss, gradients or model outputs stopped being finite."""

    def __init__(self, where: str, what: str, value: float):
        self.where, self.what, self.value = where, what, value
        super().__init__(f"diverged at {where} ({what} = {value})")


class CallbackFailed(RuntimeError):
    """An exception raised in a plugin's or metric's callback (the original is ``__cause__``)."""

    def __init__(self, owner: str, callback: str, experience, error: BaseException):
        self.owner, self.callback, self.experience = owner, callback, experience
        self.error_type = type(error).__name__
        at = f" at experience {experience}" if experience is not None else ""
        super().__init__(f"{owner}.{callback}{at}: {self.error_type}: {error}")


def _experience_index(strategy):
    """The experience being trained or evaluated: the original experience of an online sub-experience."""
    experience = getattr(strategy, "experience", None)
    return None if experience is None else evaluated_experience_id(experience)


def _where(boundary) -> str:
    """``experience k``, and on an online stream the sub-experience within it (``boundary``: the
    :class:`~avalanche_plugins._avalanche.boundaries.Boundary` of the training experience)."""
    if not boundary.online:
        return f"experience {boundary.origin_id}"
    last = f" of 0..{boundary.length - 1}" if boundary.length else ""
    stream = f", stream sub-experience {boundary.stream_index}" if boundary.stream_index is not None else ""
    return f"experience {boundary.origin_id} (sub-experience {boundary.position}{last}{stream})"


def _position(strategy, boundary=None) -> str:
    clock = strategy.clock
    where = _where(boundary) if boundary is not None else f"experience {_experience_index(strategy)}"
    return f"{where}, epoch {clock.train_exp_epochs}, iteration {clock.train_epoch_iterations}"


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if isinstance(output, dict):
        return next((v for v in output.values() if isinstance(v, torch.Tensor)), None)
    return None


def _nonfinite_value(tensor: torch.Tensor) -> float:
    bad = tensor.detach()[~torch.isfinite(tensor.detach())]
    return float(bad.flatten()[0]) if bad.numel() else float("nan")


class DivergenceWatch(SupervisedPlugin):
    """Ends a run at the first non-finite model output, loss or gradient (module docstring).

    One device synchronisation per iteration: the checks are reduced to one flag. ``boundary``: where
    the current training (sub-)experience sits (:func:`~avalanche_plugins._avalanche.boundaries.locate_boundary`).
    """

    def __init__(self):
        super().__init__()
        self.boundary = None

    def before_training_exp(self, strategy, **kwargs):
        self.boundary = locate_boundary(self, strategy)

    def _position(self, strategy) -> str:
        return _position(strategy, self.boundary)

    def after_forward(self, strategy, **kwargs):
        output = _first_tensor(strategy.mb_output)
        if output is not None and output.is_floating_point() and not bool(torch.isfinite(output).all()):
            raise Diverged(self._position(strategy), "model output", _nonfinite_value(output))

    def after_backward(self, strategy, **kwargs):
        loss = strategy.loss.detach() if isinstance(strategy.loss, torch.Tensor) else torch.tensor(strategy.loss)
        grads = [p.grad.detach() for p in strategy.model.parameters() if p.grad is not None]
        grad_norm = torch.stack(torch._foreach_norm(grads)).norm() if grads else torch.zeros((), device=loss.device)
        if bool(torch.isfinite(loss).all() & torch.isfinite(grad_norm).to(loss.device)):  # one sync
            return
        if not bool(torch.isfinite(loss).all()):
            raise Diverged(self._position(strategy), "loss", _nonfinite_value(loss.reshape(-1)))
        raise Diverged(self._position(strategy), "gradient norm", float(grad_norm))

    def after_eval_forward(self, strategy, **kwargs):
        output = _first_tensor(strategy.mb_output)
        if output is not None and output.is_floating_point() and not bool(torch.isfinite(output).all()):
            online = self.boundary is not None and self.boundary.online
            trained = _where(self.boundary).removeprefix("experience ") if online else strategy.clock.train_exp_counter - 1
            raise Diverged(f"evaluation of experience {_experience_index(strategy)} after training experience "
                           f"{trained}", "model output", _nonfinite_value(output))


class _TimedCallback:
    """``owner.callback(strategy)`` timed into ``ledger[label]``; errors become CallbackFailed."""

    def __init__(self, method, label: str, callback: str, ledger: dict):
        self.method, self.label, self.callback, self.ledger = method, label, callback, ledger

    def __call__(self, strategy, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.method(strategy, *args, **kwargs)
        except (Diverged, CallbackFailed, KeyboardInterrupt):
            raise
        except Exception as error:  # noqa: BLE001 - every failure of a diagnostic is named, then re-raised
            raise CallbackFailed(self.label, self.callback, _experience_index(strategy), error) from error
        finally:
            self.ledger[self.label] = self.ledger.get(self.label, 0.0) + time.perf_counter() - start


def time_callbacks(objects, ledger: dict) -> dict:
    """Wrap every strategy callback of each of ``objects`` with a timer adding seconds to ``ledger[label]`` (label: the class name, numbered when two objects
    share it). Returns ``{label: object}``.

    Example:
        >>> class P(SupervisedPlugin):
        ...     def after_training_exp(self, strategy, **kwargs):
        ...         raise ValueError("boom")
        >>> ledger = {}
        >>> labels = time_callbacks([P()], ledger)
        >>> try:
        ...     labels["P"].after_training_exp(None)
        ... except CallbackFailed as error:
        ...     print(error)
        P.after_training_exp: ValueError: boom
        >>> sorted(ledger)
        ['P']
    """
    labels: dict = {}
    for obj in objects:
        base = type(obj).__name__
        label, k = base, 2
        while label in labels:
            label, k = f"{base}#{k}", k + 1
        labels[label] = obj
        ledger.setdefault(label, 0.0)
        for name in CALLBACKS:
            if not callable(getattr(obj, name, None)) or _does_nothing(getattr(type(obj), name, None)):
                continue
            setattr(obj, name, _TimedCallback(getattr(obj, name), label, name, ledger))
    return labels


_NOTHING = {"RESUME", "NOP", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST"}


def _does_nothing(function) -> bool:
    """Whether ``function`` is a callback that only returns None (Avalanche's ``pass`` defaults of
    every callback a plugin or metric does not override): left unwrapped, since timing a thousand
    empty calls per run costs more than they do (issue 41).

    >>> def empty(self, strategy, **kwargs):
    ...     "A docstring."
    >>> def busy(self, strategy, **kwargs):
    ...     return strategy
    >>> _does_nothing(empty), _does_nothing(busy), _does_nothing(None)
    (True, False, False)
    """
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    return all(i.opname in _NOTHING and (i.opname not in ("LOAD_CONST", "RETURN_CONST") or i.argval is None)
               for i in dis.get_instructions(code))

