"""Pre-flight: every plugin and metric checks the user's model before the first training iteration.

A plugin or metric that measures something after an experience would otherwise meet an
unsupported model only then, after an experience of training has been spent. :func:`preflight`
runs, at the first ``before_training_exp`` (after Avalanche's model adaptation, before any
iteration), on the strategy's model and :data:`PREFLIGHT_SAMPLES` samples of the first
experience (under Avalanche's distributed training, after
:func:`~avalanche_plugins._avalanche.distributed.check_distributed`, and on the model inside the
DDP wrapper):

1. the **output type**: the model's output must be a logits tensor, or ``output_transform`` must
   turn it into one (:func:`~avalanche_plugins.core.outputs.logits_of`);
2. the **layer map** (:func:`~avalanche_plugins.core.layers.discover_layers`): no tied weights,
   no layer run twice per forward pass, at least one parametrised layer;
3. the component's own **probe**: its estimator run once on those few samples with the smallest
   budget (one Lanczos step, one step), which meets what a structural check cannot foresee
   (recurrent layers under ``vmap``, operations without forward-mode AD, a loss the estimator
   cannot use).

Anything that fails raises the original exception type (``ValueError``, ``TypeError``,
``NotImplementedError``; any other exception, a model's own ``AssertionError`` included, as
``RuntimeError`` with the original type and, for a message-less error, the line that raised it)
with a message that starts with the component's name and says it refused before training. Nothing of the run changes: the model is
evaluated in eval mode (train flags restored), torch's RNG (CPU and the strategy's device) is
restored, the estimators read parameters through ``torch.func`` and write no ``.grad``.

A component checks a given model once (it keeps the id of the model it checked), so the cost is
paid at the first experience only; ``owner.preflight_seconds`` holds it. A strategy that replaces
its model (GDumb) has each new model checked, online at every sub-experience; a sub-experience
with fewer samples than the check needs is checked on the strategy's adapted dataset (GDumb's
buffer) when that has enough.

The component's own **settings** meet the data in :func:`check_experiences`: before the first
iteration, on every experience the stream shows (the current one and those after it; on an online
stream the original experiences), a component's check says whether a setting asks for more than an
experience offers (anchors per class, a minibatch larger than the samples a measurement takes) and
refuses naming the component, the setting, the experience and the fix. A measurement that takes
fewer samples than asked because the experience is smaller is not refused: it says so once
(:func:`warn_fewer_samples`) and records the count it used beside every value.
"""

from __future__ import annotations

import contextlib
import functools
import time
import traceback
import warnings
from collections.abc import Callable

import torch

from avalanche_plugins._avalanche.boundaries import Boundary
from avalanche_plugins._avalanche.data import experience_batches, preserved_rng
from avalanche_plugins._avalanche.distributed import check_distributed
from avalanche_plugins.core.calls import eval_mode, model_forward
from avalanche_plugins.core.layers import discover_layers, example_input
from avalanche_plugins.core.outputs import describe_output, logits_of, transformed_output
from avalanche_plugins.core.parallel import unwrap_model

__all__ = ["PREFLIGHT_SAMPLES", "PreflightProbe", "check_experiences", "describe_error", "first_samples", "preflight",
           "stream_experiences", "warn_fewer_samples", "with_output_transform"]

PREFLIGHT_SAMPLES = 2  # enough for every estimator (the Fisher blocks' debiasing needs 2)

# probe(model, loss_fn, x, y, task_labels): the component's estimator on a few samples
PreflightProbe = Callable[[torch.nn.Module, Callable, torch.Tensor, torch.Tensor, torch.Tensor], object]


def first_samples(strategy, n: int = PREFLIGHT_SAMPLES):
    """The first ``n`` samples ``(x, y, task_labels)`` of the current experience on the strategy's
    device (the training dataset's order; torch's RNG left as it was). When the experience has
    fewer than ``n`` (an online sub-experience's remainder) and the strategy trains on a larger
    adapted dataset (GDumb's buffer, whose fresh model is checked there), they come from that."""
    data = None
    adapted = getattr(strategy, "adapted_dataset", None)
    if adapted is not None and len(strategy.experience.dataset) < n <= len(adapted):
        data = adapted
    batches = experience_batches(strategy, dataset=data, batch_size=n)
    try:
        x, y, t = next(batches)
    except StopIteration:
        raise ValueError("the experience's dataset is empty") from None
    finally:
        batches.close()
    return x, y, torch.as_tensor(t).to(x.device)


def describe_error(error: Exception) -> str:
    """The error's message, or (a bare ``assert`` in the model, e.g. ICaRL's evaluation forward
    before its class means exist) its type and the line that raised it."""
    text = str(error)
    if text:
        return text
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line})" if frames else ""
    return f"{type(error).__name__} raised{where}"


def _refusal(component: str, error: Exception, n: int) -> Exception:
    message = (f"{component} refuses this model before training (checked on {n} samples of the first "
               f"experience): {describe_error(error)}")
    if type(error) in (ValueError, TypeError, NotImplementedError):
        return type(error)(message)
    return RuntimeError(f"{message} ({type(error).__name__})")


