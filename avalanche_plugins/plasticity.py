"""Optimization Readiness (OR): a label-aware predictor of plasticity, its ground truth, and baselines.

"Predicting Plasticity in Deep Continual Learning" (seed 004) asks how much a checkpoint θ can
still learn a target task T. Its answer uses the target's mean loss ``L(θ)``, the full-data
gradient ``g = ∇L(θ)`` and the minibatch gradient ``ĝ_B`` (mean over a minibatch of ``B`` samples):

.. math::

    S = \\frac{\\lVert g \\rVert^2}{L}, \\qquad
    R = \\frac{\\lVert g \\rVert^2}{\\mathbb{E}_B \\lVert \\hat g_B \\rVert^2}, \\qquad
    \\mathrm{OR} = S \\cdot R = \\frac{\\lVert g \\rVert^4}{L \\, \\mathbb{E}_B \\lVert \\hat g_B \\rVert^2}

and proves, for a β-smooth loss and a step ``η < R/β`` (``α = ηβ/R``), that the expected relative
loss decrease of one SGD step ``G^(1) = (L(θ) − E L(θ_1)) / L(θ)`` is at least ``α(1−α)/β · OR``.

This module holds the parts that need only PyTorch:

* :func:`optimization_readiness` — ``S``, ``R`` and ``OR`` with two estimators of the second moment;
* :func:`k_step_gain` — the ground truth ``G^(k)`` from many vectorised k-step SGD/Adam runs;
* label-agnostic baselines: :func:`effective_rank`, :func:`energy_rank`,
  :func:`representation_ranks`, :func:`active_unit_fraction`, :func:`entk_energy_rank`,
  :func:`hessian_energy_rank` (hidden features from :func:`hidden_features`);
* ranking agreement: :func:`pairwise_ranking_accuracy`, :func:`spearman`, :func:`kendall_tau`.

Conventions shared by every function here:

* The model is evaluated in eval mode (dropout off, BatchNorm on its running statistics) and its
  mode is restored; parameters are read with ``torch.func.functional_call``, so nothing is written
  to ``.grad``, the parameters are never changed and torch's global RNG is never used (random
  draws use a ``torch.Generator`` seeded with ``seed``).
* "Parameters" are the model's trainable ones (``requires_grad=True``); frozen parameters and
  buffers are held fixed.
* ``loss_fn(outputs, targets)`` must be mean-reduced over the samples of a batch, so that the loss
  of a batch is the mean of its per-sample losses (true for ``nn.MSELoss()`` and
  ``nn.CrossEntropyLoss()`` with default arguments). Per-sample quantities call it on a batch of
  one (``x.unsqueeze(0)``), as :func:`avalanche_plugins.fisher.empirical_fisher` does.
* Avalanche multi-task models (``MultiTaskModule``) receive ``task_labels``; samples are grouped by
  task so that every forward pass uses a single ``int`` label (Avalanche's fast path, which is also
  the only one ``torch.func`` transforms can trace). Without labels every sample gets task 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.func import grad, grad_and_value, jacrev, vmap

from avalanche_plugins._checks import (
    check_choice,
    check_finite_loss,
    check_inputs,
    check_int,
    check_positive,
)
from avalanche_plugins.functional import (
    eval_mode,
    is_multitask,
    iterate_batches,
    model_forward,
    stateless_forward,
)
from avalanche_plugins.layers import discover_layers

__all__ = [
    "ESTIMATORS",
    "OPTIMIZERS",
    "ReadinessResult",
    "GainResult",
    "optimization_readiness",
    "k_step_gain",
    "effective_rank",
    "energy_rank",
    "hidden_features",
    "representation_ranks",
    "active_unit_fraction",
    "entk_energy_rank",
    "hessian_energy_rank",
    "pairwise_ranking_accuracy",
    "spearman",
    "kendall_tau",
]

ESTIMATORS = ("sampled", "per_sample")
OPTIMIZERS = ("sgd", "adam")


# --------------------------------------------------------------------------------------------
# Shared plumbing
# --------------------------------------------------------------------------------------------


def _split_params(model: nn.Module):
    """``(trainable, constants)``: detached trainable parameters, and frozen parameters + buffers."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    if not params:
        raise ValueError("model has no trainable parameter (requires_grad=True)")
    consts = {k: v.detach() for k, v in model.named_parameters() if not v.requires_grad}
    consts.update({k: v.detach() for k, v in model.named_buffers()})
    return params, consts


def _check_task_labels(task_labels, n: int) -> None:
    if task_labels is None:
        return
    if not isinstance(task_labels, torch.Tensor):
        raise TypeError(f"task_labels must be a tensor, got {type(task_labels).__name__}")
    if task_labels.reshape(-1).shape[0] != n:
        raise ValueError(f"task_labels has {task_labels.reshape(-1).shape[0]} entries but inputs has {n}")


def _task_groups(model: nn.Module, n: int, task_labels):
    """``[(label, index)]``: samples grouped by task; ``index`` is None for "all samples".

    Plain models (and multi-task models without labels) form one group with label ``None``, which
    :func:`avalanche_plugins.functional.stateless_forward` turns into task 0 for multi-task models.
    """
    if task_labels is None or not is_multitask(model):
        return [(None, None)]
    labels = task_labels.reshape(-1)
    unique = torch.unique(labels)
    if unique.numel() == 1:
        return [(int(unique[0]), None)]
    return [(int(u), (labels == u).nonzero().squeeze(1)) for u in unique]


def _take(tensor, index):
    return tensor if index is None else tensor[index]


def _batch_loss(model, loss_fn, consts, label):
    """``f(params, x, y)``: the loss of a batch."""

    def f(p, x, y):
        return loss_fn(stateless_forward(model, {**consts, **p}, x, label), y)

    return f


def _sample_loss(model, loss_fn, consts, label):
    """``f(params, x, y)``: the loss of one sample (a batch of one), for ``vmap``."""

    def f(p, x, y):
        return loss_fn(stateless_forward(model, {**consts, **p}, x.unsqueeze(0), label), y.unsqueeze(0))

    return f


def _sq_norms(grads: dict) -> torch.Tensor:
    """Row-wise squared norms (float64) of a dict of batched gradients ``{name: (m, *shape)}``."""
    total = 0
    for g in grads.values():
        flat = g.reshape(g.shape[0], -1)
        total = total + torch.einsum("ij,ij->i", flat, flat).double()  # no (m, P) temporary
    return total


