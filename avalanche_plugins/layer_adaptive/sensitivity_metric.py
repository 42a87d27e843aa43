"""Per-layer sensitivity as an Avalanche metric: s_ℓ, κ and α̂ after every training experience.

``LayerSensitivityMetric`` measures the top eigenvalue ``s_ℓ`` of every layer's Fisher block
(default) or Hessian block (:func:`avalanche_plugins.layer_adaptive.curvature.layer_curvature`) on a
sample of the experience just trained, and emits through the ``EvaluationPlugin``:

* ``LayerSensitivity/train_phase/train_stream/TaskNNN/ExpNNN`` — ``{layer name: s_ℓ}`` (loggers
  split dicts into one scalar per layer),
* ``LayerSensitivityKappa/...`` — ``κ = max s_ℓ / min s_ℓ`` over the live layers,
* ``LayerSensitivityAlphaHat/...`` — the geometric-fit ratio ``α̂`` over the live layers,
* ``LayerSensitivityProfile/...`` — a bar chart (TensorBoard shows it as an image; rendered only when
  something of the run takes images: :func:`~avalanche_plugins._avalanche.figures.wants_images`),
* ``LayerSensitivitySamplesUsed/...`` — how many samples of the experience they rest on
  (``min(n_samples, |experience|)``; also ``history[i].n_samples_used``: an experience smaller than
  ``n_samples`` is measured on all of it, and a warning says so once).

Dead layers (``s_ℓ <= 0``, :mod:`avalanche_plugins.layer_adaptive.profile`) keep their ``s_ℓ`` in
the dict, are named in a ``RuntimeWarning`` and in ``history[i].dead_layers``, and are left out of
κ and α̂, so no logged value is inf or NaN; κ (and the bar chart) is not logged when every layer
is dead, α̂ not when fewer than two are live.

It never changes the model, the optimizer or torch's global RNG stream. At the first experience,
before any iteration, it runs a pre-flight (:mod:`avalanche_plugins._avalanche.preflight`): the
model's output type, its layer map and the curvature estimator on two samples, so an unsupported
model is refused before training, not after the first experience; so is a task-agnostic stream
(``split_continuous_linear_decay_stream``: no original experience to measure after) and a stream
with an empty experience.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from avalanche.evaluation.metric_results import MetricValue

from avalanche_plugins._avalanche.boundaries import at_experience_end, enter_boundary
from avalanche_plugins._avalanche.data import metric_name
from avalanche_plugins._avalanche.preflight import (
    check_experiences,
    preflight,
    warn_fewer_samples,
    with_output_transform,
)
from avalanche_plugins._avalanche.recording import RecordingMetric
from avalanche_plugins.core.checks import check_choice, check_int, check_positive
from avalanche_plugins.core.outputs import check_output_transform
from avalanche_plugins.layer_adaptive.curvature import CURVATURE_METHODS, DEFAULT_SAMPLES
from avalanche_plugins.layer_adaptive.curvature_metric import (
    curvature_probe,
    measure_profile,
    sensitivity_values,
)
from avalanche_plugins.layer_adaptive.profile import LayerProfile, layer_profile

__all__ = ["LayerSensitivityMetric", "SensitivityProfile"]


@dataclass
class SensitivityProfile(LayerProfile):
    """A :class:`~avalanche_plugins.layer_adaptive.profile.LayerProfile` with the samples it was
    measured on: ``n_samples_used`` of the ``n_samples_asked`` the metric asks for."""

    n_samples_asked: int | None = None
    n_samples_used: int | None = None


class LayerSensitivityMetric(RecordingMetric[dict]):
    """Logs the per-layer Hessian spectrum after each training experience (see module docstring).

    :param n_samples: samples of the experience used (random, seeded; None: 128 for ``fisher``,
        256 for ``hessian``; all of a smaller experience: a warning says so once, and each record,
        a :class:`SensitivityProfile`, holds ``n_samples_used``).
    :param chunk_size: samples per vectorised call (None: the method's default).
    :param max_iter, tol: power-iteration budget and tolerance (``hessian``).
    :param curvature: ``fisher`` (default) or ``hessian`` (see ``layer_adaptive.curvature``).
    :param seed: sample selection and start vectors (offset by the experience counter).
    :param output_transform: for a model whose forward returns a tuple or a dict, a function from
        its output to the logits tensor (e.g. ``lambda out: out[0]``); the measurement then applies
        ``strategy._criterion`` to those logits. Without it such a model is refused before training
        with a ``ValueError`` naming ``output_transform``.

    The logged ``s_ℓ`` is the curvature of ``strategy._criterion`` as it reduces over the
    ``n_samples`` (the mean loss's, or the sum's for a sum-reduced criterion:
    :mod:`avalanche_plugins.core.reductions`); ``reduction='none'`` is refused before training.

    Example::

        evaluator = EvaluationPlugin(accuracy_metrics(experience=True), LayerSensitivityMetric(),
                                     loggers=[InteractiveLogger(), TensorboardLogger()])
    """

    supports_distributed = True  # under torchrun: whole-experience reads, unwrapped model (_avalanche.distributed)

    def __init__(self, n_samples: int | None = None, chunk_size: int | None = None, max_iter: int = 100,
                 tol: float = 1e-3, seed: int = 0, *, curvature: str = "fisher", output_transform=None):
        super().__init__()
        check_output_transform(output_transform)
        self.output_transform = output_transform
        check_choice("curvature", curvature, CURVATURE_METHODS)
        if n_samples is None:
            n_samples = DEFAULT_SAMPLES[curvature]
        self.curvature = curvature
        check_int("n_samples", n_samples)
        check_int("max_iter", max_iter)
        check_positive("tol", tol)
        if chunk_size is not None:
            check_int("chunk_size", chunk_size)
        check_int("seed", seed, minimum=0)
        self.n_samples, self.chunk_size, self.max_iter, self.tol, self.seed = n_samples, chunk_size, max_iter, tol, seed

    logs_layer_sensitivity = True  # LayerAdaptiveEWCPlugin(log_profile=True) leaves the logging to it

    def result_of(self, record: LayerProfile) -> dict:
        """``{layer name: s_ℓ}`` of the last experience (``history`` holds :class:`LayerProfile` records)."""
        return dict(zip(record.layer_names, record.spectrum))

    def before_training_exp(self, strategy) -> None:
        boundary = enter_boundary(self, strategy, "LayerSensitivityMetric", needs_origin=True,
                                  needs="measures the per-layer curvature after each original experience, on its data")
        check_experiences(self, boundary, _empty_experience, "LayerSensitivityMetric")
        preflight(self, strategy, curvature_probe(self.curvature, self.chunk_size),
                  output_transform=self.output_transform)

    @with_output_transform
    def after_training_exp(self, strategy) -> list[MetricValue] | None:
        return at_experience_end(self, strategy, lambda boundary: self._measure(strategy, boundary.index))

    def _measure(self, strategy, exp_id: int) -> list[MetricValue]:
        start = time.perf_counter()
        spectrum = measure_profile(strategy, method=self.curvature, n_samples=self.n_samples, chunk_size=self.chunk_size,
                                   max_iter=self.max_iter, tol=self.tol, seed=self.seed + exp_id)
        used = min(self.n_samples, len(strategy.experience.dataset))  # what experience_tensors takes
        warn_fewer_samples(self, "LayerSensitivityMetric", "n_samples", self.n_samples, used,
                           f"experience {getattr(strategy.experience, 'current_experience', exp_id)}")
        profile = SensitivityProfile(**vars(layer_profile(exp_id, spectrum, seconds={"spectrum": time.perf_counter() - start})),
                                     n_samples_asked=self.n_samples, n_samples_used=used)
        self.history.append(profile)
        x = strategy.clock.train_iterations
        count = MetricValue(self, metric_name("LayerSensitivitySamplesUsed", strategy), used, x)
        if profile.kappa is None:  # every layer dead: only the per-layer values are defined
            return [MetricValue(self, metric_name("LayerSensitivity", strategy),
                                dict(zip(profile.layer_names, profile.spectrum)), x), count]
        return [*sensitivity_values(self, strategy, profile, x), count]

    def __str__(self) -> str:
        return "LayerSensitivity"


def _empty_experience(experience) -> str | None:
    if len(experience.dataset) == 0:
        return "has no samples to measure the curvature on: give every experience samples"
    return None
