"""Layer-adaptive EWC: an EWC penalty whose strength varies per layer.

"Layers Matter: Why Continual Learning Regularization Should Be Layer-Adaptive" (Moser et al.,
2026) bounds forgetting by ``½ Σ_ℓ s_ℓ ‖Δθ^(ℓ)‖²`` with ``s_ℓ`` the top eigenvalue of layer ℓ's
Hessian block, and shows the optimal per-layer strength is ``λ_ℓ ∝ s_ℓ``; a geometric schedule
``λ_ℓ = c/α^(ℓ-1)`` follows when ``s_ℓ`` is geometric in depth. The penalty is

.. math:: Ω(θ) = \\sum_{e<t} \\sum_ℓ λ\\, w_ℓ^{(e)} \\sum_{i \\in ℓ} F_{e,i} (θ_i - θ^*_{e,i})^2

with ``w_ℓ`` from :func:`avalanche_plugins.layer_adaptive.schedules.layer_weights` and ``F`` from
:mod:`avalanche_plugins.layer_adaptive.fisher`. With ``schedule="uniform", fisher="batched"`` it is
Avalanche's ``EWCPlugin`` mathematically (same importances, same penalty value and gradient); the
folded quadratic below sums in a different order, so trained weights agree to float32 rounding
(measured 1.5e-8 to 1.2e-7 apart after a few experiences; bit-identical only in some
configurations), not bit for bit.

Implementation: the sum of quadratics over past experiences is folded, once per experience,
into one quadratic per parameter, ``A (θ - m)² + c`` (exact: ``A = Σ_e λ w F_e``,
``m = Σ_e λ w F_e θ*_e / A``, ``c`` the constant from completing the square, kept in float64),
stored as flat buffers. The per-iteration penalty is then one ``cat`` and three vector ops,
whatever the number of experiences (Avalanche's loops over experiences × parameters).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field

import torch
from avalanche.core import SupervisedPlugin

from avalanche_plugins._avalanche.boundaries import at_origin, current_boundary, enter_boundary
from avalanche_plugins._avalanche.data import (
    experience_batches,
    experience_layer_map,
    experience_tensors,
)
from avalanche_plugins._avalanche.distributed import global_batch_size, plain_model
from avalanche_plugins._avalanche.loop import require_callbacks
from avalanche_plugins._avalanche.preflight import preflight, with_output_transform
from avalanche_plugins.core.checks import (
    check_choice,
    check_no_recurrent,
    check_positive,
)
from avalanche_plugins.core.outputs import check_output_transform
from avalanche_plugins.layer_adaptive.curvature_metric import (
    curvature_probe,
    logs_sensitivity,
    measure_profile,
    sensitivity_values,
)
from avalanche_plugins.layer_adaptive.fisher import (
    batched_fisher,
    fisher_diagonal,
)
from avalanche_plugins.layer_adaptive.options import CurvatureOptions, FisherOptions, options_from
from avalanche_plugins.layer_adaptive.profile import LayerProfile, layer_profile
from avalanche_plugins.layer_adaptive.quadratic import fold_quadratic, pad_to, quadratic_penalty
from avalanche_plugins.layer_adaptive.schedules import SCHEDULES, layer_weights

__all__ = ["EWCProfile", "LayerAdaptiveEWCPlugin"]


@dataclass
class EWCProfile(LayerProfile):
    """What the plugin measured and applied at the end of one experience: the curvature profile
    (when a schedule or ``log_profile`` measured it) and the strengths ``λ_ℓ = ewc_lambda · w_ℓ``."""

    lambdas: list[float] = field(default_factory=list)


class LayerAdaptiveEWCPlugin(SupervisedPlugin, supports_distributed=True):
    """EWC with per-layer strengths ``λ_ℓ = ewc_lambda · w_ℓ`` (see module docstring).

    :param ewc_lambda: overall strength λ (>= 0).
    :param schedule: ``uniform`` | ``geometric`` | ``measured`` | ``smoothed``.
    :param alpha: ratio of the geometric schedule (> 0; > 1 protects early layers more).
    :param fisher: ``batched`` (Avalanche's) | ``empirical`` | ``expected``.
    :param mode: ``separate`` (one anchor per experience) or ``online`` (Avalanche's online EWC:
        importances decay by ``decay_factor`` and accumulate, anchor = latest weights).
    :param decay_factor: required for (and only for) ``online``.
    :param curvature: how ``s_ℓ`` is measured: ``fisher`` (default; top eigenvalue of each layer's
        Fisher block, exact from per-sample gradients, bounded cost on a ResNet-18) or ``hessian``
        (exact Hessian blocks by block Lanczos; see ``layer_adaptive.curvature``).
    :param spectrum_samples: samples of each experience used to measure ``s_ℓ`` (None: 128 for
        ``fisher``, 256 for ``hessian``).
    :param spectrum_chunk_size: samples per vectorised call (None: the method's default, 16 for
        ``fisher``, 32 for ``hessian``).
    :param spectrum_max_iter, spectrum_tol: power-iteration budget and tolerance (``hessian``).
    :param fisher_samples: cap on samples for the per-sample Fisher estimators (None: all).
    :param fisher_chunk_size: samples per vectorised pass of the per-sample Fisher estimators
        (memory knob; the result does not depend on it; ``expected`` holds ``chunk_size × classes``
        gradients at once).
    :param log_profile: measure ``s_ℓ`` after every experience even for schedules that do not need
        it, and publish it (per-layer dict, κ, α̂, bar chart) through the strategy's evaluator.
    :param seed: seeds sample selection and power-iteration start vectors.
    :param curvature_options, fisher_options: the curvature / Fisher keywords above as one
        :class:`~avalanche_plugins.layer_adaptive.options.CurvatureOptions` /
        :class:`~avalanche_plugins.layer_adaptive.options.FisherOptions` (give one form, not both).
    :param output_transform: for a model whose forward returns a tuple or a dict, a function from
        its output to the logits tensor (the Fisher and ``s_ℓ`` then use ``strategy._criterion`` on
        those logits); without it such a model is refused before training (``ValueError`` naming it).

    Reductions: ``s_ℓ`` and the ``empirical``/``expected`` importances are the curvature of
    ``strategy._criterion`` as it reduces over the samples measured (the mean loss's for a
    mean-reduced criterion, the sum's, ``N`` times larger, for a sum-reduced one:
    :mod:`avalanche_plugins.core.reductions`); ``s_ℓ`` enters only through the normalised weights
    ``w_ℓ``, so its scale does not matter; ``batched`` squares each minibatch's criterion as it is
    (Avalanche's). A criterion with ``reduction='none'`` is refused before training.

    At the first experience, before any iteration, a pre-flight
    (:mod:`avalanche_plugins._avalanche.preflight`) checks the output type, the layer map and, on
    two samples, the curvature estimator (``measured``/``smoothed``/``log_profile``) and the
    per-sample Fisher (``empirical``/``expected``): an unsupported model is refused before
    training, not after the first experience.

    The penalty is added in ``before_backward``: a strategy whose training loop never calls it
    (MER) is refused before training (:mod:`avalanche_plugins._avalanche.loop`). On an online
    stream (``split_online_stream(..., access_task_boundaries=True)``; refused before training when
    the stream hides its boundaries, and on a task-agnostic stream such as
    ``split_continuous_linear_decay_stream``'s, which has no original experiences) the Fisher and
    anchor are taken once per original experience, at its last sub-experience, on its data
    (:mod:`avalanche_plugins._avalanche.boundaries`).

    Parameters outside every layer of the layer map get weight 1 and a one-time warning;
    normalisation parameters share the weight of the layer they follow, and heads not run by the
    example batch the weight of their executed sibling (``LayerMap.attach_parameters``).
    """

    def __init__(self, ewc_lambda: float, schedule: str = "geometric", alpha: float | None = 2.0,
                 fisher: str = "batched", mode: str = "separate", decay_factor: float | None = None, *,
                 curvature: str = "fisher", spectrum_samples: int | None = None,
                 spectrum_chunk_size: int | None = None,
                 spectrum_max_iter: int = 100, spectrum_tol: float = 1e-3, fisher_samples: int | None = None,
                 fisher_chunk_size: int = 16,
                 log_profile: bool = False, seed: int = 0, output_transform=None,
                 curvature_options: CurvatureOptions | None = None, fisher_options: FisherOptions | None = None):
        super().__init__()
        check_output_transform(output_transform)
        self.output_transform = output_transform
        check_positive("ewc_lambda", ewc_lambda, allow_zero=True)
        check_choice("schedule", schedule, SCHEDULES)
        check_choice("mode", mode, ("separate", "online"))
        if schedule == "geometric":
            if alpha is None:
                raise ValueError("alpha is required for the geometric schedule")
            check_positive("alpha", alpha)
        if mode == "online":
            if decay_factor is None:
                raise ValueError("decay_factor is required for mode='online'")
            check_positive("decay_factor", decay_factor, allow_zero=True)
        elif decay_factor is not None:
            raise ValueError("decay_factor is only used with mode='online'")
        measuring = options_from(CurvatureOptions, curvature_options, "curvature_options", dict(
            curvature=curvature, spectrum_samples=spectrum_samples, spectrum_chunk_size=spectrum_chunk_size,
            spectrum_max_iter=spectrum_max_iter, spectrum_tol=spectrum_tol, seed=seed))
        importances = options_from(FisherOptions, fisher_options, "fisher_options", dict(
            fisher=fisher, fisher_samples=fisher_samples, fisher_chunk_size=fisher_chunk_size))
        self.ewc_lambda = float(ewc_lambda)
        self.schedule, self.alpha, self.mode, self.decay_factor = schedule, alpha, mode, decay_factor
        vars(self).update(dataclasses.asdict(measuring), **dataclasses.asdict(importances))
        self.log_profile = log_profile
        self.profiles: list[EWCProfile] = []
        # the folded quadratic A (θ - m)² + const, per parameter name (CPU-independent tensors)
        self._curvature: dict[str, torch.Tensor] = {}
        self._anchor: dict[str, torch.Tensor] = {}
        self._const = 0.0
        self._flat: tuple[list[str], torch.Tensor, torch.Tensor] | None = None
        self._warned_leftovers = False

    # ------------------------------------------------------------------ exposure
    @property
    def lambdas(self) -> list[list[float]]:
        """λ_ℓ applied for every experience so far."""
        return [p.lambdas for p in self.profiles]

    def penalty(self, model: torch.nn.Module) -> torch.Tensor:
        """The current penalty Ω(θ) for ``model`` (differentiable; 0 before the first experience)."""
        if not self._curvature:
            return torch.zeros((), device=next(model.parameters()).device)
        names, curvature, anchor = self._current_flat(model)
        return quadratic_penalty(dict(model.named_parameters()), names, curvature, anchor) + self._const

    # ------------------------------------------------------------------ callbacks
    def before_training_exp(self, strategy, **kwargs):
        enter_boundary(self, strategy, "LayerAdaptiveEWCPlugin", needs_access=True,
                       needs="takes the Fisher and the anchor of each original experience at its end, on its data")
        require_callbacks("LayerAdaptiveEWCPlugin", strategy, ["before_backward"],
                          "the EWC penalty is added to the loss")
        preflight(self, strategy, self._probe, output_transform=self.output_transform)

    def _probe(self, model, loss_fn, x, y, task_labels):
        """The pre-flight's estimators on its few samples (the batched Fisher is a plain backward pass)."""
        if self.schedule in ("measured", "smoothed") or self.log_profile:
            curvature_probe(self.curvature, self.spectrum_chunk_size)(model, loss_fn, x, y, task_labels)
        if self.fisher == "batched":  # reduction='none' is refused before training
            batched_fisher(model, loss_fn, [(x, y, task_labels)])
        else:
            fisher_diagonal(self.fisher, model, loss_fn, x, y, task_labels=task_labels)

    def before_training(self, strategy, **kwargs):
        if self.fisher in ("empirical", "expected"):  # per-sample gradients: refuse before training
            check_no_recurrent(plain_model(strategy), f"LayerAdaptiveEWCPlugin(fisher={self.fisher!r})")

    def before_backward(self, strategy, **kwargs):
        self._penalised = True
        if self._curvature and self.ewc_lambda > 0:
            strategy.loss += self.penalty(plain_model(strategy))

    def after_training_iteration(self, strategy, **kwargs):
        # the runtime guard behind require_callbacks (a loop whose source cannot be read)
        if not self.__dict__.pop("_penalised", False) and self._curvature and self.ewc_lambda > 0:
            raise RuntimeError(f"LayerAdaptiveEWCPlugin: {type(strategy).__name__} ran a training iteration "
                               "without calling before_backward, so the EWC penalty was not added; use a "
                               "strategy with Avalanche's SGD loop")

    @with_output_transform
    def after_training_exp(self, strategy, **kwargs):
        boundary = current_boundary(self, strategy)
        if not boundary.last:  # online: once per original experience, at its last sub-experience
            return
        with at_origin(strategy, boundary):
            self._consolidate(strategy, boundary.index, kwargs.get("num_workers", 0))

    def _consolidate(self, strategy, exp_id: int, num_workers: int) -> None:
        """Measure (profile, Fisher) on the experience just trained and fold its quadratic in."""
        model = plain_model(strategy)
        timings = {}
        spectrum = None
        if self.schedule in ("measured", "smoothed") or self.log_profile:
            start = time.perf_counter()
            spectrum = measure_profile(strategy, method=self.curvature, n_samples=self.spectrum_samples,
                                       chunk_size=self.spectrum_chunk_size, max_iter=self.spectrum_max_iter,
                                       tol=self.spectrum_tol, seed=self.seed + exp_id)
            timings["spectrum"] = time.perf_counter() - start
        start = time.perf_counter()
        importances = self._importances(strategy, num_workers)
        timings["fisher"] = time.perf_counter() - start

        layer_map = experience_layer_map(strategy)
        weights = layer_weights(self.schedule, len(layer_map), alpha=self.alpha,
                                spectrum=None if spectrum is None else spectrum.top)
        index_of, leftovers = layer_map.attach_parameters()
        if leftovers and not self._warned_leftovers:
            warnings.warn(f"parameters outside every layer get the uniform weight 1: {leftovers}", stacklevel=2)
            self._warned_leftovers = True

        self._fold(model, importances, {n: (weights[index_of[n]] if n in index_of else 1.0)
                                        for n, _ in model.named_parameters()})
        lambdas = (self.ewc_lambda * weights).tolist()
        if spectrum is None:
            profile = EWCProfile(experience=exp_id, layer_names=layer_map.names, lambdas=lambdas, seconds=timings)
        else:
            profile = EWCProfile(**vars(layer_profile(exp_id, spectrum, seconds=timings)), lambdas=lambdas)
        self.profiles.append(profile)
        if self.log_profile and spectrum is not None and not logs_sensitivity(strategy):
            self._publish(strategy, profile)  # a LayerSensitivityMetric would log the same points

    # ------------------------------------------------------------------ internals
    def _importances(self, strategy, num_workers: int) -> dict[str, torch.Tensor]:
        model, criterion = plain_model(strategy), strategy._criterion
        if self.fisher == "batched":
            # one RNG draw, like EWCPlugin, so uniform+batched follows EWCPlugin's random stream;
            # under torchrun the group's minibatch (every rank reads the whole experience)
            batches = experience_batches(strategy, batch_size=global_batch_size(strategy), num_workers=num_workers,
                                         preserve_rng=False)
            return batched_fisher(model, criterion, batches)
        # Per-sample estimators read the same (train-transform) data as Avalanche's EWC.
        x, y, t = experience_tensors(strategy, n_samples=self.fisher_samples, seed=self.seed, eval_transforms=False)
        return fisher_diagonal(self.fisher, model, criterion, x, y, task_labels=t, chunk_size=self.fisher_chunk_size)

    @torch.no_grad()
    def _fold(self, model, importances: dict, weight_of: dict) -> None:
        """Add this experience's quadratic λ w F (θ - θ*)² to the folded one."""
        for name, theta in model.named_parameters():
            theta = theta.detach().double()
            new_a = self.ewc_lambda * weight_of[name] * importances[name].detach().double()
            self._curvature[name], self._anchor[name], constant = fold_quadratic(
                self._curvature.get(name), self._anchor.get(name), new_a, theta,
                online=self.mode == "online", decay=self.decay_factor)
            self._const += constant
        self._flat = None
        self._current_flat(model)

    def _current_flat(self, model):
        """Flat float32 buffers aligned with the model's current parameters (rebuilt on growth)."""
        shapes = [(n, p.shape) for n, p in model.named_parameters() if n in self._curvature]
        if self._flat is None or self._flat[0] != shapes:
            device = next(model.parameters()).device
            dtype = next(model.parameters()).dtype
            curvature = torch.cat([pad_to(self._curvature[n], s).reshape(-1) for n, s in shapes])
            anchor = torch.cat([pad_to(self._anchor[n], s).reshape(-1) for n, s in shapes])
            self._flat = (shapes, curvature.to(device, dtype), anchor.to(device, dtype))
        shapes, curvature, anchor = self._flat
        return [n for n, _ in shapes], curvature, anchor

    def _publish(self, strategy, profile: EWCProfile) -> None:
        evaluator = getattr(strategy, "evaluator", None)
        if evaluator is None:
            return
        x = strategy.clock.train_iterations
        for value in sensitivity_values(self, strategy, profile, x):
            evaluator.publish_metric_value(value)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_flat"] = None  # derived; rebuilt on the next penalty
        return state