def _flat(grads: dict) -> torch.Tensor:
    """``(m, P)`` float64 matrix from a dict of batched tensors ``{name: (m, *shape)}``."""
    return torch.cat([g.double().reshape(g.shape[0], -1) for g in grads.values()], dim=1)


def _draw_batches(n: int, batch_size: int, n_batches: int, generator: torch.Generator) -> torch.Tensor:
    """``(n_batches, batch_size)`` indices: each row a uniform random subset of ``range(n)``
    (without replacement within a row, rows independent). Uses only ``generator``."""
    if batch_size == 1:
        return torch.randint(n, (n_batches, 1), generator=generator)
    rows_per_block = max(1, (1 << 20) // n)
    blocks = []
    for s in iterate_batches(n_batches, rows_per_block):
        keys = torch.rand(s.stop - s.start, n, generator=generator)
        blocks.append(keys.topk(batch_size, dim=1).indices)
    return torch.cat(blocks, dim=0)


# --------------------------------------------------------------------------------------------
# Optimization Readiness
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadinessResult:
    """Output of :func:`optimization_readiness` (all floats are Python floats).

    Attributes:
        loss: ``L(θ)``, the mean loss over the given samples.
        grad_norm_sq: ``‖g‖²`` of the full-data mean gradient.
        second_moment: ``E_B ‖ĝ_B‖²`` (estimated or exact, see ``estimator``).
        strength: ``S = ‖g‖² / L``.
        reliability: ``R = ‖g‖² / E_B ‖ĝ_B‖²`` (0 when ``‖g‖² = 0``).
        readiness: ``OR = S · R``.
        estimator: ``"sampled"`` or ``"per_sample"``.
        batch_size: ``B``.
        n_samples: ``N``, the number of samples used.
    """

    loss: float
    grad_norm_sq: float
    second_moment: float
    strength: float
    reliability: float
    readiness: float
    estimator: str
    batch_size: int
    n_samples: int


def _full_gradient(model, loss_fn, params, consts, inputs, targets, groups, chunk_size):
    """Mean loss and ``‖g‖²`` over all samples, as sample-count-weighted chunk losses/gradients."""
    n = inputs.shape[0]
    loss_sum = torch.zeros((), dtype=torch.float64)
    g_sum = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in params.items()}
    for label, index in groups:
        x, y = _take(inputs, index), _take(targets, index)
        value_and_grad = grad_and_value(_batch_loss(model, loss_fn, consts, label))
        for s in iterate_batches(x.shape[0], chunk_size):
            grads, value = value_and_grad(params, x[s], y[s])
            check_finite_loss(value.detach(), "while computing optimization readiness")
            weight = s.stop - s.start
            loss_sum += value.detach().double().cpu() * weight
            for k, g in grads.items():
                g_sum[k] += g.double() * weight
    grad_norm_sq = sum(float((g / n).pow(2).sum()) for g in g_sum.values())
    check_finite_loss(torch.tensor(grad_norm_sq), "(gradient) while computing optimization readiness")
    return float(loss_sum) / n, grad_norm_sq


def _per_sample_chunks(model, loss_fn, params, consts, x, y, label, chunk_size):
    """Yield ``(per-sample gradients {name: (m, *shape)}, per-sample losses (m,))`` chunk by chunk."""
    per_sample = vmap(grad_and_value(_sample_loss(model, loss_fn, consts, label)), in_dims=(None, 0, 0))
    for s in iterate_batches(x.shape[0], chunk_size):
        grads, values = per_sample(params, x[s], y[s])
        check_finite_loss(values.sum().detach(), "while computing per-sample gradients")
        yield grads, values


