"""Optimization Readiness ``OR = ‖g‖⁴ / (L · E_B‖ĝ_B‖²)`` with its strength and reliability factors
(see :mod:`avalanche_plugins.readiness`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import grad, grad_and_value, vmap

from avalanche_plugins.core.calls import (
    batch_loss,
    check_task_labels,
    eval_mode,
    grouped_loss_and_grad,
    iterate_batches,
    sample_loss,
    split_params,
    task_batches,
    task_groups,
    vmap_chunk,
)
from avalanche_plugins.core.checks import (
    check_choice,
    check_estimator_inputs,
    check_finite_loss,
    check_inputs,
    check_int,
    check_no_recurrent,
)
from avalanche_plugins.core.reductions import mean_loss
from avalanche_plugins.readiness._common import (
    _draw_batches,
    _sq_norms,
)

__all__ = ["ESTIMATORS", "ReadinessResult", "optimization_readiness"]

ESTIMATORS = ("sampled", "per_sample")




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
    """Mean loss and ``‖g‖²`` over all samples, from chunks of ``chunk_size`` samples."""
    grads, loss = grouped_loss_and_grad(model, loss_fn, consts, inputs, targets, groups, chunk_size)(params)
    check_finite_loss(loss, "while computing optimization readiness")
    grad_norm_sq = sum(float(g.pow(2).sum()) for g in grads.values())
    check_finite_loss(torch.tensor(grad_norm_sq), "(gradient) while computing optimization readiness")
    return float(loss), grad_norm_sq


def _per_sample_chunks(model, loss_fn, params, consts, x, y, label, chunk_size):
    """Yield ``(per-sample gradients {name: (m, *shape)}, per-sample losses (m,))`` chunk by chunk."""
    per_sample = vmap(grad_and_value(sample_loss(model, loss_fn, consts, label)), in_dims=(None, 0, 0))
    for s in iterate_batches(x.shape[0], chunk_size):
        grads, values = per_sample(params, x[s], y[s])
        check_finite_loss(values.sum().detach(), "while computing per-sample gradients")
        yield grads, values


def _per_sample_moments(model, loss_fn, params, consts, inputs, targets, groups, batch_size, chunk_size):
    """``(L, ‖g‖², E‖ĝ_B‖²)`` from per-sample gradients: the minibatch second moment in closed form,
    ``‖g‖² + tr(Σ)/B · (N − B)/(N − 1)`` (batches of ``B`` drawn without replacement)."""
    n = inputs.shape[0]
    loss_sum = torch.zeros((), dtype=torch.float64)
    sq_sum = torch.zeros((), dtype=torch.float64)
    g_sum = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in params.items()}
    for label, xs, ys, _ in task_batches(model, inputs, targets, groups=groups):
        for grads, values in _per_sample_chunks(model, loss_fn, params, consts, xs, ys, label, chunk_size):
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
    return loss, grad_norm_sq, second_moment


def _minibatch_second_moment(model, loss_fn, params, consts, inputs, targets, task_labels, groups,
                             batches, chunk_size):
    """Mean over ``batches`` (rows of indices) of ``‖ĝ_B‖²``, the minibatch-mean gradient's norm."""
    n_batches, batch_size = batches.shape
    per_chunk = max(1, chunk_size // batch_size)
    total = torch.zeros((), dtype=torch.float64)
    if len(groups) == 1:
        label = groups[0][0]
        batch_grads = vmap(grad(batch_loss(model, loss_fn, consts, label)), in_dims=(None, 0, 0))
        for s in iterate_batches(n_batches, per_chunk):
            index = batches[s].to(inputs.device)
            sq = _sq_norms(batch_grads(params, inputs[index], targets[index]))
            check_finite_loss(sq.sum(), "(gradient) while computing optimization readiness")
            total += sq.sum().cpu()
        return float(total) / n_batches
    # Minibatches that mix tasks: a minibatch-mean gradient is the mean of its per-sample gradients
    # (mean-reduced loss), and per-sample gradients can be grouped by task. Each chunk of per-sample
    # gradients is added into the minibatch sums through a (minibatches × samples) membership
    # matrix, so no (samples × P) matrix is held.
    device = inputs.device
    labels = task_labels.reshape(-1).to(device)
    for s in iterate_batches(n_batches, per_chunk):
        unique, inverse = torch.unique(batches[s].to(device), return_inverse=True)
        member = torch.zeros(inverse.shape[0], unique.numel(), dtype=torch.float64, device=device)
        member.scatter_add_(1, inverse, torch.ones(inverse.shape, dtype=torch.float64, device=device))
        sums = {k: torch.zeros(inverse.shape[0], v.numel(), dtype=torch.float64, device=v.device)
                for k, v in params.items()}
        for task in torch.unique(labels[unique]):
            pos = (labels[unique] == task).nonzero().squeeze(1)
            which = unique[pos]
            done = 0
            for grads, _ in _per_sample_chunks(model, loss_fn, params, consts, inputs[which], targets[which],
                                               int(task), chunk_size):
                m = next(iter(grads.values())).shape[0]
                weight = member[:, pos[done:done + m]]
                for k, g in grads.items():
                    sums[k] += weight @ g.double().reshape(m, -1)
                done += m
        sq = sum((v / batch_size).pow(2).sum(1) for v in sums.values())
        check_finite_loss(sq.sum(), "(gradient) while computing optimization readiness")
        total += sq.sum().cpu()
    return float(total) / n_batches


def optimization_readiness(model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor, *,
                           batch_size: int = 4, n_batches: int = 128, estimator: str = "sampled",
                           seed: int = 0, task_labels: torch.Tensor | None = None,
                           chunk_size: int | None = None) -> ReadinessResult:
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
        loss_fn: the loss ``loss_fn(outputs, targets)``, mean- or sum-reduced over the samples:
            every quantity is of the per-sample mean loss (the paper's), a sum-reduced batch loss
            divided by its sample count (:func:`~avalanche_plugins.core.reductions.mean_loss`; a
            plain callable is probed on two samples, ``reduction="none"`` refused).
        inputs, targets: the target task's samples (first dimension ``N``).
        batch_size: ``B``, between 1 and ``N``.
        n_batches: number of sampled minibatches (``"sampled"`` only).
        estimator: ``"sampled"`` or ``"per_sample"``.
        seed: seed of the ``torch.Generator`` drawing the minibatches.
        task_labels: per-sample task labels for multi-task models (ignored by plain models).
        chunk_size: samples per vectorised pass (memory knob; results do not depend on it beyond
            float rounding): the batch gradients of ``chunk_size`` samples,
            ``max(1, chunk_size // batch_size)`` minibatch gradients or ``chunk_size`` per-sample
            gradients are held at once (each gradient ``P`` floats). None (default):
            :func:`~avalanche_plugins.core.calls.vmap_chunk` of the model, 16 for a CIFAR
            ResNet-18 (under 2.5 GB), up to 256 for small models, whose cost is per-call overhead.

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
    check_estimator_inputs(model, inputs, targets, loss_fn=loss_fn, task_labels=task_labels)
    check_no_recurrent(model, "optimization_readiness")
    check_inputs(inputs, targets)
    check_choice("estimator", estimator, ESTIMATORS)
    n = inputs.shape[0]
    check_int("batch_size", batch_size)
    if batch_size > n:
        raise ValueError(f"batch_size={batch_size} is larger than the number of samples ({n})")
    check_int("n_batches", n_batches)
    check_int("seed", seed, minimum=0)
    check_task_labels(task_labels, n)
    if chunk_size is None:
        chunk_size = vmap_chunk(model, inputs, task_labels)
    check_int("chunk_size", chunk_size)
    loss_fn = mean_loss(loss_fn, "optimization_readiness", model=model, inputs=inputs, targets=targets,
                        task_labels=task_labels)
    params, consts = split_params(model)
    groups = task_groups(model, n, task_labels)

    with eval_mode(model):
        if estimator == "per_sample":
            loss, grad_norm_sq, second_moment = _per_sample_moments(model, loss_fn, params, consts, inputs, targets,
                                                                    groups, batch_size, chunk_size)
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


