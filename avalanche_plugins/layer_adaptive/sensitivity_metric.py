"""Per-layer sensitivity as an Avalanche metric: s_ℓ, κ and α̂ after every training experience.

``LayerSensitivityMetric`` measures the top eigenvalue ``s_ℓ`` of every layer's Hessian block
(:func:`avalanche_plugins.layer_adaptive.hessian.layer_top_eigenvalues`) on a sample of the experience just
trained, and emits through the ``EvaluationPlugin``:

* ``LayerSensitivity/train_phase/train_stream/TaskNNN/ExpNNN`` — ``{layer name: s_ℓ}`` (loggers
  split dicts into one scalar per layer),
* ``LayerSensitivityKappa/...`` — ``κ = max s_ℓ / min s_ℓ``,
* ``LayerSensitivityAlphaHat/...`` — the geometric-fit ratio ``α̂``,
* ``LayerSensitivityProfile/...`` — a bar chart (TensorBoard shows it as an image).

It never changes the model, the optimizer or torch's global RNG stream.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from avalanche.evaluation import PluginMetric
from avalanche.evaluation.metric_results import MetricValue

from avalanche_plugins._avalanche.data import experience_tensors, metric_name, profile_figure
from avalanche_plugins.core.checks import check_int, check_positive
from avalanche_plugins.layer_adaptive.hessian import LayerSpectrum, layer_top_eigenvalues

__all__ = ["LayerSensitivityMetric", "ExperienceProfile", "measure_profile", "sensitivity_values"]


@dataclass
class ExperienceProfile:
    """What the plugin measured and applied at the end of one experience."""

    experience: int
    layer_names: list[str]
    lambdas: list[float]  # λ_ℓ = ewc_lambda · w_ℓ
    spectrum: list[float] | None = None  # s_ℓ (None when not measured)
    kappa: float | None = None
    alpha_hat: float | None = None
    fit_r2: float | None = None
    seconds: dict = field(default_factory=dict)


def measure_profile(strategy, *, n_samples: int, chunk_size: int | None, max_iter: int, tol: float,
                    seed: int) -> LayerSpectrum:
    """s_ℓ of ``strategy.model`` on up to ``n_samples`` samples of the current experience."""
    x, y, t = experience_tensors(strategy, n_samples=n_samples, seed=seed)
    return layer_top_eigenvalues(strategy.model, strategy._criterion, x, y, task_labels=t,
                                 max_iter=max_iter, tol=tol, chunk_size=chunk_size, seed=seed)


def sensitivity_values(origin, strategy, profile: ExperienceProfile, x: int) -> list[MetricValue]:
    """MetricValues for a profile: per-layer dict, κ, α̂ and a bar-chart figure."""
    values = [
        MetricValue(origin, metric_name("LayerSensitivity", strategy), dict(zip(profile.layer_names, profile.spectrum)), x),
        MetricValue(origin, metric_name("LayerSensitivityKappa", strategy), float(profile.kappa), x),
    ]
    if profile.alpha_hat is not None:
        values.append(MetricValue(origin, metric_name("LayerSensitivityAlphaHat", strategy), float(profile.alpha_hat), x))
    fig = profile_figure(profile.layer_names, profile.spectrum,
                         f"s_l after experience {profile.experience} (kappa={profile.kappa:.3g})")
    values.append(MetricValue(origin, metric_name("LayerSensitivityProfile", strategy), fig, x))
    return values



class LayerSensitivityMetric(PluginMetric[dict]):
    """Logs the per-layer Hessian spectrum after each training experience (see module docstring).

    :param n_samples: samples of the experience used (random, seeded).
    :param chunk_size: minibatch size of the Hessian-vector products (None: all at once).
    :param max_iter, tol: power-iteration budget and tolerance.
    :param seed: sample selection and start vectors (offset by the experience counter).

    Example::

        evaluator = EvaluationPlugin(accuracy_metrics(experience=True), LayerSensitivityMetric(),
                                     loggers=[InteractiveLogger(), TensorboardLogger()])
    """

    def __init__(self, n_samples: int = 256, chunk_size: int | None = None, max_iter: int = 100,
                 tol: float = 1e-3, seed: int = 0):
        super().__init__()
        check_int("n_samples", n_samples)
        check_int("max_iter", max_iter)
        check_positive("tol", tol)
        self.n_samples, self.chunk_size, self.max_iter, self.tol, self.seed = n_samples, chunk_size, max_iter, tol, seed
        self.profiles: list[ExperienceProfile] = []

    def result(self) -> dict | None:
        last = self.profiles[-1] if self.profiles else None
        return None if last is None else dict(zip(last.layer_names, last.spectrum))

    def reset(self) -> None:
        self.profiles = []

    def after_training_exp(self, strategy) -> list[MetricValue]:
        exp_id = strategy.clock.train_exp_counter
        start = time.perf_counter()
        spectrum = measure_profile(strategy, n_samples=self.n_samples, chunk_size=self.chunk_size,
                                   max_iter=self.max_iter, tol=self.tol, seed=self.seed + exp_id)
        profile = profile_from_spectrum(exp_id, spectrum, lambdas=[], seconds={"spectrum": time.perf_counter() - start})
        self.profiles.append(profile)
        return sensitivity_values(self, strategy, profile, strategy.clock.train_iterations)

    def __str__(self) -> str:
        return "LayerSensitivity"


def profile_from_spectrum(exp_id: int, spectrum: LayerSpectrum, *, lambdas, seconds) -> ExperienceProfile:
    """An :class:`ExperienceProfile` with κ and the geometric fit filled in (α̂ None if no fit)."""
    profile = ExperienceProfile(experience=exp_id, layer_names=spectrum.names, lambdas=list(lambdas),
                                spectrum=spectrum.top.tolist(), kappa=spectrum.kappa, seconds=dict(seconds))
    try:
        fit = spectrum.fit()
        profile.alpha_hat, profile.fit_r2 = fit.alpha, fit.r2
    except ValueError:
        pass
    return profile