def _minibatch_second_moment(model, loss_fn, params, consts, inputs, targets, task_labels, groups,
                             batches, chunk_size):
    """Mean over ``batches`` (rows of indices) of ``‖ĝ_B‖²``, the minibatch-mean gradient's norm."""
    n_batches, batch_size = batches.shape
    per_chunk = max(1, chunk_size // batch_size)
    total = torch.zeros((), dtype=torch.float64)
    if len(groups) == 1:
        label = groups[0][0]
        batch_grads = vmap(grad(_batch_loss(model, loss_fn, consts, label)), in_dims=(None, 0, 0))
        for s in iterate_batches(n_batches, per_chunk):
            index = batches[s].to(inputs.device)
            sq = _sq_norms(batch_grads(params, inputs[index], targets[index]))
            check_finite_loss(sq.sum(), "(gradient) while computing optimization readiness")
            total += sq.sum().cpu()
        return float(total) / n_batches
    # Minibatches that mix tasks: a minibatch-mean gradient is the mean of its per-sample gradients
    # (mean-reduced loss), and per-sample gradients can be grouped by task.
    labels = task_labels.reshape(-1)
    for s in iterate_batches(n_batches, per_chunk):
        unique, inverse = torch.unique(batches[s], return_inverse=True)
        unique = unique.to(inputs.device)
        rows = torch.empty(unique.numel(), sum(p.numel() for p in params.values()),
                           dtype=torch.float64, device=inputs.device)
        for task in torch.unique(labels[unique]):
            pos = (labels[unique] == task).nonzero().squeeze(1)
            which = unique[pos]
            chunks = _per_sample_chunks(model, loss_fn, params, consts, inputs[which], targets[which],
                                        int(task), chunk_size)
            rows[pos] = torch.cat([_flat(g) for g, _ in chunks], dim=0)
        sq = rows[inverse.to(rows.device)].mean(dim=1).pow(2).sum(1)
        check_finite_loss(sq.sum(), "(gradient) while computing optimization readiness")
        total += sq.sum().cpu()
    return float(total) / n_batches


def optimization_readiness(model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor, *,
                           batch_size: int = 4, n_batches: int = 128, estimator: str = "sampled",
                           seed: int = 0, task_labels: torch.Tensor | None = None,
                           chunk_size: int = 1024) -> ReadinessResult:
    """Strength ``S``, reliability ``R`` and Optimization Readiness ``OR = S·R`` of ``model`` on a task.

    With ``N`` samples, mean loss ``L``, full-data mean gradient ``g`` and the minibatch-mean
    gradient ``ĝ_B`` of a minibatch of ``B`` samples drawn without replacement:

    .. math::

        S = \\frac{\\lVert g\\rVert^2}{L},\\quad
        R = \\frac{\\lVert g\\rVert^2}{\\mathbb{E}_B\\lVert \\hat g_B\\rVert^2},\\quad
        \\mathrm{OR} = S R,\\qquad
        \\mathbb{E}_B\\lVert \\hat g_B\\rVert^2 = \\lVert g\\rVert^2
            + \\frac{\\operatorname{tr}\\Sigma}{B}\\cdot\\frac{N-B}{N-1},\\quad
        \\operatorname{tr}\\Sigma = \\frac{1}{N}\\sum_{i=1}^N \\lVert g_i - g\\rVert^2

    Estimators of the second moment ``E_B‖ĝ_B‖²``:

    * ``"sampled"`` (the paper's): the mean of ``‖ĝ_B‖²`` over ``n_batches`` independent
      minibatches, each ``batch_size`` distinct samples drawn uniformly; all minibatch gradients are
      computed at once with ``vmap`` over ``grad`` of the batch loss. ``L`` and ``g`` come from the
      batch loss over chunks of ``chunk_size`` samples (sample-count weighted), so large sets fit in
      memory. Being an estimate, ``R`` can slightly exceed 1.
    * ``"per_sample"``: exact, from per-sample gradients ``g_i`` (``vmap(grad)`` in chunks) and the
      identity above (the factor ``(N−B)/(N−1)`` is the finite-population correction for sampling
      without replacement; it is 0 when ``B = N``). ``L`` and ``g`` are the means of per-sample
      losses and gradients, equal to the batch ones for mean-reduced losses.

    Rules: a zero gradient gives ``S = R = OR = 0`` (also when the second moment is 0, i.e. no
    direction and no noise: nothing to follow). A loss of exactly 0 (or below) makes ``S`` and
    ``OR`` undefined and raises ``ValueError``; so do non-finite losses or gradients.

    Args:
        model: the checkpoint (plain module or Avalanche ``MultiTaskModule``).
        loss_fn: mean-reduced loss, applied as ``loss_fn(outputs, targets)``.
        inputs, targets: the target task's samples (first dimension ``N``).
        batch_size: ``B``, between 1 and ``N``.
        n_batches: number of sampled minibatches (``"sampled"`` only).
        estimator: ``"sampled"`` or ``"per_sample"``.
        seed: seed of the ``torch.Generator`` drawing the minibatches.
        task_labels: per-sample task labels for multi-task models (ignored by plain models).
        chunk_size: samples per vectorised pass (memory knob; results do not depend on it).

    Returns:
        A :class:`ReadinessResult`.

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> net = nn.Linear(3, 1)
        >>> x, y = torch.randn(20, 3), torch.randn(20, 1)
        >>> res = optimization_readiness(net, nn.MSELoss(), x, y, estimator="per_sample")
        >>> 0 < res.reliability <= 1, abs(res.readiness - res.strength * res.reliability) < 1e-12
        (True, True)
    """
    check_inputs(inputs, targets)
    check_choice("estimator", estimator, ESTIMATORS)
    n = inputs.shape[0]
    check_int("batch_size", batch_size)
    if batch_size > n:
        raise ValueError(f"batch_size={batch_size} is larger than the number of samples ({n})")
    check_int("n_batches", n_batches)
    check_int("seed", seed, minimum=0)
    check_int("chunk_size", chunk_size)
    _check_task_labels(task_labels, n)
    params, consts = _split_params(model)
    groups = _task_groups(model, n, task_labels)

    with eval_mode(model):
        if estimator == "per_sample":
            loss_sum = torch.zeros((), dtype=torch.float64)
            sq_sum = torch.zeros((), dtype=torch.float64)
            g_sum = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in params.items()}
            for label, index in groups:
                for grads, values in _per_sample_chunks(model, loss_fn, params, consts, _take(inputs, index),
                                                        _take(targets, index), label, chunk_size):
                    sq = _sq_norms(grads)
                    check_finite_loss(sq.sum(), "(gradient) while computing per-sample gradients")
                    loss_sum += values.detach().double().sum().cpu()
                    sq_sum += sq.sum().cpu()
                    for k, g in grads.items():
                        g_sum[k] += g.sum(0).double()
            loss = float(loss_sum) / n
            grad_norm_sq = sum(float((g / n).pow(2).sum()) for g in g_sum.values())
            trace = max(float(sq_sum) / n - grad_norm_sq, 0.0)
            correction = (n - batch_size) / (n - 1) if n > 1 else 0.0
            second_moment = grad_norm_sq + trace / batch_size * correction
        else:
            loss, grad_norm_sq = _full_gradient(model, loss_fn, params, consts, inputs, targets, groups,
                                                chunk_size)
            generator = torch.Generator().manual_seed(seed)
            batches = _draw_batches(n, batch_size, n_batches, generator)
            second_moment = _minibatch_second_moment(model, loss_fn, params, consts, inputs, targets,
                                                     task_labels, groups, batches, chunk_size)

    if not loss > 0:
        raise ValueError(
            f"loss is {loss:g}: Optimization Readiness OR = ‖g‖²/L · R is undefined at a zero loss "
            "(the target task is already solved); it needs a loss > 0"
        )
    if grad_norm_sq > 0:
        reliability = grad_norm_sq / second_moment
    else:
        reliability = 0.0  # documented rule: no gradient, nothing to rely on
    strength = grad_norm_sq / loss
    return ReadinessResult(
        loss=loss,
        grad_norm_sq=grad_norm_sq,
        second_moment=second_moment,
        strength=strength,
        reliability=reliability,
        readiness=strength * reliability,
        estimator=estimator,
        batch_size=batch_size,
        n_samples=n,
    )


