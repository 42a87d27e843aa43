"""Depth-weighted learning rates: one optimizer parameter group per layer (and user group).

The "depth-weighted SLCA" idea of "Layers Matter" (Moser et al., 2026): instead of SLCA's two
groups (backbone at lr × 0.01, head at lr), every layer ℓ gets its own rate

* ``geometric``: ``lr_ℓ = base_lr · α^{-(ℓ-1)} / max_k α^{-(k-1)}`` (α < 1: deeper layers learn
  faster, as in SLCA, and the last layer gets ``base_lr``; α > 1: the first layer gets it);
* ``smoothed``: ``lr_ℓ = base_lr · v_ℓ / max v`` with ``v_ℓ = 1 / ŝ_ℓ`` the inverse of the geometric
  fit of the per-layer curvature measured at the end of the previous experience (sensitive layers
  move less; the least sensitive layer gets ``base_lr``). This inverse rule is this package's
  reconstruction of "the smoothed profile" for learning rates. The first experience, with no
  profile yet, trains every layer at its base rate (``f_ℓ = 1``).
* ``slca``: SLCA's slow learner itself (Zhang et al., ICCV 2023), as the baseline the depth-weighted
  schedules are compared with: ``lr_ℓ = base_lr · backbone_factor`` for every layer but the last, whose
  rate is ``base_lr`` (the head; ``backbone_factor`` 0.01 as in SLCA). Only SLCA's first half: its
  classifier alignment (re-training the head on sampled class-wise feature statistics) is not here.

**The user's parameter groups.** The rates scale the optimizer's own groups: a layer ℓ whose
parameters sit in a user group of rate ``r`` trains at ``r · f_ℓ``, with ``f_ℓ = lr_ℓ / base_lr``
the schedule's relative factor above (``relative_rates``), and keeps every other setting of that
group (weight decay, momentum, nesterov, betas, eps, ...). A layer whose parameters are spread
over several user groups gets one optimizer group per (layer, user group) pair, so e.g. a head at
``lr = 0.1`` without weight decay and a body at ``0.01`` with ``5e-4`` give the head's layers
``0.1 · f_ℓ`` (no decay) and the body's ``0.01 · f_ℓ`` (decay ``5e-4``). With ``base_lr=None`` (the
default) each user group's lr, read at the start of every experience, is the base of its layers;
an explicit ``base_lr`` replaces it for every group (``base_lr · f_ℓ``), which is refused before
training when the user groups have different rates (one base would erase the difference). With
one user group and ``base_lr=None`` the rates are ``r · f_ℓ``, ``r`` the optimizer's lr.

The groups are built at the start of the first epoch of every experience (``before_training_epoch``),
after Avalanche's own ``make_optimizer`` and after every plugin's ``before_training_exp``, and the
user's groups are restored at ``after_training_exp`` — the same groups in the same order, with the
same settings and the same parameters (:func:`~avalanche_plugins.core.optim.restore_param_groups`).
Between experiences the optimizer therefore has the groups Avalanche's optimizer adaptation
(``update_optimizer``) works on: the new parameters of a dynamic model (a PNN column, a new head)
land in the user group Avalanche infers from their siblings and then in their layer's group, and
``FromScratchTraining``'s ``reset_optimizer`` (one group only) works for a one-group optimizer;
a strategy that replaces the model (GDumb) is grouped from its new model. Groups are edited in
place on the same optimizer: its per-parameter state (momentum, Adam moments) is kept. Parameters
outside every layer stay at their user group's rate (``base_lr`` when given). A setting changed
during the experience alike on all the groups of a user group (a scheduler's step: ``lr`` by a
common factor) is carried back to it; one changed unevenly is not, with a warning naming it.

``smoothed`` follows the model: when the layers differ from those of the last measured profile (a
PNN column added, a model replaced), the profile is re-measured on the current model and the
incoming experience before the groups are built, with a warning; ``history[i]["remeasured"]`` says
so. On an online stream (``split_online_stream``) the profile is measured once per original
experience, at its last sub-experience, which needs ``access_task_boundaries=True`` (refused before
training without it); ``geometric`` needs no boundaries.

No layer ever gets more than its base rate: on a 21-layer ResNet an unnormalised ``α = 0.5`` would
give the head ``2^20 · base_lr``. No layer gets less than ``min_lr_ratio`` times its base rate (default
``1e-3``) either, so no schedule freezes a layer: every factor is ``f_ℓ = max(lr_ℓ / base_lr,
min_lr_ratio)``. This matters for ``smoothed`` on models whose curvature
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
from avalanche_plugins._avalanche.distributed import plain_model
from avalanche_plugins._avalanche.preflight import preflight, with_output_transform
from avalanche_plugins.core.checks import check_choice, check_positive
from avalanche_plugins.core.optim import restore_param_groups, split_param_groups
from avalanche_plugins.core.outputs import check_output_transform
from avalanche_plugins.layer_adaptive.curvature_metric import curvature_probe, measure_profile
from avalanche_plugins.layer_adaptive.options import CurvatureOptions, options_from
from avalanche_plugins.layer_adaptive.schedules import layer_weights

__all__ = ["LayerAdaptiveLRPlugin"]


class LayerAdaptiveLRPlugin(SupervisedPlugin, supports_distributed=True):
    """Per-layer learning rates (see module docstring; ``smoothed`` measures ``s_ℓ`` of
    ``strategy._criterion`` as it reduces, :mod:`avalanche_plugins.core.reductions`: scale-free here).

    :param schedule: ``geometric``, ``smoothed`` or ``slca`` (module docstring).
    :param alpha: ratio of the geometric schedule (> 0).
    :param backbone_factor: the ``slca`` schedule's rate of every layer but the last, as a fraction of
        the base rate (in ``(0, 1]``; parameters outside every layer keep the base rate).
    :param base_lr: the largest per-layer rate (the fastest layer: the last one for ``alpha < 1``,
        the first for ``alpha > 1``, the least sensitive one for smoothed), for every parameter
        group; default None: each of the optimizer's groups' own lr at the start of the experience
        is the base of its layers (module docstring). Refused before training when given with
        groups of different rates.
    :param min_lr_ratio: the floor: no layer's rate is below ``min_lr_ratio`` times its base rate
        (in ``[0, 1]``; 0 disables the floor).
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

    ``history[i]``, per (sub-)experience trained: ``experience`` (the original experience's index),
    ``layers``, ``relative`` (``f_ℓ``), ``lr`` (``b · f_ℓ``, ``b`` the plugin's ``base_lr`` or else
    the optimizer's first group's lr), ``groups`` (every optimizer group built, in order: ``layer``
    — None for parameters outside every layer —, ``user_group``, ``lr``, ``n_params``),
    ``spectrum`` and ``remeasured``.

    Example::

        head, body = list(model.head.parameters()), list(model.features.parameters())
        optimizer = SGD([{"params": head, "lr": 0.1}, {"params": body, "lr": 0.01, "weight_decay": 5e-4}],
                        momentum=0.9)
        strategy = Naive(model=model, optimizer=optimizer, criterion=criterion,
                         plugins=[LayerAdaptiveLRPlugin("geometric", alpha=0.5)])
        # while training: the head's layers at 0.1 · f_ℓ without weight decay, the body's at
        # 0.01 · f_ℓ with 5e-4, all with momentum 0.9; after each experience: the two groups above
    """

    def __init__(self, schedule: str = "geometric", alpha: float = 0.5, base_lr: float | None = None, *,
                 curvature: str = "fisher", spectrum_samples: int | None = None, spectrum_max_iter: int = 100, spectrum_tol: float = 1e-3,
                 seed: int = 0, min_lr_ratio: float = 1e-3, output_transform=None,
                 curvature_options: CurvatureOptions | None = None, backbone_factor: float = 0.01):
        super().__init__()
        check_output_transform(output_transform)
        self.output_transform = output_transform
        check_choice("schedule", schedule, ("geometric", "smoothed", "slca"))
        check_positive("alpha", alpha)
        check_positive("backbone_factor", backbone_factor)
        if backbone_factor > 1:
            raise ValueError(f"backbone_factor must be in (0, 1] (a fraction of the head's rate), got {backbone_factor!r}")
        self.backbone_factor = float(backbone_factor)
        if base_lr is not None:
            check_positive("base_lr", base_lr)
        measuring = options_from(CurvatureOptions, curvature_options, "curvature_options", dict(
            curvature=curvature, spectrum_samples=spectrum_samples, spectrum_max_iter=spectrum_max_iter,
            spectrum_tol=spectrum_tol, seed=seed))
        check_positive("min_lr_ratio", min_lr_ratio, allow_zero=True)
        if min_lr_ratio > 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1] (a fraction of base_lr), got {min_lr_ratio!r}")
        self.min_lr_ratio = float(min_lr_ratio)
        if schedule == "slca" and backbone_factor < min_lr_ratio:
            raise ValueError(f"backbone_factor={backbone_factor} is below min_lr_ratio={min_lr_ratio}, which would "
                             "raise it to the floor: lower min_lr_ratio or raise backbone_factor")
        self.schedule, self.alpha, self.base_lr = schedule, alpha, base_lr
        vars(self).update(dataclasses.asdict(measuring))
        self.last_spectrum: list[float] | None = None
        self.last_names: list[str] | None = None  # the layers of last_spectrum
        self.history: list[dict] = []  # per (sub-)experience trained (class docstring)
        self._split = None  # (optimizer, ParamGroupSplit) while the per-layer groups are in place
        self._first_lr: float | None = None  # the first user group's lr at the last split

    def relative_rates(self, n_layers: int) -> np.ndarray:
        """``f_ℓ = max(lr_ℓ / base_lr, min_lr_ratio)`` for the ``n_layers`` layers (module
        docstring): the factor applied to each layer's base rate, in ``[min_lr_ratio, 1]``.

        Example:
            >>> LayerAdaptiveLRPlugin("geometric", alpha=0.5).relative_rates(3).tolist()
            [0.25, 0.5, 1.0]
            >>> LayerAdaptiveLRPlugin("slca").relative_rates(3).tolist()
            [0.01, 0.01, 1.0]
        """
        if self.schedule == "slca":
            relative = np.full(n_layers, self.__dict__.get("backbone_factor", 0.01))
            relative[-1] = 1.0
        elif self.schedule == "geometric":
            weights = layer_weights("geometric", n_layers, alpha=self.alpha)
            relative = weights / weights.max()
        elif self.last_spectrum is None or len(self.last_spectrum) != n_layers:
            relative = np.ones(n_layers)
        else:
            names = self.last_names if self.last_names is not None and len(self.last_names) == n_layers else None
            inverse = 1.0 / layer_weights("smoothed", n_layers, spectrum=self.last_spectrum, names=names)
            relative = inverse / inverse.max()
        return np.maximum(relative, self.min_lr_ratio)

    def layer_rates(self, n_layers: int, base_lr: float | None = None) -> np.ndarray:
        """``lr_ℓ = b · f_ℓ`` for the ``n_layers`` layers (module docstring), in
        ``[min_lr_ratio · b, b]``: the rates of layers whose parameters are in a group of base
        ``b`` = ``base_lr`` (this call's, else the plugin's, else the optimizer's first group's lr
        when the groups were last built).

        Example:
            >>> LayerAdaptiveLRPlugin("geometric", alpha=0.5).layer_rates(3, base_lr=0.1).tolist()
            [0.025, 0.05, 0.1]
        """
        base = next((b for b in (base_lr, self.base_lr, self.__dict__.get("_first_lr")) if b is not None), None)
        if base is None:
            raise ValueError("LayerAdaptiveLRPlugin.layer_rates: no base rate yet (the plugin has not built its "
                             "groups and was given no base_lr): pass layer_rates(n, base_lr=...)")
        return base * self.relative_rates(n_layers)

    @with_output_transform
    def before_training_exp(self, strategy, **kwargs):
        self._restore_groups()  # an experience that ended without after_training_exp (an exception)
        enter_boundary(self, strategy, "LayerAdaptiveLRPlugin", needs_access=self.schedule == "smoothed")
        preflight(self, strategy, curvature_probe(self.curvature) if self.schedule == "smoothed" else None,
                  output_transform=self.output_transform)
        self._check_groups(strategy.optimizer)
        self._grouped = False

    def _check_groups(self, optimizer) -> None:
        """Refuse a ``base_lr`` that would erase the rates the user gave the groups (module docstring)."""
        rates = [float(group["lr"]) for group in optimizer.param_groups]
        if self.base_lr is not None and len(set(rates)) > 1:
            raise ValueError(
                f"LayerAdaptiveLRPlugin: base_lr={self.base_lr} would give every layer the same base rate, but the "
                f"optimizer's {len(rates)} parameter groups have different learning rates {rates}; leave base_lr="
                "None so that each group's lr is the base of its layers' rates, or give the groups one lr")

    @with_output_transform
    def before_training_epoch(self, strategy, **kwargs):
        if not self.__dict__.get("_grouped", True):
            self._split_groups(strategy)
            self._grouped = True

    def before_training_iteration(self, strategy, **kwargs):
        # a template whose loop skips before_training_epoch still trains with the per-layer rates
        self.before_training_epoch(strategy, **kwargs)

    def _layer_map(self, strategy):
        """The current model's layer map, re-measuring a smoothed profile of other layers (module
        docstring); ``(layer_map, remeasured)``."""
        layer_map = experience_layer_map(strategy)
        remeasured = self.schedule == "smoothed" and self.last_names is not None and self.last_names != layer_map.names
        if remeasured:
            warnings.warn(f"LayerAdaptiveLRPlugin: the model's {len(layer_map)} layers differ from the "
                          f"{len(self.last_names)} of the last measured profile (the strategy changed the model); "
                          "re-measuring the profile on the current model", stacklevel=3)
            with at_origin(strategy, current_boundary(self, strategy)):
                self._measure(strategy)
        return layer_map, remeasured

    def _split_groups(self, strategy) -> None:
        """One optimizer group per (layer, user group) of the current model at its rate (module docstring)."""
        self._restore_groups()  # never split the per-layer groups themselves
        optimizer = strategy.optimizer
        layer_map, remeasured = self._layer_map(strategy)
        index_of, _ = layer_map.attach_parameters()
        slot_of = {id(p): index_of[name] for name, p in plain_model(strategy).named_parameters() if name in index_of}
        relative = self.relative_rates(len(layer_map))
        self._first_lr = float(optimizer.param_groups[0]["lr"]) if optimizer.param_groups else None
        split = split_param_groups(optimizer, slot_of, relative.tolist(), base=self.base_lr)
        self._split = (optimizer, split)
        names = [*layer_map.names, None]
        self.history.append({
            "experience": current_boundary(self, strategy).index, "layers": layer_map.names,
            "lr": [float(r) for r in self.layer_rates(len(layer_map))], "relative": relative.tolist(),
            "groups": [{"layer": names[-1 if slot is None else slot], "user_group": g, "lr": float(lr),
                        "n_params": len(group["params"])}
                       for (g, slot, _, lr), group in zip(split.built, optimizer.param_groups)],
            "spectrum": self.last_spectrum, "remeasured": remeasured})

    def _restore_groups(self) -> None:
        """The user's groups back on the optimizer the groups were built on (module docstring)."""
        if self.__dict__.get("_split") is None:
            return
        optimizer, split = self._split
        self._split = None
        uneven = restore_param_groups(optimizer, split)
        for g, key in uneven:
            warnings.warn(
                f"LayerAdaptiveLRPlugin: during the experience something (another plugin, a scheduler) changed "
                f"{key!r} unevenly on the per-layer groups of the optimizer's parameter group {g}, which cannot "
                f"be mapped back to that group: it gets back its {key!r} from the start of the experience",
                stacklevel=3)

    def after_training_epoch(self, strategy, **kwargs):
        # once per epoch, not per iteration (no device sync on the hot path): a diverged loss stays
        # non-finite, so the epoch's last loss shows it
        loss = strategy.loss
        if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss).all()):
            rates = [g["lr"] for g in self.history[-1]["groups"]] if self.history else []
            fix = ("lower base_lr" if self.base_lr is not None else
                   "lower the optimizer's learning rates (each group's lr is the base of its layers' rates)")
            raise FloatingPointError(
                f"the training loss is {float(loss.detach().sum())} after iteration {strategy.clock.train_iterations} with "
                f"per-layer rates from {min(rates, default=float('nan')):.3g} to {max(rates, default=float('nan')):.3g} "
                f"(schedule={self.schedule!r}, alpha={self.alpha}, base_lr={self.base_lr}): {fix}")

    @with_output_transform
    def after_training_exp(self, strategy, **kwargs):
        self._restore_groups()
        boundary = current_boundary(self, strategy)
        if self.schedule == "smoothed" and boundary.last:
            with at_origin(strategy, boundary):
                self._measure(strategy)

    def _measure(self, strategy) -> None:
        spectrum = measure_profile(strategy, method=self.curvature, n_samples=self.spectrum_samples,
                                   chunk_size=None, max_iter=self.spectrum_max_iter, tol=self.spectrum_tol,
                                   seed=self.seed + current_boundary(self, strategy).index)
        self.last_spectrum, self.last_names = spectrum.top.tolist(), list(spectrum.names)
