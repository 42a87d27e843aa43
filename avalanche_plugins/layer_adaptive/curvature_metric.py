"""Measuring and publishing the per-layer curvature profile from inside a strategy.

Shared by ``LayerSensitivityMetric``, ``LayerAdaptiveEWCPlugin`` and ``LayerAdaptiveLRPlugin``, so a
plugin never imports a metric module.
"""

from __future__ import annotations

from avalanche.evaluation.metric_results import MetricValue

from avalanche_plugins._avalanche.data import experience_tensors, metric_name
from avalanche_plugins._avalanche.distributed import plain_model
from avalanche_plugins._avalanche.figures import (
    DeferredFigure,
    profile_figure,
    profile_figure_size,
    wants_images,
)
from avalanche_plugins.layer_adaptive.curvature import layer_curvature
from avalanche_plugins.layer_adaptive.hessian import LayerSpectrum
from avalanche_plugins.layer_adaptive.profile import LayerProfile

__all__ = ["curvature_probe", "logs_sensitivity", "measure_profile", "sensitivity_values"]


_CACHE = "_avalanche_plugins_layer_spectrum"


def measure_profile(strategy, *, method: str, n_samples: int, chunk_size: int | None, max_iter: int, tol: float,
                    seed: int) -> LayerSpectrum:
    """s_ℓ of ``strategy.model`` on up to ``n_samples`` samples of the current experience, by
    :func:`~avalanche_plugins.layer_adaptive.curvature.layer_curvature` (``max_iter``/``tol`` are
    the ``hessian`` method's; ``chunk_size`` None keeps the method's default): the curvature of
    ``strategy._criterion`` as it reduces over those samples, the mean loss's or, for a sum-reduced
    criterion, the sum's (:mod:`avalanche_plugins.core.reductions`), whatever ``chunk_size``.

    The result is cached on the strategy for the current training experience: a second adapter
    asking with the same settings (``LayerAdaptiveEWCPlugin(log_profile=True)`` next to
    ``LayerSensitivityMetric``) reuses it instead of measuring again.
    """
    key = (strategy.clock.train_exp_counter, strategy.clock.train_iterations, id(strategy.model),
           method, n_samples, chunk_size, max_iter, tol, seed)
    cached = getattr(strategy, _CACHE, None)
    if cached is not None and cached[0] == key:
        return cached[1]
    x, y, t = experience_tensors(strategy, n_samples=n_samples, seed=seed)
    options = {} if chunk_size is None else {"chunk_size": chunk_size}
    if method == "hessian":
        options.update(max_iter=max_iter, tol=tol)
    spectrum = layer_curvature(plain_model(strategy), strategy._criterion, x, y, method=method, task_labels=t,
                               seed=seed, **options)
    setattr(strategy, _CACHE, (key, spectrum))
    return spectrum


def curvature_probe(method: str, chunk_size: int | None = None):
    """The pre-flight probe of a component measuring s_ℓ by ``method``
    (:func:`avalanche_plugins._avalanche.preflight.preflight`): the estimator on the pre-flight's few
    samples with the smallest budget (two Lanczos steps for ``hessian``)."""

    def probe(model, loss_fn, x, y, task_labels):
        options = {} if chunk_size is None else {"chunk_size": chunk_size}
        if method == "hessian":
            options.update(max_iter=2, tol=1.0)
        layer_curvature(model, loss_fn, x, y, method=method, task_labels=task_labels, **options)

    return probe


def logs_sensitivity(strategy) -> bool:
    """Whether the strategy's evaluator already has a metric that logs the sensitivity profile."""
    evaluator = getattr(strategy, "evaluator", None)
    return any(getattr(metric, "logs_layer_sensitivity", False) for metric in getattr(evaluator, "metrics", ()))


def sensitivity_values(origin, strategy, profile: LayerProfile, x: int) -> list[MetricValue]:
    """MetricValues for a profile: per-layer dict, κ, α̂ and a bar-chart figure.

    κ is left out when it is undefined (``profile.kappa`` None: every layer dead) and α̂ when fewer
    than two layers are live; the per-layer dict and the figure are always there, so no value
    handed to a logger is None, inf or NaN. The figure is rendered only when something of the run
    can take it (:func:`~avalanche_plugins._avalanche.figures.wants_images`)."""
    values = [
        MetricValue(origin, metric_name("LayerSensitivity", strategy), dict(zip(profile.layer_names, profile.spectrum)), x),
    ]
    if profile.kappa is not None:
        values.append(MetricValue(origin, metric_name("LayerSensitivityKappa", strategy), float(profile.kappa), x))
    if profile.alpha_hat is not None:
        values.append(MetricValue(origin, metric_name("LayerSensitivityAlphaHat", strategy), float(profile.alpha_hat), x))
    if not wants_images(strategy):
        return values
    title = (f"s_l after experience {profile.experience} "
             + ("(every layer dead)" if profile.kappa is None else f"(kappa={profile.kappa:.3g})"))
    names, spectrum = list(profile.layer_names), [float(v) for v in profile.spectrum]
    figure = DeferredFigure(profile_figure, names, spectrum, title, figsize=profile_figure_size(names))
    values.append(MetricValue(origin, metric_name("LayerSensitivityProfile", strategy), figure, x))
    return values