# --------------------------------------------------------------------------------------------
# Ground truth: k-step gain
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GainResult:
    """Output of :func:`k_step_gain`.

    Attributes:
        gain: ``G^(k)``, the mean over runs of ``(L(θ) − L(θ_k)) / L(θ)``.
        stderr: standard error of ``gain`` (std over runs / √n_runs; NaN when ``n_runs = 1``).
        loss_before: ``L(θ)`` on the validation set.
        loss_after_mean: mean over runs of ``L(θ_k)``.
        k: number of optimizer steps per run.
        n_runs: number of independent runs.
        losses_after: ``(n_runs,)`` float64 tensor of ``L(θ_k)`` per run.
        indices: ``(n_runs, k, batch_size)`` training-sample indices used by every step of every run.
    """

    gain: float
    stderr: float
    loss_before: float
    loss_after_mean: float
    k: int
    n_runs: int
    losses_after: torch.Tensor = field(default=None, repr=False, compare=False)
    indices: torch.Tensor = field(default=None, repr=False, compare=False)


def k_step_gain(model: nn.Module, loss_fn, train_inputs: torch.Tensor, train_targets: torch.Tensor,
                val_inputs: torch.Tensor, val_targets: torch.Tensor, *, k: int, lr: float,
                optimizer: str = "sgd", batch_size: int, n_runs: int = 128, seed: int = 0,
                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                indices: torch.Tensor | None = None, task_label: int | None = None,
                chunk_size: int = 1024, adam_state: dict | None = None) -> GainResult:
    """Ground-truth plasticity: the expected relative validation-loss decrease after ``k`` steps.

    .. math::

        G^{(k)} = \\frac{L(θ) - \\mathbb{E}\\, L(θ_k)}{L(θ)}, \\qquad
        \\mathrm{s.e.} = \\frac{\\operatorname{std}_r G_r}{\\sqrt{n_\\text{runs}}}

    ``L`` is the mean loss on ``(val_inputs, val_targets)``; ``θ_k`` results from ``k`` steps of
    minibatch SGD (``θ ← θ − η ĝ``) or Adam (fresh state, bias-corrected, like ``torch.optim.Adam``
    with ``betas``/``eps`` and no weight decay) on minibatches of ``batch_size`` distinct training
    samples drawn uniformly (seeded ``torch.Generator``; a fresh draw for every step and run). The
    ``n_runs`` runs are vectorised: the parameters are stacked ``n_runs`` times and one ``vmap``-ed
    ``grad`` of the ``functional_call`` loss updates all of them per step; the model is not changed.
    The train and validation tensors are explicit (not a sampler), so runs are reproducible and
    ``indices`` (shape ``(n_runs, k, batch_size)``) can replay the exact minibatches of a reference.
    Training steps use eval mode too (no dropout, BatchNorm on running statistics), so the steps
    are deterministic given the indices. A diverging run (too large ``lr``) gives a non-finite
    ``L(θ_k)`` and hence a non-finite gain; no error is raised for it.

    Args:
        model, loss_fn: as in :func:`optimization_readiness`.
        train_inputs, train_targets: the samples the optimizer steps on.
        val_inputs, val_targets: the samples ``L`` is measured on (may be the same tensors).
        k: steps per run. lr: step size ``η``. optimizer: ``"sgd"`` or ``"adam"``.
        batch_size: minibatch size (1 to the number of training samples).
        n_runs: independent runs. seed: seed of the index generator.
        indices: optional precomputed minibatch indices (overrides ``seed``).
        task_label: the task label of every sample, for multi-task models (default 0).
        chunk_size: validation samples per vectorised evaluation.
        adam_state: Adam *continuing* from a checkpoint: a ``torch.optim.Adam`` ``state_dict``
            (entries in the order of the trainable ``model.parameters()``); every run starts from
            its moments and step ``t₀``, so step ``t`` uses bias corrections ``1 − β^(t₀+t)``.
            ``betas``/``eps`` are then read from its first parameter group.

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> net = nn.Linear(3, 1)
        >>> x, y = torch.randn(32, 3), torch.randn(32, 1)
        >>> res = k_step_gain(net, nn.MSELoss(), x, y, x, y, k=5, lr=0.05, batch_size=4, n_runs=16)
        >>> res.gain > 0, res.indices.shape
        (True, torch.Size([16, 5, 4]))
    """
    check_inputs(train_inputs, train_targets, name="train_inputs")
    check_inputs(val_inputs, val_targets, name="val_inputs")
    check_int("k", k)
    check_positive("lr", lr)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_int("batch_size", batch_size)
    n_train = train_inputs.shape[0]
    if batch_size > n_train:
        raise ValueError(f"batch_size={batch_size} is larger than the number of training samples ({n_train})")
    check_int("n_runs", n_runs)
    check_int("seed", seed, minimum=0)
    check_int("chunk_size", chunk_size)
    if task_label is not None:
        check_int("task_label", task_label, minimum=0)
    if adam_state is not None and optimizer != "adam":
        raise ValueError("adam_state is only used with optimizer='adam'")
    if indices is None:
        generator = torch.Generator().manual_seed(seed)
        indices = _draw_batches(n_train, batch_size, n_runs * k, generator).reshape(n_runs, k, batch_size)
    else:
        if not isinstance(indices, torch.Tensor) or tuple(indices.shape) != (n_runs, k, batch_size):
            raise ValueError(f"indices must be a tensor of shape (n_runs, k, batch_size) = "
                             f"{(n_runs, k, batch_size)}, got {getattr(indices, 'shape', indices)}")
        if indices.dtype not in (torch.int32, torch.int64) or bool((indices < 0).any()) \
                or bool((indices >= n_train).any()):
            raise ValueError(f"indices must be integer indices in [0, {n_train})")
        indices = indices.long()
    params, consts = _split_params(model)
    batch_loss = _batch_loss(model, loss_fn, consts, task_label)
    n_val = val_inputs.shape[0]

    def val_losses(p, batched: bool) -> torch.Tensor:
        loss_of = vmap(batch_loss, in_dims=(0, None, None)) if batched else batch_loss
        total = 0.0
        for s in iterate_batches(n_val, chunk_size):
            total = total + loss_of(p, val_inputs[s], val_targets[s]).double() * (s.stop - s.start)
        return total / n_val

    with eval_mode(model), torch.no_grad():
        loss_before = float(val_losses(params, batched=False))
        check_finite_loss(torch.tensor(loss_before), "on the validation set before training")
        if not loss_before > 0:
            raise ValueError(f"loss is {loss_before:g} on the validation set: the relative gain "
                             "(L(θ) − L(θ_k)) / L(θ) is undefined at a zero loss")
        stacked = {name: p.unsqueeze(0).repeat(n_runs, *[1] * p.dim()) for name, p in params.items()}
        step0 = 0
        if optimizer == "adam":
            first = {name: torch.zeros_like(p) for name, p in stacked.items()}
            second = {name: torch.zeros_like(p) for name, p in stacked.items()}
            if adam_state is not None:
                step0, betas, eps = _load_adam_state(adam_state, list(params), first, second)
        step_grads = vmap(grad(batch_loss), in_dims=(0, 0, 0))
        device_indices = indices.to(train_inputs.device)
        for t in range(k):
            index = device_indices[:, t]
            grads = step_grads(stacked, train_inputs[index], train_targets[index])
            if optimizer == "sgd":
                for name, g in grads.items():
                    stacked[name].sub_(lr * g)
            else:
                beta1, beta2 = betas
                correction1 = 1 - beta1 ** (step0 + t + 1)
                correction2 = 1 - beta2 ** (step0 + t + 1)
                for name, g in grads.items():
                    first[name].mul_(beta1).add_(g, alpha=1 - beta1)
                    second[name].mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    denom = (second[name] / correction2).sqrt().add_(eps)
                    stacked[name].sub_(lr * (first[name] / correction1) / denom)
        losses_after = val_losses(stacked, batched=True).cpu()

    relative = (loss_before - losses_after) / loss_before
    stderr = float(relative.std() / math.sqrt(n_runs)) if n_runs > 1 else float("nan")
    return GainResult(
        gain=float(relative.mean()),
        stderr=stderr,
        loss_before=loss_before,
        loss_after_mean=float(losses_after.mean()),
        k=k,
        n_runs=n_runs,
        losses_after=losses_after,
        indices=indices,
    )