def preflight(owner, strategy, probe: PreflightProbe | None = None, *, output_transform=None,
              layer_map: bool = True, takes_output_transform: bool = True) -> None:
    """Check ``strategy.model`` for ``owner`` (a plugin or metric) before the first iteration
    (module docstring); a no-op for a model ``owner`` already checked.

    :param probe: ``probe(model, loss_fn, x, y, task_labels)``, the component's estimator on the
        few samples, run with ``output_transform`` applied to the model's output.
    :param output_transform: the component's ``output_transform`` (None: the output must be a tensor).
    :param layer_map: check the layer map (every component but one that needs no layers).
    :param takes_output_transform: False for a component without an ``output_transform``
        argument: a non-tensor output is then refused with a message that says how to wrap the model.
    :raises ValueError, TypeError, NotImplementedError, RuntimeError: naming ``owner``'s class, the
        module or argument at fault and what to do.
    """
    check_distributed(owner, strategy)  # under torchrun: refused, or the model's wrapper checked
    model = unwrap_model(strategy.model)
    if getattr(owner, "_preflight_checked", None) == id(model):
        return
    component = type(owner).__name__
    start = time.perf_counter()
    with preserved_rng(strategy.device):
        x, y, t = first_samples(strategy)
        try:
            with transformed_output(model, output_transform):
                with eval_mode(model), torch.no_grad():
                    output = model_forward(model, x, t)
                if not takes_output_transform and not isinstance(output, torch.Tensor):
                    raise ValueError(f"the model returned {describe_output(output)}, not a logits tensor, and "
                                     f"{component} takes no output_transform: give it a model whose forward "
                                     "returns the logits, e.g. avalanche_plugins.core.outputs.OutputTransform("
                                     "model, lambda out: out[0])")
                logits_of(output)  # a tensor, or a ValueError asking for output_transform
                if layer_map:
                    discover_layers(model, example_input(model, x, t))
                if probe is not None:
                    with warnings.catch_warnings():  # two samples: convergence / dead-layer warnings say nothing
                        warnings.simplefilter("ignore")
                        probe(model, strategy._criterion, x, y, t)
        except Exception as error:  # any failure, a model's own AssertionError included, names the component
            raise _refusal(component, error, x.shape[0]) from error
    owner._preflight_checked = id(model)
    owner.preflight_seconds = time.perf_counter() - start


def with_output_transform(callback):
    """Decorator for a plugin/metric callback ``(self, strategy, ...)``: the model's output goes
    through ``self.output_transform`` while the callback runs
    (:func:`~avalanche_plugins.core.outputs.transformed_output`; nothing when it is None)."""

    @functools.wraps(callback)
    def wrapper(self, strategy, *args, **kwargs):
        transform = getattr(self, "output_transform", None)
        context = contextlib.nullcontext() if transform is None else transformed_output(unwrap_model(strategy.model), transform)
        with context:
            return callback(self, strategy, *args, **kwargs)

    return wrapper


def _logging_view(experience):
    return experience.logging() if hasattr(experience, "logging") else experience


def stream_experiences(boundary: Boundary) -> list:
    """The original experiences the run trains on from ``boundary``'s on, as far as the stream shows
    them: the current (original) experience's ``origin_stream`` from that experience on, when it is a
    finite stream holding it (a benchmark's stream, or its slice ``train_stream[:2]``), else the
    current experience alone (a lazy stream, an experience without a stream). Logging views."""
    current = _logging_view(boundary.origin)
    try:
        stream = current.origin_stream
        experiences = [_logging_view(stream[i]) for i in range(len(stream))]
    except (AttributeError, TypeError, ValueError, IndexError):  # no stream, a lazy one, masked
        return [current]
    ids = [getattr(e, "current_experience", None) for e in experiences]
    here = getattr(current, "current_experience", None)
    if here is None or here not in ids:
        return [current]
    return experiences[ids.index(here):]


def check_experiences(owner, boundary: Boundary, check: Callable[[object], str | None],
                      component: str | None = None) -> None:
    """Check ``owner``'s settings against the data before training the current experience: at the
    first (sub-)experience of every original experience, ``check(experience)`` runs on it and on
    every later experience the stream shows (:func:`stream_experiences`), each experience once.

    :param check: ``experience -> None`` or the problem: the setting, what the experience offers
        and the fix (``"n_anchors=100 asks ..., choose n_anchors <= 60"``).
    :raises ValueError: ``"{component} refuses its settings before training: experience {id} ..."``.
    """
    if not boundary.first or boundary.origin is None:
        return
    component = component or type(owner).__name__
    checked = owner.__dict__.setdefault("_settings_checked", set())
    for experience in stream_experiences(boundary):
        index = getattr(experience, "current_experience", None)
        key = None if index is None else (index, len(experience.dataset))
        if key is not None and key in checked:
            continue
        problem = check(experience)
        if problem is not None:
            which = "the experience" if index is None else f"experience {index}"
            raise ValueError(f"{component} refuses its settings before training: {which} {problem}")
        if key is not None:
            checked.add(key)


def warn_fewer_samples(owner, component: str, setting: str, asked: int, used: int, where: str) -> None:
    """Say once per ``owner`` and ``setting`` that a measurement took fewer samples than the
    setting asks for (``where`` had only ``used``); the caller records ``used`` with the value."""
    if used >= asked:
        return
    warned = owner.__dict__.setdefault("_fewer_samples_warned", set())
    if setting in warned:
        return
    warned.add(setting)
    warnings.warn(f"{component}: {setting}={asked} asks for more samples than {where} has, so it measured on the "
                  f"{used} there are; every record says how many it used (n_samples_used). Said once per metric: "
                  "a later measurement on fewer samples than asked is only recorded", stacklevel=3)
