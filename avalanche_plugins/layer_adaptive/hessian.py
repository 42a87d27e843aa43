"""Per-layer curvature: the top eigenvalue of every layer's Hessian block.

For layer ℓ with parameters θ^(ℓ) (its weight and bias, from :mod:`avalanche_plugins.core.layers`),
``s_ℓ = λ_max(H_ℓℓ)`` where ``H_ℓℓ = ∂²L / ∂θ^(ℓ)∂θ^(ℓ)`` is the diagonal block of the Hessian of
the mean loss. "Layers Matter" (Moser et al., 2026) bounds forgetting by
``½ Σ_ℓ s_ℓ ‖Δθ^(ℓ)‖²`` under a block-diagonal Hessian, so ``s_ℓ`` is the natural per-layer
regularisation strength.

Method (PyHessian-style power iteration, all layers at once): one random unit tangent per layer,
each non-zero only inside its block, stacked and pushed through one ``torch.vmap``-ed
reverse-over-reverse Hessian-vector product (``torch.func.vjp`` of ``torch.func.grad``; the
Hessian is symmetric) per iteration and minibatch, so all layers share each pass over the data. Keeping only each tangent's
own block of ``Hv`` gives ``H_ℓℓ v_ℓ`` exactly. Iteration stops per layer when the Rayleigh quotient
``ρ = vᵀHv`` changes by less than ``tol`` (relative) *and* the eigen-residual
``‖H_ℓℓ v − ρ v‖ / |ρ|`` is at most ``√tol``; a steady ρ alone is not convergence (with eigenvalues
``±λ`` the iterate oscillates while ρ stays anywhere in ``(−λ, λ)``). With ``chunk_size`` the HVP is the sample-weighted mean of
minibatch HVPs, i.e. exactly the full-data Hessian block, not an average of per-batch eigenvalues.

Sign: power iteration finds the eigenvalue of largest magnitude, which can be negative away
from a minimum. Such layers get a second, shifted power iteration on ``H_ℓℓ - μI`` (μ the negative
dominant eigenvalue), whose top eigenvalue is ``λ_max - μ``; so ``s_ℓ`` is always the largest
*algebraic* eigenvalue, and the dominant one is reported beside it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.func import grad, vjp, vmap

from avalanche_plugins.core.calls import (
    batch_loss,
    eval_mode,
    math_attention,
    task_batches,
)
from avalanche_plugins.core.checks import (
    check_estimator_inputs,
    check_finite_loss,
    check_inputs,
    check_int,
    check_positive,
)
from avalanche_plugins.core.layers import LayerMap, discover_layers, example_input

__all__ = ["LayerSpectrum", "GeometricFit", "PowerIteration", "layer_top_eigenvalues", "block_power_iteration",
           "geometric_fit", "condition_number"]


@dataclass
class GeometricFit:
    """Least-squares fit ``log s_ℓ ≈ a - (ℓ-1) log α`` over layers with ``s_ℓ > 0``.

    ``alpha > 1``: curvature decays with depth (early layers most sensitive).
    ``r2`` is the coefficient of determination of the fit in log space.
    """

    alpha: float
    intercept: float
    r2: float
    n_used: int

    def profile(self, n_layers: int) -> np.ndarray:
        """The fitted ``s_ℓ`` for ℓ = 1..n_layers."""
        depth = np.arange(n_layers)
        return np.exp(self.intercept - depth * math.log(self.alpha))


def geometric_fit(values) -> GeometricFit:
    """Fit ``log s_ℓ = a - (ℓ-1) log α`` by least squares on the positive ``s_ℓ``.

    Example:
        >>> fit = geometric_fit([8.0, 4.0, 2.0, 1.0])
        >>> round(fit.alpha, 6), round(fit.r2, 6)
        (2.0, 1.0)
    """
    s = np.asarray(values, dtype=float)
    depth = np.arange(len(s), dtype=float)
    keep = s > 0
    if keep.sum() < 2:
        raise ValueError(f"geometric_fit needs at least two positive values, got {s.tolist()}")
    x, y = depth[keep], np.log(s[keep])
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1.0 - (residual**2).sum() / total if total > 0 else 1.0
    return GeometricFit(alpha=float(math.exp(-slope)), intercept=float(intercept), r2=float(r2),
                        n_used=int(keep.sum()))


def condition_number(values) -> float:
    """``κ = max s_ℓ / min s_ℓ``; ``inf`` when some ``s_ℓ <= 0`` (the ratio is then meaningless).

    Example:
        >>> condition_number([4.0, 1.0, 2.0])
        4.0
    """
    s = np.asarray(values, dtype=float)
    if len(s) == 0:
        raise ValueError("condition_number needs at least one value")
    if (s <= 0).any():
        return float("inf")
    return float(s.max() / s.min())


@dataclass
class LayerSpectrum:
    """Result of :func:`layer_top_eigenvalues` (one entry per layer of the layer map)."""

    names: list[str]
    top: np.ndarray  # s_ℓ, largest algebraic eigenvalue of H_ℓℓ
    dominant: np.ndarray  # largest-magnitude eigenvalue (signed)
    iterations: list[int]
    converged: list[bool]
    last_relative_change: list[float]
    method: str = "hessian"  # which curvature: "hessian" (exact blocks) or "fisher" (Fisher blocks)

    @property
    def kappa(self) -> float:
        return condition_number(self.top)

    def fit(self) -> GeometricFit:
        return geometric_fit(self.top)

    def as_dict(self) -> dict[str, float]:
        return {n: float(v) for n, v in zip(self.names, self.top)}


# tangent helpers: a "tangent" is a dict of stacked tensors, one row per vector (K rows)

def _dot(a: dict, b: dict) -> torch.Tensor:
    """Per-tangent inner product of two stacked tangent dicts -> shape (K,)."""
    return sum((a[k] * b[k]).flatten(1).sum(1) for k in a)


def _norm(a: dict) -> torch.Tensor:
    """Per-tangent Euclidean norm -> shape (K,)."""
    return _dot(a, a).sqrt()


def _broadcast(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` (K,) viewed as (K, 1, …, 1) to scale the K rows of ``like``."""
    return values.view(-1, *[1] * (like.dim() - 1))