def _load_adam_state(adam_state: dict, names: list[str], first: dict, second: dict):
    """Copy a ``torch.optim.Adam`` state_dict's moments into the stacked run buffers (in place);
    return ``(step, betas, eps)``."""
    state, group = adam_state["state"], adam_state["param_groups"][0]
    if len(state) != len(names):
        raise ValueError(f"adam_state has {len(state)} entries for {len(names)} trainable parameters")
    entries = [state[i] for i in sorted(state)]
    for name, entry in zip(names, entries):
        first[name].copy_(entry["exp_avg"].expand_as(first[name]))
        second[name].copy_(entry["exp_avg_sq"].expand_as(second[name]))
    return int(float(entries[0]["step"])), tuple(group["betas"]), float(group["eps"])


# --------------------------------------------------------------------------------------------
# Label-agnostic baselines
# --------------------------------------------------------------------------------------------


def _check_energy(energy) -> None:
    if not isinstance(energy, (int, float)) or isinstance(energy, bool) or not 0 < energy <= 1:
        raise ValueError(f"energy must be a number in (0, 1], got {energy!r}")


def _energy_rank_from_squares(squares: torch.Tensor, energy: float) -> int:
    """min k with the k largest of ``squares`` (σ²) holding ``energy`` of their sum; 0 if all zero."""
    squares = squares.double().clamp(min=0).sort(descending=True).values
    total = float(squares.sum())
    if total == 0:
        return 0
    cumulative = squares.cumsum(0)
    return min(int((cumulative < energy * total * (1 - 1e-12)).sum()) + 1, squares.numel())


def _as_matrix(features, name: str = "features") -> torch.Tensor:
    features = torch.as_tensor(features)
    if features.dim() < 2 or features.shape[0] == 0:
        raise ValueError(f"{name} must have shape (n, d, ...) with n >= 1, got {tuple(features.shape)}")
    matrix = features.reshape(features.shape[0], -1).double()
    if not torch.isfinite(matrix).all():
        raise ValueError(f"{name} contains non-finite values")
    return matrix


def effective_rank(features: torch.Tensor) -> float:
    """Effective rank (Roy & Vetterli, 2007) of an ``(n, d)`` feature matrix.

    .. math:: \\operatorname{erank} = \\exp\\Big(-\\sum_{i:\\,σ_i>0} p_i \\log p_i\\Big),
              \\qquad p_i = \\frac{σ_i}{\\sum_j σ_j}

    over the singular values ``σ_i`` (zero ones are skipped in the entropy). Trailing dimensions
    are flattened (``(n, C, H, W) → (n, C·H·W)``). A zero matrix has effective rank 0.

    Example:
        >>> round(effective_rank(torch.diag(torch.tensor([2.0, 2.0, 2.0, 0.0]))), 10)
        3.0
    """
    sigma = torch.linalg.svdvals(_as_matrix(features))
    total = float(sigma.sum())
    if total == 0:
        return 0.0
    p = sigma[sigma > 0] / total
    return float(torch.exp(-(p * p.log()).sum()))


def energy_rank(features: torch.Tensor, energy: float = 0.99) -> int:
    """Energy rank: the number of singular values needed to hold ``energy`` of the squared spectrum.

    .. math:: \\min\\Big\\{k : \\sum_{i\\le k} σ_i^2 \\ge \\text{energy}\\cdot\\sum_i σ_i^2\\Big\\}

    (singular values in decreasing order; trailing dimensions flattened; 0 for a zero matrix).

    Example:
        >>> a, b = torch.randn(50, 3), torch.randn(3, 20)
        >>> energy_rank(a @ b, energy=0.999999)
        3
    """
    _check_energy(energy)
    return _energy_rank_from_squares(torch.linalg.svdvals(_as_matrix(features)).pow(2), energy)


def _skip_for_features(module: nn.Module) -> bool:
    """Parameter-free modules that only copy or reshape values in eval mode."""
    return isinstance(module, (nn.modules.dropout._DropoutNd, nn.Dropout, nn.Identity, nn.Flatten,
                               nn.Unflatten))


