"""Readiness variants beyond the paper (ours, issue 33): a short lookahead and the curvature along
the gradient.

OR scores a checkpoint from the gradient alone: ``S = ‖g‖²/L`` is the first-order slope of the
relative loss, ``R`` the minibatch signal-to-noise ratio. Two cheap corrections for what that
misses:

* :func:`lookahead_readiness` (``LA^(k')``): the relative loss decrease of a few (``n_runs``)
  short (``k'`` steps) minibatch runs from the checkpoint, measured on the probe samples: an
  unbiased but noisy estimate of ``G^(k')``, so it sees curvature, noise and the first ``k'``
  steps' change of direction, at ``n_runs·k'`` minibatch gradients plus ``n_runs`` evaluations.
* :func:`curvature_readiness`: the quadratic model of one full-batch step of size ``η`` along
  the gradient, ``Q(η) = (η‖g‖² − ½ η² gᵀHg) / L``, from one Hessian-vector product
  (reverse-over-reverse); OR's bound uses a global smoothness ``β`` where this uses the curvature
  ``gᵀHg/‖g‖²`` along the direction actually taken.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import grad

from avalanche_plugins.core.calls import (
    batch_loss,
    check_task_labels,
    eval_mode,
    grouped_loss_and_grad,
    split_params,
    task_batches,
    task_groups,
)
from avalanche_plugins.core.checks import (
    check_estimator_inputs,
    check_finite_loss,
    check_inputs,
    check_int,
    check_positive,
)
from avalanche_plugins.core.reductions import mean_loss
from avalanche_plugins.readiness.gain import k_step_gain

__all__ = ["LookaheadResult", "CurvatureResult", "lookahead_readiness", "curvature_readiness"]


@dataclass(frozen=True)
class LookaheadResult:
    """Output of :func:`lookahead_readiness`.

    Attributes:
        readiness: ``LA^(k')``, the mean over runs of ``(L(θ) − L(θ_k')) / L(θ)``.
        stderr: its standard error over runs (NaN for one run).
        loss: ``L(θ)`` on the evaluation samples.
        k, n_runs, lr, batch_size: the lookahead's protocol.
    """

    readiness: float
    stderr: float
    loss: float
    k: int
    n_runs: int
    lr: float
    batch_size: int


def lookahead_readiness(model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor, *, lr: float,
                        k: int = 10, n_runs: int = 8, batch_size: int = 4, optimizer: str = "sgd",
                        eval_inputs: torch.Tensor | None = None, eval_targets: torch.Tensor | None = None,
                        seed: int = 0, task_labels: torch.Tensor | None = None,
                        chunk_size: int = 1024) -> LookaheadResult:
    """Lookahead readiness: the relative loss decrease of ``n_runs`` short minibatch runs.

    .. math::

        \\mathrm{LA}^{(k')} = \\frac{1}{n_\\text{runs}} \\sum_{r=1}^{n_\\text{runs}}
            \\frac{L(θ) - L(θ^{r}_{k'})}{L(θ)}

    ``θ^r_{k'}``: ``k'`` steps of ``optimizer`` (``"sgd"`` or fresh ``"adam"``) at ``lr`` on
    minibatches of ``batch_size`` distinct samples of ``(inputs, targets)``, drawn with a
    ``torch.Generator`` seeded with ``seed``; ``L`` on ``(eval_inputs, eval_targets)`` (default:
    the same samples). This is :func:`~avalanche_plugins.readiness.k_step_gain` with few runs and a
    short horizon, so it has the ground truth's conventions (eval mode, vectorised runs, the model
    never changed, a diverging run giving a non-finite value, the per-sample mean loss whatever
    ``loss_fn``'s reduction). Cost: ``n_runs·k'`` minibatch
    gradients and ``n_runs + 1`` evaluations, against ``128·100`` and 129 for the paper's
    ``G^(100)`` (0.6 % of its steps and 7 % of its evaluations at the defaults).

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> net = nn.Linear(3, 1)
        >>> x, y = torch.randn(32, 3), torch.randn(32, 1)
        >>> la = lookahead_readiness(net, nn.MSELoss(), x, y, lr=0.05, k=5, n_runs=4)
        >>> la.readiness > 0, la.n_runs
        (True, 4)
    """
    check_estimator_inputs(model, inputs, targets, loss_fn=loss_fn, task_labels=task_labels)
    if (eval_inputs is None) != (eval_targets is None):
        raise ValueError("give both eval_inputs and eval_targets, or neither")
    if eval_inputs is None:
        eval_inputs, eval_targets = inputs, targets
    loss_fn = mean_loss(loss_fn, "lookahead_readiness", model=model, inputs=inputs, targets=targets,
                        task_labels=task_labels)
    res = k_step_gain(model, loss_fn, inputs, targets, eval_inputs, eval_targets, k=k, lr=lr, optimizer=optimizer,
                      batch_size=batch_size, n_runs=n_runs, seed=seed, task_labels=task_labels,
                      chunk_size=chunk_size)
    return LookaheadResult(readiness=res.gain, stderr=res.stderr, loss=res.loss_before, k=k, n_runs=n_runs,
                           lr=float(lr), batch_size=batch_size)


@dataclass(frozen=True)
class CurvatureResult:
    """Output of :func:`curvature_readiness`.

    Attributes:
        loss: ``L(θ)``. grad_norm_sq: ``‖g‖²``. grad_curvature: ``gᵀHg``.
        curvature: ``gᵀHg / ‖g‖²``, the Hessian's Rayleigh quotient along ``g`` (0 when ``g = 0``).
        quadratic_gain: ``Q(η) = (η‖g‖² − ½η² gᵀHg) / L`` at the given ``lr``.
        lr: ``η``.
    """

    loss: float
    grad_norm_sq: float
    grad_curvature: float
    curvature: float
    quadratic_gain: float
    lr: float


def _grad_hessian_grad(model, loss_fn, params, consts, inputs, targets, groups, chunk_size, grads):
    """``gᵀHg`` of the mean loss: one reverse-over-reverse HVP per chunk, weighted by its share."""
    tangent = {k: grads[k].to(v.dtype) for k, v in params.items()}
    total = torch.zeros((), dtype=torch.float64)
    for label, xs, ys, weight in task_batches(model, inputs, targets, chunk_size=chunk_size, groups=groups):
        loss_of = batch_loss(model, loss_fn, consts, label)

        def directional(p, xs=xs, ys=ys, loss_of=loss_of):
            g = grad(loss_of)(p, xs, ys)
            return sum((g[k] * tangent[k]).sum() for k in g)

        hvp = grad(directional)(params)
        total += weight * sum((hvp[k].double() * grads[k]).sum() for k in params).cpu()
    return float(total)


def curvature_readiness(model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor, *, lr: float,
                        task_labels: torch.Tensor | None = None, chunk_size: int = 1024) -> CurvatureResult:
    """Curvature-aware readiness: the quadratic model's relative gain of one full-batch step.

    .. math::

        Q(η) = \\frac{η\\lVert g\\rVert^2 - \\tfrac12 η^2\\, g^\\top H g}{L},
        \\qquad g = ∇L(θ),\\; H = ∇^2 L(θ)

    ``L`` is the per-sample mean loss, also for a sum-reduced ``loss_fn`` (divided by the sample
    count, as in :func:`~avalanche_plugins.readiness.optimization_readiness`), so ``Q(η)`` models the
    same step whatever the reduction and the number of samples.

    For a quadratic loss ``Q(η)`` is the exact relative decrease of the step ``θ − ηg``; in
    general it is its second-order expansion. ``gᵀHg`` is one Hessian-vector product
    (reverse-over-reverse ``grad`` of ``gᵀ∇L``, chunked and weighted like the loss), so the cost is about three
    gradients of the data. Rules: a loss ≤ 0 raises ``ValueError`` (as for OR); a zero gradient
    gives ``Q = 0``.

    Example:
        >>> x = torch.tensor([[1.0], [2.0]]); y = torch.tensor([[1.0], [2.0]])
        >>> net = nn.Linear(1, 1, bias=False)
        >>> with torch.no_grad():
        ...     _ = net.weight.zero_()
        >>> r = curvature_readiness(net, nn.MSELoss(), x, y, lr=0.1)  # L = 2.5, g = −5, H = 5
        >>> r.loss, r.grad_norm_sq, r.grad_curvature, round(r.quadratic_gain, 10)
        (2.5, 25.0, 125.0, 0.75)
    """
    check_estimator_inputs(model, inputs, targets, loss_fn=loss_fn, task_labels=task_labels)
    check_inputs(inputs, targets)
    check_positive("lr", lr)
    check_int("chunk_size", chunk_size)
    check_task_labels(task_labels, inputs.shape[0])
    loss_fn = mean_loss(loss_fn, "curvature_readiness", model=model, inputs=inputs, targets=targets,
                        task_labels=task_labels)
    params, consts = split_params(model)
    groups = task_groups(model, inputs.shape[0], task_labels)
    with eval_mode(model):
        grads, loss = grouped_loss_and_grad(model, loss_fn, consts, inputs, targets, groups, chunk_size)(params)
        check_finite_loss(loss, "while computing curvature readiness")
        loss = float(loss)
        grad_norm_sq = sum(float(g.pow(2).sum()) for g in grads.values())
        ghg = _grad_hessian_grad(model, loss_fn, params, consts, inputs, targets, groups, chunk_size, grads)
    check_finite_loss(torch.tensor(ghg), "(gᵀHg) while computing curvature readiness")
    if not loss > 0:
        raise ValueError(f"loss is {loss:g}: curvature readiness (a relative gain) needs a loss > 0")
    curvature = ghg / grad_norm_sq if grad_norm_sq > 0 else 0.0
    gain = (lr * grad_norm_sq - 0.5 * lr * lr * ghg) / loss
    return CurvatureResult(loss=loss, grad_norm_sq=grad_norm_sq, grad_curvature=ghg, curvature=curvature,
                           quadratic_gain=gain, lr=float(lr))