def _divide(a: dict, values: torch.Tensor) -> dict:
    """Row k of every tensor of ``a`` divided by ``values[k]``."""
    return {k: t / _broadcast(values, t) for k, t in a.items()}


class PowerIteration(NamedTuple):
    """Per-vector outcome of :func:`block_power_iteration` (CPU tensors of shape (K,))."""
    estimate: torch.Tensor  # float64 Rayleigh quotient ρ = vᵀHv at the last iteration
    iterations: torch.Tensor  # long, iterations run
    change: torch.Tensor  # float64, last relative change of ρ (inf after one iteration)
    residual: torch.Tensor  # float64, eigen-residual ‖Hv − ρv‖ / |ρ|


def block_power_iteration(hvp, start: dict, tol: float, max_iter: int) -> PowerIteration:
    """K independent power iterations run together, PyHessian-style, on stacked tangents.

    .. math:: v_{t+1} = \\frac{H v_t}{\\|H v_t\\|}, \\qquad ρ_t = v_t^\\top H v_t

    Args:
        hvp: ``hvp(v, rows) -> Hv`` for the stacked tangents ``v`` of the still-active vectors,
            ``rows`` their positions among the K (a CPU index tensor); each vector may have its own
            operator (e.g. its own Hessian block).
        start: ``{name: (K, *shape) tensor}`` start vectors (normalised here).
        tol: a vector stops when ρ changes by less than ``tol`` (relative) and its eigen-residual
            ``‖Hv − ρv‖/|ρ|`` is at most ``√tol`` (a steady ρ alone is not convergence: with
            eigenvalues ±λ the vector oscillates and ρ stays put anywhere in (−λ, λ)), or when ρ
            is 0 (a zero operator has nothing to iterate on).
        max_iter: iterations at most.

    Example:
        >>> a = torch.diag(torch.tensor([3.0, 1.0, -2.0]))
        >>> out = block_power_iteration(lambda v, rows: {"w": v["w"] @ a}, {"w": torch.ones(1, 3)}, 1e-8, 500)
        >>> round(float(out.estimate[0]), 4)
        3.0
    """
    v = _divide(start, _norm(start))
    k = next(iter(v.values())).shape[0]
    device = next(iter(v.values())).device  # bookkeeping stays on the CPU, tensors on the vectors' device
    estimate = torch.zeros(k, dtype=torch.float64)
    change = torch.full((k,), float("inf"), dtype=torch.float64)
    residual = torch.full((k,), float("inf"), dtype=torch.float64)
    iterations = torch.zeros(k, dtype=torch.long)
    active = torch.ones(k, dtype=torch.bool)
    for step in range(1, max_iter + 1):
        idx = active.nonzero().flatten()
        idx_on_device = idx.to(device)
        sub = {name: t[idx_on_device] for name, t in v.items()}
        hv = hvp(sub, idx)
        rayleigh_on_device = _dot(sub, hv)
        rayleigh = rayleigh_on_device.double().cpu()
        prev = estimate[idx]
        if step > 1:
            change[idx] = (rayleigh - prev).abs() / (prev.abs() + 1e-12)
        estimate[idx] = rayleigh
        iterations[idx] = step
        resid = {name: hv[name] - _broadcast(rayleigh_on_device.to(hv[name].dtype), hv[name]) * sub[name]
                 for name in hv}
        residual[idx] = _norm(resid).double().cpu() / rayleigh.abs().clamp_min(1e-30)
        for name, t in _divide(hv, _norm(hv).clamp_min(1e-30)).items():
            v[name][idx_on_device] = t
        done = (change[idx] < tol) & (residual[idx] <= math.sqrt(tol))
        done |= rayleigh.abs() < 1e-30
        active[idx[done]] = False
        if not active.any():
            break
    return PowerIteration(estimate, iterations, change, residual)