def _features_of_group(model, layer_modules, n_hidden, x, label, chunk_size):
    """Features ``[(n, ...)]`` of the first ``n_hidden`` of ``layer_modules`` (all layers, in
    execution order) for one task group."""
    leaves = [m for m in model.modules() if m is not model and next(m.children(), None) is None]
    watched = list(dict.fromkeys(leaves + list(layer_modules)))
    calls: list[tuple[nn.Module, object]] = []

    def record(module, _inputs, output):
        calls.append((module, output))

    handles = [m.register_forward_hook(record) for m in watched]
    try:
        with torch.no_grad():
            model_forward(model, x[:2], label)
    finally:
        for h in handles:
            h.remove()
    positions = {}
    order = [i for i, (m, _) in enumerate(calls) if any(m is lm for lm in layer_modules)]
    all_layers_pos = order + [len(calls)]
    for j, pos in enumerate(order[:n_hidden]):
        chosen = pos
        for q in range(pos + 1, all_layers_pos[j + 1]):
            module, out = calls[q]
            if (isinstance(out, torch.Tensor) and next(module.parameters(), None) is None
                    and next(module.children(), None) is None and not _skip_for_features(module)):
                chosen = q
                break
        positions[chosen] = j

    captured: list[list[torch.Tensor]] = [[] for _ in range(n_hidden)]
    counter = [0]

    def capture(module, _inputs, output):
        q = counter[0]
        counter[0] += 1
        if q in positions:
            captured[positions[q]].append(output.detach().clone())

    handles = [m.register_forward_hook(capture) for m in watched]
    try:
        with torch.no_grad():
            for s in iterate_batches(x.shape[0], chunk_size):
                counter[0] = 0
                model_forward(model, x[s], label)
    finally:
        for h in handles:
            h.remove()
    return [torch.cat(parts, dim=0) for parts in captured]


def _layers(model, inputs, task_labels):
    """All layers (:func:`discover_layers`), traced on two samples with their task labels; empty
    for a model that is a single leaf module (``nn.Linear``): it has no hidden layer."""
    if next(model.children(), None) is None:
        return []
    example = inputs[:2]
    if task_labels is not None and is_multitask(model):
        example = (example, task_labels.reshape(-1)[:2])
    return list(discover_layers(model, example))


def hidden_features(model: nn.Module, inputs: torch.Tensor, *, task_labels: torch.Tensor | None = None,
                    chunk_size: int = 1024) -> dict[str, torch.Tensor]:
    """Post-activation features of every hidden layer, ``{layer name: (n, ...)}``.

    Hidden layers are the layers of :func:`avalanche_plugins.layers.discover_layers` except the last
    (the output layer). Rule for the features of hidden layer ℓ: the output of the first
    parameter-free leaf module executed after layer ℓ and before the next layer (its activation,
    e.g. ``nn.ReLU``), skipping modules that only copy or reshape values in eval mode (``Dropout``,
    ``Identity``, ``Flatten``, ``Unflatten``); when there is none (an activation applied
    functionally, or none at all) the layer's own output. A module reused at several places (one
    ``nn.ReLU`` instance after every layer) is handled by call position. Rows follow the task
    groups for multi-task models with mixed labels (row order does not affect any rank).

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(), nn.Linear(8, 2))
        >>> feats = hidden_features(net, torch.randn(10, 4))
        >>> list(feats), feats["0"].shape, bool((feats["0"] >= 0).all())
        (['0'], torch.Size([10, 8]), True)
    """
    check_inputs(inputs)
    check_int("chunk_size", chunk_size)
    _check_task_labels(task_labels, inputs.shape[0])
    layers = _layers(model, inputs, task_labels)
    hidden = layers[:-1]
    if not hidden:
        return {}
    modules = [layer.module for layer in layers]
    parts: list[list[torch.Tensor]] = [[] for _ in hidden]
    with eval_mode(model):
        for label, index in _task_groups(model, inputs.shape[0], task_labels):
            x = _take(inputs, index)
            for j, f in enumerate(_features_of_group(model, modules, len(hidden), x, label, chunk_size)):
                parts[j].append(f)
    return {layer.name: torch.cat(p, dim=0) for layer, p in zip(hidden, parts)}


def representation_ranks(model: nn.Module, inputs: torch.Tensor, *, energy: float = 0.99,
                         task_labels: torch.Tensor | None = None,
                         chunk_size: int = 1024) -> dict[str, dict[str, float]]:
    """:func:`effective_rank` and :func:`energy_rank` of every hidden layer's features.

    Features as in :func:`hidden_features`; returns
    ``{layer name: {"effective_rank": float, "energy_rank": int}}`` (empty for a model without
    hidden layers).

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> ranks = representation_ranks(net, torch.randn(30, 4))
        >>> sorted(ranks["0"]), ranks["0"]["energy_rank"] <= 8
        (['effective_rank', 'energy_rank'], True)
    """
    _check_energy(energy)
    feats = hidden_features(model, inputs, task_labels=task_labels, chunk_size=chunk_size)
    return {name: {"effective_rank": effective_rank(f), "energy_rank": energy_rank(f, energy)}
            for name, f in feats.items()}


def active_unit_fraction(model: nn.Module, inputs: torch.Tensor, *, threshold: float = 0.0,
                         task_labels: torch.Tensor | None = None, chunk_size: int = 1024) -> float:
    """Fraction of hidden units that are active on at least one input.

    Rule: a unit of hidden layer ℓ is active if ``|h| > threshold`` (default: non-zero) for at
    least one input (and, for a conv layer, at least one spatial position), where ``h`` are the
    layer's features from :func:`hidden_features` (post-activation). Units are channels (dim 1) of
    conv layers and the last dimension otherwise. The fraction pools the units of all hidden layers:
    ``Σ_ℓ active_ℓ / Σ_ℓ units_ℓ``. A ReLU unit that is 0 on every input is dead.

    .. math:: \\frac{\\sum_\\ell \\#\\{u : \\max_i |h^{(\\ell)}_{u}(x_i)| > \\text{threshold}\\}}
                    {\\sum_\\ell \\#\\text{units}_\\ell}

    Raises:
        ValueError: the model has no hidden layer.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> with torch.no_grad():
        ...     net[0].weight.zero_(); net[0].bias.copy_(torch.tensor([1.0, -1.0, 0.0, 2.0]))
        ...     # doctest: +ELLIPSIS
        Parameter...
        >>> active_unit_fraction(net, torch.randn(5, 2))
        0.5
    """
    check_inputs(inputs)
    check_positive("threshold", threshold, allow_zero=True)
    _check_task_labels(task_labels, inputs.shape[0])
    hidden = _layers(model, inputs, task_labels)[:-1]
    feats = hidden_features(model, inputs, task_labels=task_labels, chunk_size=chunk_size)
    if not feats:
        raise ValueError("model has no hidden layer (only one layer): the active-unit fraction is undefined")
    active = total = 0
    for layer in hidden:
        h = feats[layer.name].abs()
        unit_dim = 1 if layer.kind == "conv" and h.dim() >= 3 else h.dim() - 1
        h = h.movedim(unit_dim, -1).reshape(-1, h.shape[unit_dim])
        active += int((h.amax(dim=0) > threshold).sum())
        total += h.shape[1]
    return active / total


