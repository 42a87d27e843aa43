"""Architecture-Driven Shift (ADS): how far old-task logits move when a trained model learns a new task.

ADS is a stability score for choosing among architectures before continual training ("Architecture
Matters in Continual Learning", arXiv 2605.27469). The paper's formula was not available; this
module implements the project's own reconstruction from a first-order expansion of one optimizer
step ``Δθ = η u`` on the new task. The derivation, its assumptions and the evidence for each path
are in ``docs/ads.md``; in short,

.. math::

    \\hat d_ℓ = \\frac{1}{n_{ℓ−1}} \\cdot \\frac1N \\sum_a \\lVert J_ℓ(x_a) u_ℓ \\rVert_2 ,
    \\qquad
    \\mathrm{ADS} = P \\sum_ℓ n_{ℓ−1} \\, \\hat d_ℓ ,

with ``J_ℓ`` the Jacobian of the logits w.r.t. layer ``ℓ``'s parameters over the old inputs
``x_a``, ``u`` the unit-lr update direction (``−∇L_new`` for SGD, ``−g/(|g| + ε)`` for Adam's first
step), ``n_{ℓ−1}`` the fan-in (the architecture term) and the path factor ``P``:

* ``"budget"``: ``η T``;
* ``"probe"``: ``η (1 − ρ^T)/(1 − ρ)``, ``ρ`` the update-norm decay of a short full-batch probe;
* ``"loss"``: ``min(η T, (L_new − L*) / (−⟨∇L_new, u⟩))``;
* ``"logit"``: ``min(η T, (L_new − L*) / v_new)``, ``v_new = (1/m) Σ_b ‖J(x_b) u‖`` — the step
  length after which the new-task logits have moved, to first order, by the loss to go.

``J_ℓ u_ℓ`` comes from ``torch.func.jvp`` (all layers' tangents stacked in one ``vmap``); no
Jacobian is formed. Parameters outside every layer form one extra group ``"(unassigned)"`` with
architecture term 1. Conventions as in :mod:`avalanche_plugins.readiness`: eval mode (restored),
parameters read through ``torch.func.functional_call`` (the model is never changed, the global RNG
is never used), ``L_new`` the per-sample mean loss whatever ``loss_fn``'s reduction (a sum-reduced
batch loss divided by its sample count, :func:`avalanche_plugins.core.reductions.mean_loss`, so the
step does not grow with the new-task sample), multi-task models receive ``task_labels``. The ground
truth is :func:`avalanche_plugins.ads.ground_truth.logit_shift`.

**What the width decomposition adds, measured.** Ranking a zoo of 136 MLPs and tiny ViTs by their
realised old-task shift (``benchmarks.ads_zoo``, docs/RESULTS.md), ADS on the logit path reaches
Spearman 0.866–0.975 over Split MNIST, Permuted MNIST, Split digits and Split Fashion-MNIST, but the
whole step's first-order logit change on the same path (``first_order_shift`` × ``P``, returned by
the same call at no extra cost) is within noise of it: +0.004 to +0.017 Spearman on MNIST and
digits, +0.005 on Fashion-MNIST (p 0.29 over 3 seeds). The logit path does the ranking; what the
per-layer terms ``d̂_ℓ`` give beyond it is the split of the predicted shift over layers
(``P · architecture_terms[ℓ] · data_terms[ℓ]``, the metric's ``ADSLayerShift``), not a better ranking.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from avalanche_plugins.ads.layer_terms import (
    UNASSIGNED,
    LayerGroup,
    layer_groups,
    layer_logit_changes,
)
from avalanche_plugins.core.calls import (
    eval_mode,
    grouped_loss_and_grad,
    split_params,
    stateless_forward,
    task_groups,
)
from avalanche_plugins.core.checks import (
    check_choice,
    check_estimator_inputs,
    check_inputs,
    check_int,
    check_positive,
)
from avalanche_plugins.core.layers import discover_layers, example_input
from avalanche_plugins.core.optim import AdamState, functional_step
from avalanche_plugins.core.reductions import mean_loss
from avalanche_plugins.core.stats import mean_row_norm

__all__ = [
    "ADS_OPTIMIZERS",
    "ADS_PATHS",
    "ADSResult",
    "architecture_driven_shift",
    "update_direction",
    "distance_path",
    "topology_only_shift",
]

ADS_OPTIMIZERS = ("sgd", "adam")
ADS_PATHS = ("budget", "probe", "loss", "logit")


@dataclass(frozen=True)
class ADSResult:
    """Output of :func:`architecture_driven_shift`.

    Attributes:
        ads: ``P · Σ_ℓ n_{ℓ−1} d̂_ℓ``.
        layer_names: the groups' names (layer-map order; ``"(unassigned)"`` last when present).
        architecture_terms: fan-ins ``n_{ℓ−1}`` (1 for the unassigned group).
        data_terms: ``d̂_ℓ = mean_a ‖J_ℓ(x_a) u_ℓ‖ / n_{ℓ−1}`` for a unit step.
        path_factor: ``P`` (``lr·steps``; ``lr·Σ_{t<T} ρ^t`` for the probe; ``min(lr·steps,
            (L_new − L*)/(−⟨∇L_new, u⟩))`` for the loss path; ``min(lr·steps, (L_new − L*)/
            new_first_order_shift)`` for the logit path).
        first_order_shift: ``mean_a ‖Σ_ℓ J_ℓ(x_a) u_ℓ‖`` (unit step): the first-step logit
            change without the width decomposition; ``lr·first_order_shift`` predicts one step.
        new_loss: new-task loss at the checkpoint. grad_norm: ``‖∇L_new‖``.
        optimizer, path, lr, steps: the arguments.
        decay: fitted per-step decay ``ρ`` (probe path; None for the budget path).
        probe_norms: update norms measured by the probe (empty for the other paths).
        new_first_order_shift: ``mean_b ‖J(x_b) u‖`` on the new-task sample (unit step; logit
            path only, else None).
        descent_rate: ``−⟨∇L_new, u⟩``, the first-order loss decrease per unit step (the loss
            path's denominator; any path's terms give the loss path's ``P`` from it).
        seconds: wall time of the whole computation.
    """

    ads: float
    layer_names: list[str]
    architecture_terms: list[int]
    data_terms: list[float]
    path_factor: float
    first_order_shift: float
    new_loss: float
    grad_norm: float
    optimizer: str
    path: str
    lr: float
    steps: int
    decay: float | None = None
    probe_norms: list[float] = field(default_factory=list)
    new_first_order_shift: float | None = None
    descent_rate: float = 0.0
    seconds: float = 0.0

    @property
    def layer_shifts(self) -> list[float]:
        """``n_{ℓ−1} d̂_ℓ`` per group: mean logit-change norm of each layer's unit step."""
        return [n * d for n, d in zip(self.architecture_terms, self.data_terms)]

    @property
    def unit_shift(self) -> float:
        """``Σ_ℓ n_{ℓ−1} d̂_ℓ`` (ADS with ``P = 1``), the quantity the topology-only variant rescales."""
        return float(sum(self.layer_shifts))


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


def _check_targets(model, params, consts, x, y, groups) -> torch.Tensor:
    """Forward the new inputs once; integer targets must index an output column."""
    with torch.no_grad():
        label, idx = groups[0]
        out = stateless_forward(model, {**params, **consts}, x if idx is None else x[idx], label)
    if not y.dtype.is_floating_point and out.dim() >= 2:
        n_classes = out.shape[1]
        bad = (y < 0) | (y >= n_classes)
        if bool(bad.any()):
            raise ValueError(f"new_targets must be class indices in [0, {n_classes}) for a model with "
                             f"{n_classes} outputs; got values {torch.unique(y[bad]).tolist()[:5]}")
    return out


def update_direction(model: nn.Module, loss_fn, new_inputs: torch.Tensor, new_targets: torch.Tensor, *,
                     optimizer: str = "sgd", eps: float = 1e-8, task_labels=None, chunk_size: int | None = 64
                     ) -> tuple[dict[str, torch.Tensor], float, float]:
    """The unit-lr update direction ``u`` of the first optimizer step on the new task.

    .. math:: u = -\\nabla L_\\text{new}(θ) \\;(\\text{SGD}), \\qquad
              u = -\\frac{g}{|g| + ε} \\;(\\text{first Adam step, fresh state})

    Returns ``(direction, loss, grad_norm)``; ``direction`` maps every trainable parameter name
    to a detached tensor. The model is not changed. The gradient is taken over chunks of
    ``chunk_size`` samples (memory knob; None: all at once); ``L_new`` is the per-sample mean loss,
    also for a sum-reduced ``loss_fn`` (module docstring).

    Example:
        >>> net = nn.Linear(2, 1)
        >>> u, loss, gn = update_direction(net, nn.MSELoss(), torch.ones(4, 2), torch.zeros(4, 1))
        >>> sorted(u), bool(torch.allclose(-u["bias"], 2 * net(torch.ones(1, 2)).detach().reshape(1)))
        (['bias', 'weight'], True)
    """
    check_estimator_inputs(model, new_inputs, new_targets, loss_fn=loss_fn, task_labels=task_labels, name="new_inputs", targets_name="new_targets")
    check_inputs(new_inputs, new_targets, name="new_inputs")
    loss_fn = mean_loss(loss_fn, "update_direction", model=model, inputs=new_inputs, targets=new_targets,
                        task_labels=task_labels)
    return _first_step(model, loss_fn, new_inputs, new_targets, optimizer=optimizer, eps=eps,
                       task_labels=task_labels, chunk_size=chunk_size)[:3]


def _first_step(model: nn.Module, loss_fn, new_inputs: torch.Tensor, new_targets: torch.Tensor, *,
                optimizer: str = "sgd", eps: float = 1e-8, task_labels=None, chunk_size: int | None = 64
                ) -> tuple[dict[str, torch.Tensor], float, float, float]:
    """:func:`update_direction` plus the descent rate ``−⟨∇L, u⟩`` (first-order loss decrease
    per unit step)."""
    check_inputs(new_inputs, new_targets, name="new_inputs")
    check_choice("optimizer", optimizer, ADS_OPTIMIZERS)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size)
    params, consts = split_params(model)
    groups = task_groups(model, new_inputs.shape[0], task_labels)
    with eval_mode(model):
        _check_targets(model, params, consts, new_inputs, new_targets, groups)
        grads, loss = grouped_loss_and_grad(model, loss_fn, consts, new_inputs, new_targets, groups,
                                            chunk_size)(params)
        grads = {k: g.to(params[k].dtype) for k, g in grads.items()}
        loss = float(loss)
    if not math.isfinite(loss):
        raise ValueError(f"the new-task loss is {loss} at the checkpoint; the model or data produce "
                         "non-finite values")
    grad_norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
    if optimizer == "sgd":
        direction = {n: -g.detach() for n, g in grads.items()}
    else:
        direction = {n: -(g / (g.abs() + eps)).detach() for n, g in grads.items()}
    # first-order loss decrease per unit step, −⟨g, u⟩: ‖g‖² (SGD), Σ g²/(|g| + ε) (Adam)
    rate = sum(float((-g.double() * direction[n].double()).sum()) for n, g in grads.items())
    return direction, loss, grad_norm, rate