class _LayerBlocks:
    """The diagonal Hessian blocks ``H_ℓℓ`` of the mean loss, as one stacked HVP per call.

    The data are cut into minibatches of one task each (an int label: Avalanche's single-task
    path), weighted by their share of the samples, so that the weighted sum of their HVPs is the
    full-data block HVP.
    """

    def __init__(self, model, loss_fn, inputs, targets, task_labels, layer_map, chunk_size, layer_chunk_size):
        self.layer_map = layer_map
        self.layer_chunk_size = layer_chunk_size
        self.block_names = [name for layer in layer_map for name in layer.params]
        self.owner = torch.tensor([layer.index for layer in layer_map for _ in layer.params])
        state = {k: v.detach() for k, v in model.named_parameters()}
        state.update({k: v.detach() for k, v in model.named_buffers()})
        self.primal = {k: state[k] for k in self.block_names}
        self.device = next(iter(self.primal.values())).device
        self.loss_of = batch_loss(model, loss_fn, {k: v for k, v in state.items() if k not in self.primal})
        self.batches = [(xs, ys, label, weight)
                        for label, xs, ys, weight in task_batches(model, inputs, targets, task_labels, chunk_size)]
        with torch.no_grad():
            for x, y, t, _ in self.batches[:1]:
                check_finite_loss(self.loss_of(self.primal, x, y, t), "at the parameters being measured")

    def hvp(self, tangents: dict, layer_ids: torch.Tensor, shift: torch.Tensor) -> dict:
        """``(H_ℓℓ - shift_ℓ I) v_ℓ`` for each stacked tangent (tangent k on layer ``layer_ids[k]``)."""
        total = {k: torch.zeros_like(v) for k, v in tangents.items()}
        for x, y, t, weight in self.batches:
            # reverse-over-reverse: H is symmetric, so the VJP of the gradient is Hv. (Forward-over-
            # reverse fails inside MSELoss's backward with "ZeroTensors are immutable".)
            _, hvp = vjp(lambda p, x=x, y=y, t=t: grad(self.loss_of)(p, x, y, t), self.primal)
            out = vmap(lambda tangent, hvp=hvp: hvp(tangent)[0], chunk_size=self.layer_chunk_size)(tangents)
            for k in total:
                total[k] += weight * out[k]
        shift = shift.to(self.device)
        return {k: self._in_block(k, layer_ids, total[k]) * total[k] - _broadcast(shift, total[k]) * tangents[k]
                for k in total}

    def _in_block(self, name: str, layer_ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """1 for the tangents whose layer owns parameter ``name``, else 0, broadcast to ``like``."""
        i = self.block_names.index(name)
        return _broadcast((self.owner[i] == layer_ids).to(device=self.device, dtype=self.primal[name].dtype), like)

    def start_vectors(self, layer_ids: torch.Tensor, phase: int, seed: int) -> dict:
        """Random vectors on each layer's own parameters, from a CPU generator per (seed, layer,
        phase): the same on every device and whatever the layers' grouping."""
        primal = self.primal
        v = {name: torch.zeros((len(layer_ids), *primal[name].shape), dtype=primal[name].dtype, device=self.device)
             for name in self.block_names}
        for row, layer in enumerate(layer_ids.tolist()):
            generator = torch.Generator().manual_seed((seed * 1_000_003 + layer) * 2 + phase)
            for name in self.layer_map[layer].params:
                v[name][row] = torch.randn(primal[name].shape, generator=generator, dtype=primal[name].dtype)
        return v

    def power_iteration(self, layer_ids: torch.Tensor, shift: torch.Tensor, phase: int, seed: int, tol: float,
                        max_iter: int) -> PowerIteration:
        """:func:`block_power_iteration` on ``H_ℓℓ - shift_ℓ I`` for the layers ``layer_ids``."""
        return block_power_iteration(lambda v, rows: self.hvp(v, layer_ids[rows], shift[rows]),
                                     self.start_vectors(layer_ids, phase, seed), tol, max_iter)


def layer_top_eigenvalues(model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor, *,
                          max_iter: int = 100, tol: float = 1e-3, chunk_size: int | None = 32,
                          layer_chunk_size: int | None = 4, seed: int = 0, task_labels: torch.Tensor | None = None,
                          layer_map: LayerMap | None = None) -> LayerSpectrum:
    """Top eigenvalue ``s_ℓ`` of every layer's Hessian block, by block power iteration.

    .. math:: s_ℓ = \\max_{\\|v\\|=1} v^\\top H_{ℓℓ} v, \\qquad H_{ℓℓ} = \\nabla^2_{θ^{(ℓ)}} \\frac{1}{N}\\sum_i \\mathcal{L}(f(x_i), y_i)

    Args:
        model: any model of the layer map (evaluated in eval mode; its mode is restored).
        loss_fn: mean-reduced loss ``loss_fn(outputs, targets)`` (e.g. ``nn.CrossEntropyLoss()``).
        inputs, targets: the data defining the loss; ``task_labels`` for multi-task models.
        max_iter: power iterations per layer (a warning names layers that did not converge).
        tol: relative change of the Rayleigh quotient at which a layer stops.
        chunk_size: split the data into minibatches (HVP averaged, weighted by batch size; None:
            all samples at once).
        layer_chunk_size: layers iterated together, their tangents pushed through one
            ``vmap``-ed HVP (None: all at once). Memory grows with ``chunk_size × layer_chunk_size``
            (activations) and ``layer_chunk_size × parameters`` (tangents), never with the number
            of samples or layers.
        seed: seeds the random start vectors (one CPU generator per layer: the result does not
            depend on ``layer_chunk_size`` or the device, up to float summation order).
        layer_map: reuse a :func:`discover_layers` result.

    Raises:
        ValueError: empty data, bad ``max_iter``/``tol``/``chunk_size``, a model without layers,
            or a non-finite loss.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        >>> x, y = torch.randn(32, 3), torch.randint(0, 2, (32,))
        >>> spec = layer_top_eigenvalues(net, nn.CrossEntropyLoss(), x, y)
        >>> spec.names, bool((spec.top > 0).all())
        (['0', '2'], True)
    """
    check_estimator_inputs(model, inputs, targets, loss_fn=loss_fn, task_labels=task_labels)
    check_inputs(inputs, targets)
    check_int("max_iter", max_iter)
    check_positive("tol", tol)
    for name, value in (("chunk_size", chunk_size), ("layer_chunk_size", layer_chunk_size)):
        if value is not None:
            check_int(name, value)
    if layer_map is None:
        layer_map = discover_layers(model, example_input(model, inputs, task_labels))

    with eval_mode(model), math_attention():  # second derivatives through attention
        return _power_iteration(model, loss_fn, inputs, targets, task_labels, layer_map,
                                max_iter, tol, chunk_size, layer_chunk_size, seed)


def _power_iteration(model, loss_fn, inputs, targets, task_labels, layer_map, max_iter, tol,
                     chunk_size, layer_chunk_size, seed) -> LayerSpectrum:
    """``s_ℓ`` of every layer: a power iteration per layer, then a shifted one for the layers whose
    dominant eigenvalue is negative (module docstring), in groups of ``layer_chunk_size`` layers."""
    blocks = _LayerBlocks(model, loss_fn, inputs, targets, task_labels, layer_map, chunk_size, layer_chunk_size)
    n_layers = len(layer_map)
    # layers in groups of layer_chunk_size: the tangents (one model-sized vector per layer, a few
    # copies per iteration) of one group are held at a time
    dominant, top = torch.zeros(n_layers, dtype=torch.float64), torch.zeros(n_layers, dtype=torch.float64)
    iterations = torch.zeros(n_layers, dtype=torch.long)
    change, residual = torch.zeros(n_layers, dtype=torch.float64), torch.zeros(n_layers, dtype=torch.float64)
    for group in torch.arange(n_layers).split(layer_chunk_size or n_layers):
        dominant[group], iterations[group], change[group], residual[group] = \
            blocks.power_iteration(group, torch.zeros(len(group)), 0, seed, tol, max_iter)
        top[group] = dominant[group]
        negative = group[dominant[group] < 0]
        if len(negative):
            mu = dominant[negative]
            shifted, it2, ch2, res2 = blocks.power_iteration(negative, mu.float(), 1, seed, tol, max_iter)
            top[negative] = shifted + mu
            iterations[negative] += it2
            change[negative] = ch2
            residual[negative] = res2
    return _spectrum(layer_map.names, top, dominant, iterations, change, residual, tol, max_iter)


def _spectrum(names, top, dominant, iterations, change, residual, tol, max_iter) -> LayerSpectrum:
    """The :class:`LayerSpectrum`, warning about the layers that did not converge."""
    converged = [bool(c < tol and r <= math.sqrt(tol)) or abs(float(d)) < 1e-30
                 for c, r, d in zip(change, residual, dominant)]
    stuck = [f"{names[i]} (last relative change {float(change[i]):.2e}, residual {float(residual[i]):.2e})"
             for i in range(len(names)) if not converged[i]]
    if stuck:
        warnings.warn(f"power iteration did not reach tol={tol} within max_iter={max_iter} for layers: "
                      + ", ".join(stuck), RuntimeWarning, stacklevel=4)
    return LayerSpectrum(names=names, top=top.numpy(), dominant=dominant.numpy(),
                         iterations=iterations.tolist(), converged=converged,
                         last_relative_change=change.tolist())