def _output_jacobian(model, params, consts, inputs, task_labels, chunk_size):
    """``(J, outputs)``: ``J`` is the ``(n·C, P)`` float64 Jacobian of the flattened outputs w.r.t.
    the trainable parameters; ``outputs`` the ``(n, *out_shape)`` outputs (rows in group order)."""
    rows, outs = [], []
    for label, index in _task_groups(model, inputs.shape[0], task_labels):
        x = _take(inputs, index)

        def out_of(p, xi, label=label):
            return stateless_forward(model, {**consts, **p}, xi.unsqueeze(0), label)[0]

        per_sample = vmap(jacrev(out_of), in_dims=(None, 0))
        for s in iterate_batches(x.shape[0], chunk_size):
            jac = per_sample(params, x[s])  # {name: (m, *out_shape, *param_shape)}
            m = s.stop - s.start
            with torch.no_grad():
                out = vmap(out_of, in_dims=(None, 0))(params, x[s])
            c = out[0].numel()
            rows.append(torch.cat([j.double().reshape(m * c, -1) for j in jac.values()], dim=1))
            outs.append(out)
    return torch.cat(rows, dim=0), torch.cat(outs, dim=0)


def _gram_eigenvalues(matrix: torch.Tensor) -> torch.Tensor:
    """Squared singular values of ``matrix`` via the smaller Gram matrix (float64)."""
    gram = matrix @ matrix.T if matrix.shape[0] <= matrix.shape[1] else matrix.T @ matrix
    return torch.linalg.eigvalsh(gram).clamp(min=0)


def entk_energy_rank(model: nn.Module, inputs: torch.Tensor, energy: float = 0.99, *,
                     task_labels: torch.Tensor | None = None, chunk_size: int = 256) -> int:
    """Energy rank of the empirical NTK: of the output Jacobian ``J`` on ``n`` probe inputs.

    ``J`` is ``(n·C) × P`` (C outputs per sample, P trainable parameters); its squared singular
    values are the eigenvalues of the eNTK Gram matrix ``J Jᵀ``:

    .. math:: \\min\\Big\\{k : \\sum_{i\\le k} σ_i(J)^2 \\ge \\text{energy}\\cdot\\lVert J\\rVert_F^2\\Big\\}

    Cost: ``J`` is built with ``vmap(jacrev)`` (about ``C`` backward passes per sample) and held in
    memory (``n·C·P`` float64 values), then one ``min(n·C, P)``-sized symmetric eigensolve. Keep
    ``n`` modest (tens to a few hundred probes).

    Example:
        >>> net = nn.Linear(3, 2)
        >>> entk_energy_rank(net, torch.randn(10, 3), energy=1.0)  # 2 outputs × (3 inputs + bias)
        8
    """
    check_inputs(inputs)
    _check_energy(energy)
    check_int("chunk_size", chunk_size)
    _check_task_labels(task_labels, inputs.shape[0])
    params, consts = _split_params(model)
    with eval_mode(model):
        jac, _ = _output_jacobian(model, params, consts, inputs, task_labels, chunk_size)
    if not torch.isfinite(jac).all():
        raise ValueError("the output Jacobian has non-finite values")
    return _energy_rank_from_squares(_gram_eigenvalues(jac), energy)


def hessian_energy_rank(model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor,
                        energy: float = 0.99, max_params: int = 5000, *,
                        task_labels: torch.Tensor | None = None, chunk_size: int = 256) -> int:
    """Energy rank of the loss Hessian's spectrum (``σ_i = |λ_i|``) w.r.t. all trainable parameters.

    .. math:: \\min\\Big\\{k : \\sum_{i\\le k} λ_i^2 \\ge \\text{energy}\\cdot\\sum_i λ_i^2\\Big\\}
              \\quad (|λ_1| \\ge |λ_2| \\ge \\dots)

    * ``P ≤ max_params``: exact. The full ``P × P`` Hessian of the mean loss is assembled from
      sample-count-weighted chunk Hessians (``jacrev`` of ``grad``, reverse-over-reverse, rows in
      blocks of 256), then ``eigvalsh``. Cost ``O(P)`` gradient passes over the data and ``O(P³)``.
    * ``P > max_params``: **Gauss–Newton approximation**
      ``G = (1/N) Σ_i J_iᵀ H_i J_i`` (``J_i`` the output Jacobian of sample i, ``H_i`` the Hessian
      of its loss w.r.t. its outputs), i.e. the Hessian without the residual-curvature term (exact
      for models linear in their parameters). Its non-zero spectrum is that of the ``n·C × n·C``
      dual ``(1/N) S J Jᵀ S`` with ``S = blockdiag(H_i^{1/2})`` (``H_i`` is PSD for MSE and
      cross-entropy; negative parts are clipped). Cost as :func:`entk_energy_rank`.

    Example:
        >>> net = nn.Linear(3, 1)
        >>> x, y = torch.randn(20, 3), torch.randn(20, 1)
        >>> hessian_energy_rank(net, nn.MSELoss(), x, y, energy=1.0)  # (2/N) X̃ᵀX̃ has rank 4
        4
    """
    check_inputs(inputs, targets)
    _check_energy(energy)
    check_int("max_params", max_params)
    check_int("chunk_size", chunk_size)
    n = inputs.shape[0]
    _check_task_labels(task_labels, n)
    params, consts = _split_params(model)
    names = list(params)
    shapes = [params[k].shape for k in names]
    sizes = [params[k].numel() for k in names]
    n_params = sum(sizes)
    groups = _task_groups(model, n, task_labels)
    with eval_mode(model):
        if n_params <= max_params:
            flat0 = torch.cat([params[k].reshape(-1) for k in names])
            hessian = torch.zeros(n_params, n_params, dtype=torch.float64, device=flat0.device)
            for label, index in groups:
                x, y = _take(inputs, index), _take(targets, index)
                batch_loss = _batch_loss(model, loss_fn, consts, label)

                def loss_of_flat(flat, xb, yb, batch_loss=batch_loss):
                    pieces = torch.split(flat, sizes)
                    p = {k: v.view(shape) for k, v, shape in zip(names, pieces, shapes)}
                    return batch_loss(p, xb, yb)

                second = jacrev(grad(loss_of_flat), chunk_size=256)
                for s in iterate_batches(x.shape[0], chunk_size):
                    check_finite_loss(loss_of_flat(flat0, x[s], y[s]).detach(), "while computing the Hessian")
                    hessian += second(flat0, x[s], y[s]).double() * (s.stop - s.start)
            hessian = (hessian + hessian.T) / (2 * n)
            if not torch.isfinite(hessian).all():
                raise ValueError("the Hessian has non-finite values")
            return _energy_rank_from_squares(torch.linalg.eigvalsh(hessian).pow(2), energy)

        jac, outputs = _output_jacobian(model, params, consts, inputs, task_labels, chunk_size)
        ordered_targets = torch.cat([_take(targets, index) for _, index in groups], dim=0)
        out_shape = outputs.shape[1:]

        def sample_loss(out, y):
            return loss_fn(out.unsqueeze(0), y.unsqueeze(0))

        def out_hessian(out, y):
            flat_hessian = jacrev(grad(lambda o: sample_loss(o.view(out_shape), y)))
            return flat_hessian(out.reshape(-1))

        blocks = vmap(out_hessian)(outputs.detach(), ordered_targets).double()  # (n, C, C)
        evals, evecs = torch.linalg.eigh((blocks + blocks.transpose(1, 2)) / 2)
        roots = evecs @ torch.diag_embed(evals.clamp(min=0).sqrt()) @ evecs.transpose(1, 2)
        c = blocks.shape[1]
        scaled = torch.bmm(roots, jac.reshape(n, c, -1)).reshape(n * c, -1) / math.sqrt(n)
    if not torch.isfinite(scaled).all():
        raise ValueError("the Gauss–Newton factor has non-finite values")
    return _energy_rank_from_squares(_gram_eigenvalues(scaled).pow(2), energy)