def _probe(model, loss_fn, new_inputs, new_targets, groups, *, lr, optimizer, probe_steps, eps,
           betas=(0.9, 0.999), chunk_size=None) -> list[float]:
    """Update norms of ``probe_steps`` full-batch steps on the new-task sample (functional copy)."""
    params, consts = split_params(model)
    loss_and_grad = grouped_loss_and_grad(model, loss_fn, consts, new_inputs, new_targets, groups, chunk_size)
    theta = {n: p.clone() for n, p in params.items()}
    state = AdamState(theta, betas=betas, eps=eps) if optimizer == "adam" else None
    norms = []
    with eval_mode(model):
        for _ in range(probe_steps):
            grads = {k: g.to(theta[k].dtype) for k, g in loss_and_grad(theta)[0].items()}
            step = functional_step(theta, grads, lr, optimizer=optimizer, state=state,
                                   in_place=False)
            norms.append(math.sqrt(sum(float((s.double() ** 2).sum()) for s in step.values())))
            theta = {n: (theta[n] - step[n]).detach() for n in theta}
    return norms


def distance_path(to_go: float, speed: float, budget: float) -> float:
    """Path factor of the loss and logit paths: ``min(budget, max(to_go, 0) / speed)``, the step
    length at which a quantity falling at ``speed`` per unit step has covered ``to_go``
    (``budget`` when it does not fall).

    Example:
        >>> distance_path(6.0, 2.0, 10.0), distance_path(6.0, 0.1, 10.0), distance_path(-1.0, 2.0, 10.0)
        (3.0, 10.0, 0.0)
    """
    return min(budget, max(to_go, 0.0) / speed) if speed > 0 else budget


