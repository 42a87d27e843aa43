"""Depth-weighted learning rates: one optimizer parameter group per layer.

The "depth-weighted SLCA" idea of "Layers Matter" (Moser et al., 2026): instead of SLCA's two
groups (backbone at lr × 0.01, head at lr), every layer ℓ gets its own rate

* ``geometric``: ``lr_ℓ = base_lr · α^{-(ℓ-1)} / max_k α^{-(k-1)}`` (α < 1: deeper layers learn
  faster, as in SLCA, and the last layer gets ``base_lr``; α > 1: the first layer gets it);
* ``smoothed``: ``lr_ℓ = base_lr · v_ℓ / max v`` with ``v_ℓ = 1 / ŝ_ℓ`` the inverse of the geometric
  fit of the per-layer curvature measured at the end of the previous experience (sensitive layers
  move less; the least sensitive layer gets ``base_lr``). This inverse rule is this package's
  reconstruction of "the smoothed profile" for learning rates. The first experience, with no
  profile yet, trains every layer at ``base_lr``.

The groups are built at the start of the first epoch of every experience (``before_training_epoch``),
after Avalanche's own ``make_optimizer`` and after every plugin's ``before_training_exp``, and are
merged back into one group at ``after_training_exp`` (at the optimizer's own rate). Between experiences the
optimizer therefore has the one group Avalanche's optimizer adaptation expects: the new parameters
of a dynamic model (a PNN column, a new head) land in it and then in their layer's group, and
``FromScratchTraining``'s ``reset_optimizer`` (one group only) works; a strategy that replaces the
model (GDumb) is grouped from its new model. Groups are edited in place on the same optimizer: its
per-parameter state (momentum, Adam moments) is kept. Parameters outside every layer form a last
group at ``base_lr``.

``smoothed`` follows the model: when the layers differ from those of the last measured profile (a
PNN column added, a model replaced), the profile is re-measured on the current model and the
incoming experience before the groups are built, with a warning; ``history[i]["remeasured"]`` says
so. On an online stream (``split_online_stream``) the profile is measured once per original
experience, at its last sub-experience, which needs ``access_task_boundaries=True`` (refused before
training without it); ``geometric`` needs no boundaries.

No layer ever gets more than ``base_lr``: on a 21-layer ResNet an unnormalised ``α = 0.5`` would
give the head ``2^20 · base_lr``. No layer gets less than ``min_lr_ratio · base_lr`` (default
``1e-3``) either, so no schedule freezes a layer: every rate above is
``max(rate, min_lr_ratio · base_lr)``. This matters for ``smoothed`` on models whose curvature
spans many orders of magnitude (κ ≈ 1e22 on a MobileNetV3 gave early layers 1e-16 · base_lr) and
for steep geometric schedules on deep models. Dead layers (``s_ℓ <= 0``) are left out of the fit
and get the rate the fit predicts at their depth (see
:func:`~avalanche_plugins.layer_adaptive.schedules.layer_weights`, which also warns naming them),
floored like every other. A training loss that is non-finite at the end of an
epoch stops the run with a ``FloatingPointError`` that names the rates in use.

At the first experience, before any iteration, a pre-flight
(:mod:`avalanche_plugins._avalanche.preflight`) checks the model's output type, its layer map and,
for ``smoothed``, the curvature estimator on two samples: an unsupported model is refused before
training, not after the first experience.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import torch
from avalanche.core import SupervisedPlugin

from avalanche_plugins._avalanche.boundaries import at_origin, current_boundary, enter_boundary
from avalanche_plugins._avalanche.data import experience_layer_map
from avalanche_plugins._avalanche.preflight import preflight, with_output_transform
from avalanche_plugins.core.checks import check_choice, check_positive
from avalanche_plugins.core.outputs import check_output_transform
from avalanche_plugins.layer_adaptive.curvature_metric import curvature_probe, measure_profile
from avalanche_plugins.layer_adaptive.options import CurvatureOptions, options_from
from avalanche_plugins.layer_adaptive.schedules import layer_weights

__all__ = ["LayerAdaptiveLRPlugin"]


class LayerAdaptiveLRPlugin(SupervisedPlugin):
    """Per-layer learning rates (see module docstring).

    :param schedule: ``geometric`` or ``smoothed``.
    :param alpha: ratio of the geometric schedule (> 0).
    :param base_lr: the largest per-layer rate (the fastest layer: the last one for ``alpha < 1``,
        the first for ``alpha > 1``, the least sensitive one for smoothed); default: the optimizer's
        first-group lr when the plugin first runs.
    :param min_lr_ratio: the floor: no layer's rate is below ``min_lr_ratio · base_lr`` (in
        ``[0, 1]``; 0 disables the floor).
    :param curvature: ``fisher`` (default) or ``hessian``: how ``s_ℓ`` is measured (smoothed;
        see ``layer_adaptive.curvature``).
    :param spectrum_samples, spectrum_max_iter, spectrum_tol: measurement budget (smoothed;
        samples None: 128 for ``fisher``, 256 for ``hessian``; iterations and tolerance: ``hessian``).
    :param seed: seeds the measurement.
    :param curvature_options: the measurement keywords above as one
        :class:`~avalanche_plugins.layer_adaptive.options.CurvatureOptions` (one form, not both).
    :param output_transform: for a model whose forward returns a tuple or a dict, a function from
        its output to the logits tensor (the measurement applies ``strategy._criterion`` to them);
        without it such a model is refused before training with a ``ValueError`` naming it.
    """

    def __init__(self, schedule: str = "geometric", alpha: float = 0.5, base_lr: float | None = None, *,
                 curvature: str = "fisher", spectrum_samples: int | None = None, spectrum_max_iter: int = 100, spectrum_tol: float = 1e-3,
                 seed: int = 0, min_lr_ratio: float = 1e-3, output_transform=None,
                 curvature_options: CurvatureOptions | None = None):
        super().__init__()
        check_output_transform(output_transform)
        self.output_transform = output_transform
        check_choice("schedule", schedule, ("geometric", "smoothed"))
        check_positive("alpha", alpha)
        if base_lr is not None:
            check_positive("base_lr", base_lr)
        measuring = options_from(CurvatureOptions, curvature_options, "curvature_options", dict(
            curvature=curvature, spectrum_samples=spectrum_samples, spectrum_max_iter=spectrum_max_iter,
            spectrum_tol=spectrum_tol, seed=seed))
        check_positive("min_lr_ratio", min_lr_ratio, allow_zero=True)
        if min_lr_ratio > 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1] (a fraction of base_lr), got {min_lr_ratio!r}")
        self.min_lr_ratio = float(min_lr_ratio)
        self.schedule, self.alpha, self.base_lr = schedule, alpha, base_lr
        vars(self).update(dataclasses.asdict(measuring))
        self.last_spectrum: list[float] | None = None
        self.last_names: list[str] | None = None  # the layers of last_spectrum
        self.history: list[dict] = []  # per experience: layer names and the rates applied

    def layer_rates(self, n_layers: int) -> np.ndarray:
        """``lr_ℓ`` for the ``n_layers`` layers (module docstring), in
        ``[min_lr_ratio · base_lr, base_lr]``."""
        if self.schedule == "geometric":
            weights = layer_weights("geometric", n_layers, alpha=self.alpha)
            relative = weights / weights.max()
        elif self.last_spectrum is None or len(self.last_spectrum) != n_layers:
            relative = np.ones(n_layers)
        else:
            names = self.last_names if self.last_names is not None and len(self.last_names) == n_layers else None
            inverse = 1.0 / layer_weights("smoothed", n_layers, spectrum=self.last_spectrum, names=names)
            relative = inverse / inverse.max()
        return self.base_lr * np.maximum(relative, self.min_lr_ratio)

    @with_output_transform
    def before_training_exp(self, strategy, **kwargs):
        enter_boundary(self, strategy, "LayerAdaptiveLRPlugin", needs_access=self.schedule == "smoothed")
        preflight(self, strategy, curvature_probe(self.curvature) if self.schedule == "smoothed" else None,
                  output_transform=self.output_transform)
        if self.base_lr is None:
            self.base_lr = float(strategy.optimizer.param_groups[0]["lr"])
        self._grouped = False

    @with_output_transform
    def before_training_epoch(self, strategy, **kwargs):
        if not self.__dict__.get("_grouped", True):
            self._split_groups(strategy)
            self._grouped = True

    def before_training_iteration(self, strategy, **kwargs):
        # a template whose loop skips before_training_epoch still trains with the per-layer rates
        self.before_training_epoch(strategy, **kwargs)

    def _split_groups(self, strategy) -> None:
        """One optimizer group per layer of the current model at its rate (module docstring)."""
        optimizer = strategy.optimizer
        if len(optimizer.param_groups) == 1:  # the rate it goes back to between experiences
            self._merged_lr = float(optimizer.param_groups[0]["lr"])
        layer_map = experience_layer_map(strategy)
        remeasured = self.schedule == "smoothed" and self.last_names is not None and self.last_names != layer_map.names
        if remeasured:
            warnings.warn(f"LayerAdaptiveLRPlugin: the model's {len(layer_map)} layers differ from the "
                          f"{len(self.last_names)} of the last measured profile (the strategy changed the model); "
                          "re-measuring the profile on the current model", stacklevel=2)
            with at_origin(strategy, current_boundary(self, strategy)):
                self._measure(strategy)
        index_of, _ = layer_map.attach_parameters()
        rates = self.layer_rates(len(layer_map))
        template = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
        groups: list[list] = [[] for _ in range(len(layer_map) + 1)]
        for name, param in strategy.model.named_parameters():
            if id(param) in in_optimizer:
                groups[index_of.get(name, len(layer_map))].append(param)
        optimizer.param_groups.clear()
        for params, lr in zip(groups, [*rates, self.base_lr]):
            if params:
                optimizer.add_param_group({**template, "params": params, "lr": float(lr)})
        self.history.append({"experience": current_boundary(self, strategy).index, "layers": layer_map.names,
                             "lr": [float(r) for r in rates], "spectrum": self.last_spectrum,
                             "remeasured": remeasured})

    @staticmethod
    def _merge_groups(optimizer, lr: float) -> None:
        """Back to one group at ``lr``, the optimizer's rate before the split (state kept: it is keyed
        by parameter)."""
        if len(optimizer.param_groups) <= 1:
            return
        template = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        params = [p for group in optimizer.param_groups for p in group["params"]]
        optimizer.param_groups.clear()
        optimizer.add_param_group({**template, "params": params, "lr": float(lr)})

    def after_training_epoch(self, strategy, **kwargs):
        # once per epoch, not per iteration (no device sync on the hot path): a diverged loss stays
        # non-finite, so the epoch's last loss shows it
        loss = strategy.loss
        if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss).all()):
            rates = self.history[-1]["lr"] if self.history else []
            raise FloatingPointError(
                f"the training loss is {float(loss)} after iteration {strategy.clock.train_iterations} with "
                f"per-layer rates from {min(rates, default=float('nan')):.3g} to {max(rates, default=float('nan')):.3g} "
                f"(schedule={self.schedule!r}, alpha={self.alpha}, base_lr={self.base_lr}): lower base_lr")

    @with_output_transform
    def after_training_exp(self, strategy, **kwargs):
        self._merge_groups(strategy.optimizer, self.__dict__.get("_merged_lr", self.base_lr))
        boundary = current_boundary(self, strategy)
        if self.schedule == "smoothed" and boundary.last:
            with at_origin(strategy, boundary):
                self._measure(strategy)

    def _measure(self, strategy) -> None:
        spectrum = measure_profile(strategy, method=self.curvature, n_samples=self.spectrum_samples,
                                   chunk_size=None, max_iter=self.spectrum_max_iter, tol=self.spectrum_tol,
                                   seed=self.seed + current_boundary(self, strategy).index)
        self.last_spectrum, self.last_names = spectrum.top.tolist(), list(spectrum.names)