# --------------------------------------------------------------------------------------------
# Ranking agreement
# --------------------------------------------------------------------------------------------


def _paired(a, b, name_a: str, name_b: str):
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"{name_a} has {a.size} values but {name_b} has {b.size}")
    if a.size < 2:
        raise ValueError(f"{name_a} needs at least 2 values, got {a.size}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError(f"{name_a} and {name_b} must be finite")
    return a, b


def pairwise_ranking_accuracy(metric_values, true_gains) -> float:
    """Fraction of pairs that ``metric_values`` orders like ``true_gains``.

    .. math:: \\frac{\\sum_{i<j,\\ t_i \\ne t_j} \\big[\\mathbb 1\\{(m_i-m_j)(t_i-t_j) > 0\\}
              + \\tfrac12 \\mathbb 1\\{m_i = m_j\\}\\big]}{\\#\\{i<j : t_i \\ne t_j\\}}

    Pairs with equal true gains are skipped; metric ties count ½. Without ties this is
    ``(1 + τ_a)/2`` (Kendall's τ_a).

    Raises:
        ValueError: different lengths, fewer than 2 values, non-finite values, or all true gains
            equal (no pair to rank).

    Example:
        >>> pairwise_ranking_accuracy([0.1, 0.2, 0.2], [1.0, 2.0, 3.0])
        0.8333333333333334
    """
    m, t = _paired(metric_values, true_gains, "metric_values", "true_gains")
    upper = np.triu(np.ones((m.size, m.size), dtype=bool), k=1)
    dm = np.sign(m[:, None] - m[None, :])[upper]
    dt = np.sign(t[:, None] - t[None, :])[upper]
    keep = dt != 0
    if not keep.any():
        raise ValueError("true_gains are all equal: there is no pair to rank")
    score = (dm[keep] * dt[keep] > 0) + 0.5 * (dm[keep] == 0)
    return float(score.mean())


def _average_ranks(a: np.ndarray) -> np.ndarray:
    ordered = np.sort(a)
    below = np.searchsorted(ordered, a, side="left")
    upto = np.searchsorted(ordered, a, side="right")
    return (below + upto + 1) / 2.0


def spearman(a, b) -> float:
    """Spearman's rank correlation: Pearson correlation of average ranks (ties share their mean rank).

    .. math:: ρ = \\frac{\\operatorname{cov}(\\operatorname{rank} a, \\operatorname{rank} b)}
              {σ_{\\operatorname{rank} a}\\, σ_{\\operatorname{rank} b}}

    NaN when either input is constant (as ``scipy.stats.spearmanr``).

    Example:
        >>> spearman([1, 2, 3, 4], [10, 20, 30, 25])
        0.8
    """
    a, b = _paired(a, b, "a", "b")
    ra, rb = _average_ranks(a), _average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denom) if denom > 0 else float("nan")


def kendall_tau(a, b) -> float:
    """Kendall's τ_b (ties in either input handled).

    .. math:: τ_b = \\frac{\\sum_{i<j} \\operatorname{sgn}(a_i-a_j)\\operatorname{sgn}(b_i-b_j)}
              {\\sqrt{(n_0-n_a)(n_0-n_b)}}

    with ``n_0 = n(n−1)/2`` and ``n_a``, ``n_b`` the tied pairs of each input. NaN when either input
    is constant (as ``scipy.stats.kendalltau``).

    Example:
        >>> kendall_tau([1, 2, 3], [1, 3, 2])
        0.3333333333333333
    """
    a, b = _paired(a, b, "a", "b")
    upper = np.triu(np.ones((a.size, a.size), dtype=bool), k=1)
    da = np.sign(a[:, None] - a[None, :])[upper]
    db = np.sign(b[:, None] - b[None, :])[upper]
    denom = math.sqrt(float((da != 0).sum()) * float((db != 0).sum()))
    return float((da * db).sum() / denom) if denom > 0 else float("nan")