def _fit_decay(norms: Sequence[float]) -> float:
    """Per-step decay ``ρ = exp(slope)`` of a least-squares line through ``log‖step_t‖``, in ``(0, 1]``."""
    values = np.asarray(norms, dtype=np.float64)
    keep = np.isfinite(values) & (values > 0)
    if keep.sum() < 2:
        return 1.0
    t = np.arange(values.size)[keep]
    slope = np.polyfit(t, np.log(values[keep]), 1)[0]
    return float(min(1.0, math.exp(slope)))


def _path_sum(decay: float, steps: int) -> float:
    if decay >= 1.0:
        return float(steps)
    return float((1.0 - decay ** steps) / (1.0 - decay))


# --------------------------------------------------------------------------------------------
# ADS
# --------------------------------------------------------------------------------------------


def architecture_driven_shift(model: nn.Module, loss_fn, old_inputs: torch.Tensor, new_inputs: torch.Tensor,
                              new_targets: torch.Tensor, *, lr: float, steps: int,
                              optimizer: str = "sgd", path: str = "budget", probe_steps: int = 10,
                              target_loss: float = 0.0, eps: float = 1e-8, old_task_labels=None,
                              new_task_labels=None, chunk_size: int | None = 64) -> ADSResult:
    """Predicted logit shift on old-task inputs when ``model`` trains ``steps`` steps on the new task.

    .. math::

        \\mathrm{ADS} = P \\sum_ℓ n_{ℓ-1}\\, \\hat d_ℓ, \\qquad
        \\hat d_ℓ = \\frac{1}{n_{ℓ-1}} \\frac1N \\sum_a \\lVert J_ℓ(x_a)\\, u_ℓ \\rVert_2, \\qquad
        P = η T \\ (\\text{budget}), \\quad η \\sum_{t<T} ρ^t \\ (\\text{probe}), \\quad
        \\min\\Big(η T, \\frac{L_\\text{new} - L^*}{-\\langle ∇L_\\text{new}, u\\rangle}\\Big) \\ (\\text{loss}), \\quad
        \\min\\Big(η T, \\frac{L_\\text{new} - L^*}{\\frac1m \\sum_b \\lVert J(x_b) u \\rVert}\\Big) \\ (\\text{logit})

    (derivation and assumptions in the module docstring). Cost: one gradient on the new sample,
    one JVP per layer over the old inputs (about 3 forward passes each); the logit path adds one
    JVP over the new sample, the probe ``probe_steps`` gradients.

    Args:
        model: the checkpoint, trained on the earlier tasks (not changed).
        old_inputs: earlier tasks' calibration inputs ``x_a``.
        new_inputs, new_targets: labelled sample of the new task.
        loss_fn: the loss ``loss_fn(outputs, targets)``, mean- or sum-reduced (``L_new`` is the
            per-sample mean either way; a plain callable is probed on two samples,
            ``reduction="none"`` refused).
        lr: step size ``η``. steps: training steps ``T`` on the new task.
        optimizer: ``"sgd"`` (direction ``−g``) or ``"adam"`` (first Adam step ``−g/(|g|+ε)``).
        path: ``"budget"`` (``P = ηT``), ``"probe"`` (fit of the update-norm decay over
            ``probe_steps`` full-batch steps on the new sample), ``"loss"`` (the step length at
            which the first-order new-task loss reaches ``target_loss``, capped by ``ηT``: the
            run stops moving once the new task is fitted; no extra cost) or ``"logit"`` (the step
            length at which the new-task logits have moved, to first order, by the loss to go
            ``L_new − target_loss``, capped by ``ηT``; one JVP more).
        target_loss: ``L*`` of the ``"loss"`` and ``"logit"`` paths (default 0: cross-entropy fitted).
        old_task_labels, new_task_labels: task labels for Avalanche multi-task models.
        chunk_size: memory knob (the result does not depend on it): the new-task gradients are
            taken over chunks of ``chunk_size`` samples and every JVP call pushes at most
            ``chunk_size`` (input, layer) tangents (:func:`~avalanche_plugins.ads.layer_terms.layer_logit_changes`);
            None: all at once.

    Raises:
        ValueError: empty inputs, mismatched targets, integer targets outside the model's output
            range, no parametrised layer / no trainable parameter, bad arguments, non-finite loss.

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
        >>> old, new, y = torch.randn(20, 5), torch.randn(30, 5), torch.randint(0, 3, (30,))
        >>> res = architecture_driven_shift(net, nn.CrossEntropyLoss(), old, new, y, lr=0.01, steps=100)
        >>> res.layer_names, res.architecture_terms, res.path_factor
        (['0', '2'], [5, 16], 1.0)
        >>> abs(res.ads - sum(n * d for n, d in zip(res.architecture_terms, res.data_terms))) < 1e-9
        True
    """
    check_estimator_inputs(model, old_inputs, name="old_inputs")
    check_estimator_inputs(model, new_inputs, new_targets, loss_fn=loss_fn, task_labels=new_task_labels, name="new_inputs", targets_name="new_targets")
    start = time.perf_counter()
    check_inputs(old_inputs, name="old_inputs")
    check_inputs(new_inputs, new_targets, name="new_inputs")
    check_positive("lr", lr)
    check_int("steps", steps)
    check_choice("optimizer", optimizer, ADS_OPTIMIZERS)
    check_choice("path", path, ADS_PATHS)
    check_int("probe_steps", probe_steps, minimum=2)
    check_positive("target_loss", target_loss, allow_zero=True)
    check_positive("eps", eps)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size)
    loss_fn = mean_loss(loss_fn, "architecture_driven_shift", model=model, inputs=new_inputs, targets=new_targets,
                        task_labels=new_task_labels)
    layer_map = discover_layers(model, example_input(model, new_inputs, new_task_labels))
    groups = layer_groups(model, layer_map)
    direction, loss, grad_norm, rate = _first_step(model, loss_fn, new_inputs, new_targets, optimizer=optimizer,
                                                   eps=eps, task_labels=new_task_labels, chunk_size=chunk_size)
    changes = layer_logit_changes(model, old_inputs, direction, groups, task_labels=old_task_labels,
                                  chunk_size=chunk_size)
    data_terms = [mean_row_norm(changes[g.name]) / g.fan_in for g in groups]
    first_order = mean_row_norm(sum(changes.values()))
    decay, norms, new_shift = None, [], None
    if path == "budget":
        path_factor = lr * steps
    elif path == "loss":
        path_factor = distance_path(loss - target_loss, rate, lr * steps)
    elif path == "logit":
        everything = LayerGroup("all", 1, tuple(direction))
        new_shift = mean_row_norm(layer_logit_changes(model, new_inputs, direction, [everything],
                                                      task_labels=new_task_labels, chunk_size=chunk_size)["all"])
        path_factor = distance_path(loss - target_loss, new_shift, lr * steps)
    else:
        tasks = task_groups(model, new_inputs.shape[0], new_task_labels)
        norms = _probe(model, loss_fn, new_inputs, new_targets, tasks, lr=lr, optimizer=optimizer,
                       probe_steps=probe_steps, eps=eps, chunk_size=chunk_size)
        decay = _fit_decay(norms)
        path_factor = lr * _path_sum(decay, steps)
    unit = sum(g.fan_in * d for g, d in zip(groups, data_terms))
    return ADSResult(ads=float(path_factor * unit), layer_names=[g.name for g in groups],
                     architecture_terms=[g.fan_in for g in groups], data_terms=data_terms,
                     path_factor=float(path_factor), first_order_shift=first_order, new_loss=loss,
                     grad_norm=grad_norm, optimizer=optimizer, path=path, lr=float(lr), steps=int(steps),
                     decay=decay, probe_norms=norms, new_first_order_shift=new_shift, descent_rate=rate,
                     seconds=time.perf_counter() - start)


