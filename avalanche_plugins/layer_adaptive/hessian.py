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

__all__ = ["LayerSpectrum", "GeometricFit", "layer_top_eigenvalues", "geometric_fit", "condition_number"]


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


def _dot(a: dict, b: dict) -> torch.Tensor:
    """Per-tangent inner product of two stacked tangent dicts -> shape (K,)."""
    return sum((a[k] * b[k]).flatten(1).sum(1) for k in a)


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
    n_layers = len(layer_map)
    block_names = [name for layer in layer_map for name in layer.params]
    owner = torch.tensor([layer.index for layer in layer_map for _ in layer.params])
    state = {k: v.detach() for k, v in model.named_parameters()}
    state.update({k: v.detach() for k, v in model.named_buffers()})
    primal = {k: state[k] for k in block_names}
    device = next(iter(primal.values())).device  # bookkeeping stays on the CPU, tensors on the model's device
    frozen = {k: v for k, v in state.items() if k not in primal}
    # minibatches of one task each (an int label: Avalanche's single-task path), weighted by their
    # share of the samples, so that the weighted sum of their HVPs is the full-data block HVP
    batches = [(xs, ys, label, weight)
               for label, xs, ys, weight in task_batches(model, inputs, targets, task_labels, chunk_size)]

    loss_of = batch_loss(model, loss_fn, frozen)

    with torch.no_grad():
        for x, y, t, _ in batches[:1]:
            check_finite_loss(loss_of(primal, x, y, t), "at the parameters being measured")

    def block_mask(layer_ids: torch.Tensor) -> dict:
        """mask[name][k] = 1 if parameter `name` belongs to the layer of tangent k."""
        return {
            name: (owner[i] == layer_ids).to(device=device, dtype=primal[name].dtype).view(-1, *[1] * primal[name].dim())
            for i, name in enumerate(block_names)
        }

    def block_hvp(tangents: dict, layer_ids: torch.Tensor, shift: torch.Tensor) -> dict:
        """(H_ℓℓ - shift_ℓ I) v_ℓ for each stacked tangent."""
        total = {k: torch.zeros_like(v) for k, v in tangents.items()}
        for x, y, t, weight in batches:
            # reverse-over-reverse: H is symmetric, so the VJP of the gradient is Hv. (Forward-over-
            # reverse fails inside MSELoss's backward with "ZeroTensors are immutable".)
            _, hvp = vjp(lambda p, x=x, y=y, t=t: grad(loss_of)(p, x, y, t), primal)
            out = vmap(lambda tangent, hvp=hvp: hvp(tangent)[0], chunk_size=layer_chunk_size)(tangents)
            for k in total:
                total[k] += weight * out[k]
        mask = block_mask(layer_ids)
        shift = shift.to(device)
        return {k: mask[k] * total[k] - shift.view(-1, *[1] * (total[k].dim() - 1)) * tangents[k] for k in total}

    def start_vectors(layer_ids: torch.Tensor, phase: int) -> dict:
        """Random unit vectors on each layer's own parameters, from a CPU generator per (seed,
        layer, phase): the same on every device and whatever the layers' grouping."""
        v = {name: torch.zeros((len(layer_ids), *primal[name].shape), dtype=primal[name].dtype, device=device)
             for name in block_names}
        for row, layer in enumerate(layer_ids.tolist()):
            generator = torch.Generator().manual_seed((seed * 1_000_003 + layer) * 2 + phase)
            for name in layer_map[layer].params:
                v[name][row] = torch.randn(primal[name].shape, generator=generator, dtype=primal[name].dtype)
        return v

    def run(layer_ids: torch.Tensor, shift: torch.Tensor, phase: int):
        k = len(layer_ids)
        v = start_vectors(layer_ids, phase)
        norm = _dot(v, v).sqrt()
        v = {name: t / norm.view(-1, *[1] * (t.dim() - 1)) for name, t in v.items()}
        estimate = torch.zeros(k, dtype=torch.float64)
        change = torch.full((k,), float("inf"), dtype=torch.float64)
        residual = torch.full((k,), float("inf"), dtype=torch.float64)
        iterations = torch.zeros(k, dtype=torch.long)
        active = torch.ones(k, dtype=torch.bool)
        for step in range(1, max_iter + 1):
            idx = active.nonzero().flatten()
            idx_on_device = idx.to(device)
            sub = {name: t[idx_on_device] for name, t in v.items()}
            hv = block_hvp(sub, layer_ids[idx], shift[idx])
            rayleigh_on_device = _dot(sub, hv)
            rayleigh = rayleigh_on_device.double().cpu()
            prev = estimate[idx]
            if step > 1:
                change[idx] = (rayleigh - prev).abs() / (prev.abs() + 1e-12)
            estimate[idx] = rayleigh
            iterations[idx] = step
            # eigen-residual ‖Hv − ρv‖/|ρ|: a steady Rayleigh quotient alone is not convergence
            # (with eigenvalues ±λ the vector oscillates and ρ stays put anywhere in (−λ, λ))
            resid = {name: hv[name] - rayleigh_on_device.to(hv[name].dtype).view(-1, *[1] * (hv[name].dim() - 1))
                     * sub[name] for name in block_names}
            residual[idx] = _dot(resid, resid).sqrt().double().cpu() / rayleigh.abs().clamp_min(1e-30)
            hv_norm = _dot(hv, hv).sqrt().clamp_min(1e-30)
            for name in block_names:
                v[name][idx_on_device] = hv[name] / hv_norm.view(-1, *[1] * (hv[name].dim() - 1))
            done = (change[idx] < tol) & (residual[idx] <= math.sqrt(tol))
            # an exactly zero block (e.g. dead layer) has nothing to iterate on
            done |= rayleigh.abs() < 1e-30
            active[idx[done]] = False
            if not active.any():
                break
        return estimate, iterations, change, residual

    # layers in groups of layer_chunk_size: the tangents (one model-sized vector per layer, a few
    # copies per iteration) of one group are held at a time
    dominant, top = torch.zeros(n_layers, dtype=torch.float64), torch.zeros(n_layers, dtype=torch.float64)
    iterations = torch.zeros(n_layers, dtype=torch.long)
    change, residual = torch.zeros(n_layers, dtype=torch.float64), torch.zeros(n_layers, dtype=torch.float64)
    for group in torch.arange(n_layers).split(layer_chunk_size or n_layers):
        dominant[group], iterations[group], change[group], residual[group] = run(group, torch.zeros(len(group)), 0)
        top[group] = dominant[group]
        negative = group[dominant[group] < 0]
        if len(negative):
            mu = dominant[negative]
            shifted, it2, ch2, res2 = run(negative, mu.float(), 1)
            top[negative] = shifted + mu
            iterations[negative] += it2
            change[negative] = ch2
            residual[negative] = res2

    converged = [bool(c < tol and r <= math.sqrt(tol)) or abs(float(d)) < 1e-30
                 for c, r, d in zip(change, residual, dominant)]
    names = layer_map.names
    stuck = [f"{names[i]} (last relative change {float(change[i]):.2e}, residual {float(residual[i]):.2e})"
             for i in range(n_layers) if not converged[i]]
    if stuck:
        warnings.warn(f"power iteration did not reach tol={tol} within max_iter={max_iter} for layers: "
                      + ", ".join(stuck), RuntimeWarning, stacklevel=3)
    return LayerSpectrum(names=names, top=top.numpy(), dominant=dominant.numpy(),
                         iterations=iterations.tolist(), converged=converged,
                         last_relative_change=change.tolist())