def topology_only_shift(model: nn.Module, example_input, reference: ADSResult) -> float:
    """ADS of ``model`` from its topology alone, reusing a reference member's data terms.

    .. math:: \\mathrm{ADS}_\\text{topo}(\\text{model}) = P_\\text{ref} \\sum_ℓ n_{ℓ-1}^\\text{model}\\,
              \\hat d_ℓ^\\text{ref}

    For ranking many widths of one design without data per candidate: compute
    :func:`architecture_driven_shift` once on one member (``reference``), then score every other
    member by its fan-ins. Valid when ``d̂_ℓ`` is (near) width-free: same depth, layer kinds,
    activation, normalisation, initialisation and parametrisation (standard, fan-in init), the
    same optimizer/lr/steps, widths not tiny, and the same training recipe on the old task (so the
    checkpoints sit in comparable regimes). It is not valid across depths or designs, under μP-like
    parametrisations (which rescale ``n_{ℓ−1}`` away), or far in the feature-learning regime.

    Raises:
        ValueError: the model's layer groups do not correspond one-to-one to the reference's.

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> small = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 3))
        >>> ref = architecture_driven_shift(small, nn.CrossEntropyLoss(), torch.randn(8, 5), torch.randn(8, 5),
        ...                                 torch.randint(0, 3, (8,)), lr=0.1, steps=1)
        >>> wide = nn.Sequential(nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 3))
        >>> topo = topology_only_shift(wide, torch.randn(2, 5), ref)
        >>> round(topo, 6) == round(ref.path_factor * (5 * ref.data_terms[0] + 64 * ref.data_terms[1]), 6)
        True
    """
    if not isinstance(reference, ADSResult):
        raise TypeError(f"reference must be an ADSResult, got {type(reference).__name__}")
    groups = layer_groups(model, discover_layers(model, example_input))
    if len(groups) != len(reference.layer_names) or \
            any((g.name == UNASSIGNED) != (r == UNASSIGNED) for g, r in zip(groups, reference.layer_names)):
        raise ValueError(f"model has layer groups {[g.name for g in groups]} but the reference has "
                         f"{reference.layer_names}; the topology-only variant needs the same design "
                         "(same depth and layer kinds), only widths may differ")
    return float(reference.path_factor * sum(g.fan_in * d for g, d in zip(groups, reference.data_terms)))


