"""Per-layer curvature: the top eigenvalue of every layer's Hessian block.

For layer ℓ with parameters θ^(ℓ) (its weight and bias, from :mod:`avalanche_plugins.core.layers`),
``s_ℓ = λ_max(H_ℓℓ)`` where ``H_ℓℓ = ∂²L / ∂θ^(ℓ)∂θ^(ℓ)`` is the diagonal block of the Hessian of
the loss ``L = loss_fn(f(X), Y)`` of all the samples as ``loss_fn`` reduces them (the mean loss for
``reduction="mean"``, the sum for ``"sum"``: :mod:`avalanche_plugins.core.reductions`). "Layers
Matter" (Moser et al., 2026) bounds forgetting by ``½ Σ_ℓ s_ℓ ‖Δθ^(ℓ)‖²`` under a block-diagonal
Hessian, so ``s_ℓ`` is the natural per-layer regularisation strength.

Method (block Lanczos, all layers of a chunk at once): one random start vector per layer on its
own parameters, then symmetric Lanczos with full re-orthogonalisation (:func:`block_lanczos`)
for every layer of the chunk in lockstep. Layer ℓ's product ``H_ℓℓ v`` is the double backward of
the gradient of its own parameters only (the rest of the model held constant), summed over
minibatches with their weights in the full loss (their share of the samples for a mean-reduced
loss, 1 for a sum-reduced one), i.e. exactly the full-data block; the minibatches'
gradient graphs are kept across products while they fit in ``memory_mb``. (A ``vmap`` of the
model-wide Hessian-vector product over the layers' tangents forms the cross-layer blocks only
to throw them away: about 3× slower per product than kept per-layer graphs on the MLP and
BN-CNN of ``benchmarks.curvature_peers``.) A layer stops on a
residual bound, ``‖H_ℓℓ y − θ y‖ ≤ tol · |θ|`` for its top Ritz pair ``(θ, y)``, read off the
Lanczos recurrence without another product; then an eigenvalue lies within ``tol · |θ|`` of θ,
so ``tol`` is a relative accuracy. θ is the largest *algebraic* eigenvalue directly (a negative
dominant eigenvalue needs no second, shifted pass); the Ritz value of largest magnitude is
reported beside it as ``dominant``.

:func:`block_power_iteration` (PyHessian-style power iteration, the estimator before issue 32)
stays for callers of its own.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

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
from avalanche_plugins.core.reductions import loss_reduction

__all__ = ["LayerSpectrum", "GeometricFit", "PowerIteration", "Lanczos", "layer_top_eigenvalues",
           "block_power_iteration", "block_lanczos", "geometric_fit", "condition_number"]


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


class Lanczos(NamedTuple):
    """Per-vector outcome of :func:`block_lanczos` (CPU tensors of shape (K,))."""
    estimate: torch.Tensor  # float64, top Ritz value θ (largest algebraic eigenvalue estimate)
    dominant: torch.Tensor  # float64, the Ritz value of largest magnitude (top or bottom of the spectrum)
    iterations: torch.Tensor  # long, operator products (Lanczos steps) run
    change: torch.Tensor  # float64, relative change of θ over the last step (inf after one step)
    residual: torch.Tensor  # float64, relative residual ‖Hy − θy‖ / |θ| of the top Ritz pair (y, θ)


class _Packed:
    """Row bookkeeping of packed tangents: ``{name: tensor(*shape)}``, each name owned by one row
    (one operator) of K, so a row's vector is the tensors of the names it owns."""

    def __init__(self, owner: dict[str, int]):
        self.row = dict(owner)
        self.names = list(owner)
        self.k = max(owner.values()) + 1

    def active_names(self, active: torch.Tensor) -> list[str]:
        return [n for n in self.names if bool(active[self.row[n]])]

    def rows_of(self, names: list[str]) -> torch.Tensor:
        return torch.tensor([self.row[n] for n in names], dtype=torch.long)

    def dot(self, a: dict, b: dict, names: list[str]) -> torch.Tensor:
        """Per-row inner products over ``names`` -> (K,) float64 on the CPU."""
        parts = torch.stack([torch.vdot(a[n].flatten(), b[n].flatten()) for n in names]).double().cpu()
        return torch.zeros(self.k, dtype=torch.float64).index_add_(0, self.rows_of(names), parts)

    def scale(self, a: dict, values: torch.Tensor, names: list[str]) -> dict:
        """Row ``r``'s tensors of ``a`` times ``values[r]``."""
        return {n: a[n] * float(values[self.row[n]]) for n in names}

    def orthogonalise(self, w: dict, basis: dict, j: int, names: list[str]) -> None:
        """``w -= Q(Qᵀw)`` per row against the first ``j`` basis vectors, twice (classical
        Gram–Schmidt with one re-orthogonalisation: "twice is enough")."""
        rows = self.rows_of(names)
        for _ in range(2):
            parts = torch.stack([basis[n][:j].flatten(1) @ w[n].flatten() for n in names])  # (names, j)
            coef = torch.zeros(self.k, j, dtype=parts.dtype, device=parts.device).index_add_(
                0, rows.to(parts.device), parts)
            for n in names:
                w[n] -= (coef[self.row[n]] @ basis[n][:j].flatten(1)).view_as(w[n])


def _ritz(alpha: torch.Tensor, beta: torch.Tensor):
    """Eigenpairs of the tridiagonal Lanczos matrices ``T`` (diagonal ``alpha`` (K, j), off-diagonal
    ``beta`` (K, j-1), float64), batched."""
    t = torch.diag_embed(alpha) + torch.diag_embed(beta, 1) + torch.diag_embed(beta, -1)
    return torch.linalg.eigh(t)


def block_lanczos(hvp, start: dict, owner: dict[str, int], tol: float, max_iter: int, *,
                  krylov_dim: int = 40) -> Lanczos:
    """K symmetric Lanczos iterations run together, one per operator, with full re-orthogonalisation.

    Row ``r``'s vector is the tensors of the names with ``owner[name] == r``; its operator ``H_r``
    acts on those names only. After ``j`` steps the orthonormal Krylov basis ``Q_j`` of
    ``span{q, H_r q, …, H_r^{j-1} q}`` and the tridiagonal ``T_j = Q_jᵀ H_r Q_j`` give the Ritz
    pairs ``(θ, y = Q_j s)`` with the residual known without another product:

    .. math:: \\|H_r y - θ y\\| = β_j\\,|s_j|,

    so a row stops when ``β_j |s_j| ≤ tol · |θ|`` for the top Ritz value θ; there is then an
    eigenvalue within ``tol · |θ|`` of θ, and θ is the largest algebraic one (negative dominants
    need no shifted second pass). A row also stops when ``β_j`` vanishes (to working precision:
    its Krylov space is invariant, the Ritz values are eigenvalues). After ``krylov_dim`` steps a
    row restarts from its top Ritz vector, so the basis holds at most ``krylov_dim`` vectors.

    Args:
        hvp: ``hvp(v, rows) -> Hv`` for the packed tangents ``v`` of the still-active rows
            (``rows``, a CPU index tensor; ``v`` holds the names those rows own).
        start: ``{name: tensor}`` start vectors (normalised per row here).
        owner: ``{name: row}``, rows 0..K-1.
        tol: relative residual at which a row stops.
        max_iter: operator products per row at most.
        krylov_dim: basis vectors kept before a restart.

    Example:
        >>> a = torch.diag(torch.tensor([3.0, 1.0, -5.0]))
        >>> out = block_lanczos(lambda v, rows: {"w": a @ v["w"]}, {"w": torch.ones(3)}, {"w": 0}, 1e-6, 50)
        >>> round(float(out.estimate[0]), 4), round(float(out.dominant[0]), 4)
        (3.0, -5.0)
    """
    packed = _Packed(owner)
    k, device = packed.k, next(iter(start.values())).device
    steps = max(1, min(krylov_dim, max_iter))
    basis = {n: torch.empty((steps, *t.shape), dtype=t.dtype, device=device) for n, t in start.items()}
    q = packed.scale(start, packed.dot(start, start, packed.names).rsqrt(), packed.names)
    estimate, dominant = torch.zeros(k, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
    change, residual = torch.full((k,), float("inf"), dtype=torch.float64), torch.full((k,), float("inf"),
                                                                                        dtype=torch.float64)
    iterations, active = torch.zeros(k, dtype=torch.long), torch.ones(k, dtype=torch.bool)
    alpha, beta = torch.zeros(k, steps, dtype=torch.float64), torch.zeros(k, steps, dtype=torch.float64)
    j = 0
    for _ in range(max_iter):
        rows, names = active.nonzero().flatten(), packed.active_names(active)
        for n in names:
            basis[n][j] = q[n]
        w = hvp({n: q[n] for n in names}, rows)
        alpha[:, j] = packed.dot(q, w, names)
        packed.orthogonalise(w, basis, j + 1, names)
        beta[:, j] = packed.dot(w, w, names).sqrt()
        values, vectors = _ritz(alpha[rows, :j + 1], beta[rows, :j])
        top, last = values[:, -1], vectors[:, -1, -1]
        iterations[rows] += 1
        change[rows] = torch.where(iterations[rows] > 1, (top - estimate[rows]).abs()
                                   / estimate[rows].abs().clamp_min(1e-30), change[rows])
        estimate[rows] = top
        dominant[rows] = torch.where(values[:, 0].abs() > top.abs(), values[:, 0], top)
        scale = values.abs().amax(1)
        residual[rows] = beta[rows, j] * last.abs() / top.abs().clamp_min(1e-30)
        breakdown = beta[rows, j] <= 100 * torch.finfo(next(iter(w.values())).dtype).eps * scale
        residual[rows] = torch.where(breakdown, torch.zeros_like(top), residual[rows])
        active[rows[(residual[rows] <= tol) | breakdown]] = False
        if not active.any():
            break
        q, j = _next_vector(packed, active, w, beta[:, j], basis, vectors, rows, j, steps)
    return Lanczos(estimate, dominant, iterations, change, residual)


def _next_vector(packed: _Packed, active, w, beta, basis, vectors, rows, j, steps):
    """The next Lanczos vector ``w / β`` of every active row, or, when the basis is full, its top
    Ritz vector ``Q s`` (an explicit restart); and the next basis position."""
    names = packed.active_names(active)
    if j + 1 < steps:
        return packed.scale(w, 1.0 / beta, names), j + 1
    position = {int(r): i for i, r in enumerate(rows)}
    q = {n: torch.tensordot(vectors[position[packed.row[n]], :, -1].to(basis[n]), basis[n][:j + 1], dims=1)
         for n in names}
    return packed.scale(q, packed.dot(q, q, names).rsqrt(), names), 0


class _BlockProduct:
    """``v ↦ H_ℓℓ v`` for one layer: the double backward of the gradient of the layer's own
    parameters (the rest of the model held constant, so no cross-layer block is formed), summed
    over the minibatches with their weights in the full loss. The gradient graph of every minibatch is kept
    across products when all of them fit in ``budget`` bytes (measured on the first minibatch:
    the bytes autograd saves), otherwise rebuilt for each product."""

    def __init__(self, model, loss_fn, state: dict, names: list[str], batches: list, budget: float):
        self.params = {n: state[n].detach().requires_grad_() for n in names}
        self.loss_of = batch_loss(model, loss_fn, {k: v for k, v in state.items() if k not in self.params})
        self.batches = batches
        saved = [0]

        def pack(t):
            saved[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            first = self._gradient(*batches[0][:3])
        self.bytes = saved[0] * len(batches)
        self.graphs = [first] + [self._gradient(*b[:3]) for b in batches[1:]] if self.bytes <= budget else None

    def _gradient(self, x, y, t) -> tuple:
        """The gradient of the minibatch loss in the layer's parameters, with its graph (None
        entries where the loss does not depend on a parameter, e.g. another task's head)."""
        with torch.enable_grad():
            loss = self.loss_of(self.params, x, y, t)
            if not loss.requires_grad:
                return (None,) * len(self.params)
            return torch.autograd.grad(loss, list(self.params.values()), create_graph=True, allow_unused=True)

    def __call__(self, v: dict) -> dict:
        total = {n: torch.zeros_like(p) for n, p in self.params.items()}
        tangent = [v[n] for n in self.params]
        for i, (x, y, t, weight) in enumerate(self.batches):
            gradient = self._gradient(x, y, t) if self.graphs is None else self.graphs[i]
            used = [k for k, g in enumerate(gradient) if g is not None and g.requires_grad]
            if not used:  # the loss is linear (or constant) in these parameters: no curvature
                continue
            with torch.enable_grad():
                hv = torch.autograd.grad([gradient[k] for k in used], list(self.params.values()),
                                         grad_outputs=[tangent[k] for k in used],
                                         retain_graph=self.graphs is not None, allow_unused=True)
            for n, h in zip(self.params, hv):
                if h is not None:
                    total[n] += weight * h.detach()
        return total


class _LayerBlocks:
    """The diagonal Hessian blocks ``H_ℓℓ`` of the loss of all samples, one :class:`_BlockProduct`
    per layer.

    The data are cut into minibatches of one task each (an int label: Avalanche's single-task
    path), weighted by :func:`~avalanche_plugins.core.calls.chunk_weight` for the loss's
    ``reduction`` (their share of the samples for ``"mean"``, 1 for ``"sum"``), so that the weighted
    sum of their products is the full-data block product.
    """

    def __init__(self, model, loss_fn, inputs, targets, task_labels, layer_map, chunk_size, memory_mb,
                 reduction="mean"):
        self.model, self.loss_fn, self.layer_map = model, loss_fn, layer_map
        self.budget = memory_mb * 2**20
        self.state = {k: v.detach() for k, v in model.named_parameters()}
        self.state.update({k: v.detach() for k, v in model.named_buffers()})
        self.device = next(iter(self.state.values())).device
        self.batches = [(xs, ys, label, weight)
                        for label, xs, ys, weight in task_batches(model, inputs, targets, task_labels, chunk_size,
                                                                  reduction=reduction)]
        with torch.no_grad():
            for x, y, t, _ in self.batches[:1]:
                check_finite_loss(batch_loss(model, loss_fn, {})(self.state, x, y, t), "at the parameters being measured")

    def products(self, layer_ids: list[int]) -> list[_BlockProduct]:
        """The layers' products, their gradient graphs kept while the group's fit in the budget."""
        out, left = [], self.budget
        for layer in layer_ids:
            product = _BlockProduct(self.model, self.loss_fn, self.state, list(self.layer_map[layer].params),
                                    self.batches, left)
            left -= product.bytes if product.graphs is not None else 0
            out.append(product)
        return out

    def start_vectors(self, layer_ids: list[int], seed: int) -> dict:
        """Random vectors on each layer's own parameters (packed), from a CPU generator per
        (seed, layer): the same on every device and whatever the layers' grouping."""
        v = {}
        for layer in layer_ids:
            generator = torch.Generator().manual_seed((seed * 1_000_003 + layer) * 2)
            for name in self.layer_map[layer].params:
                p = self.state[name]
                v[name] = torch.randn(p.shape, generator=generator, dtype=p.dtype).to(self.device)
        return v

    def lanczos(self, layer_ids: list[int], seed: int, tol: float, max_iter: int) -> Lanczos:
        """:func:`block_lanczos` on the blocks of the layers ``layer_ids``, all at once."""
        owner = {n: i for i, layer in enumerate(layer_ids) for n in self.layer_map[layer].params}
        products = self.products(layer_ids)

        def hvp(v: dict, rows: torch.Tensor) -> dict:
            out = {}
            for r in rows.tolist():
                out.update(products[r]({n: v[n] for n in products[r].params}))
            return out

        return block_lanczos(hvp, self.start_vectors(layer_ids, seed), owner, tol, max_iter)


def layer_top_eigenvalues(model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor, *,
                          max_iter: int = 100, tol: float = 1e-3, chunk_size: int | None = 32,
                          layer_chunk_size: int | None = 4, memory_mb: float = 1024.0, seed: int = 0,
                          task_labels: torch.Tensor | None = None, layer_map: LayerMap | None = None) -> LayerSpectrum:
    """Top eigenvalue ``s_ℓ`` of every layer's Hessian block, by block Lanczos.

    .. math:: s_ℓ = \\max_{\\|v\\|=1} v^\\top H_{ℓℓ} v, \\qquad H_{ℓℓ} = \\nabla^2_{θ^{(ℓ)}} L,
              \\qquad L = c \\sum_{i=1}^N ℓ_i, \\quad c = \\tfrac1N \\ (\\text{mean}), \\ 1 \\ (\\text{sum})

    ``L = loss_fn(f(X), Y)`` is the loss of all the samples as ``loss_fn`` reduces them
    (``ℓ_i`` its loss of sample ``i`` alone): the Hessian blocks of the mean loss for a
    mean-reduced ``loss_fn``, of the sum (``N`` times larger) for a sum-reduced one, whatever
    ``chunk_size`` (:mod:`avalanche_plugins.core.reductions`).

    Args:
        model: any model of the layer map (evaluated in eval mode; its mode is restored).
        loss_fn: the loss ``loss_fn(outputs, targets)``, mean- or sum-reduced over the samples
            (e.g. ``nn.CrossEntropyLoss()``); a plain callable is probed on two samples
            (:func:`~avalanche_plugins.core.reductions.loss_reduction`).
        inputs, targets: the data defining the loss; ``task_labels`` for multi-task models.
        max_iter: Hessian-vector products per layer at most (a warning names the layers that did
            not converge).
        tol: relative accuracy: a layer stops when its top Ritz pair ``(θ, y)`` has
            ``‖H_ℓℓ y − θ y‖ ≤ tol · |θ|``, so an eigenvalue lies within ``tol · |θ|`` of ``s_ℓ``.
        chunk_size: split the data into minibatches (products summed, weighted by their share of
            the samples for a mean-reduced loss, by 1 for a sum-reduced one; the result does not
            depend on it; None: all samples at once).
        layer_chunk_size: layers iterated together (None: all at once); their Krylov bases (at
            most 40 vectors of the layer's size each) are held at a time. Memory grows with
            ``chunk_size`` (activations) and ``layer_chunk_size × parameters``, never with the
            number of layers; with the samples only through the kept gradient graphs (``memory_mb``).
        memory_mb: budget for the gradient graphs kept across products (all minibatches of a
            layer, for as many layers of a chunk as fit); a layer whose graphs do not fit rebuilds
            them for every product (about twice the time, memory of one minibatch).
        seed: seeds the random start vectors (one CPU generator per layer: the result does not
            depend on ``layer_chunk_size`` or the device, up to float summation order).
        layer_map: reuse a :func:`discover_layers` result.

    Raises:
        ValueError: empty data, bad ``max_iter``/``tol``/``chunk_size``, a model without layers,
            a non-finite loss, or a loss whose reduction over the samples is ``"none"`` or cannot
            be read.

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
    check_positive("memory_mb", memory_mb, allow_zero=True)
    for name, value in (("chunk_size", chunk_size), ("layer_chunk_size", layer_chunk_size)):
        if value is not None:
            check_int(name, value)
    reduction = loss_reduction(loss_fn, "layer_top_eigenvalues", model=model, inputs=inputs, targets=targets,
                               task_labels=task_labels)
    if layer_map is None:
        layer_map = discover_layers(model, example_input(model, inputs, task_labels))

    with eval_mode(model), math_attention():  # second derivatives through attention
        blocks = _LayerBlocks(model, loss_fn, inputs, targets, task_labels, layer_map, chunk_size, memory_mb,
                              reduction)
        return _lanczos(blocks, layer_map, max_iter, tol, layer_chunk_size, seed)


def _lanczos(blocks: _LayerBlocks, layer_map, max_iter, tol, layer_chunk_size, seed) -> LayerSpectrum:
    """``s_ℓ`` of every layer: one block Lanczos per group of ``layer_chunk_size`` layers."""
    n_layers = len(layer_map)
    # layers in groups of layer_chunk_size: the tangents and Krylov bases of one group are held at a time
    top, dominant = torch.zeros(n_layers, dtype=torch.float64), torch.zeros(n_layers, dtype=torch.float64)
    iterations = torch.zeros(n_layers, dtype=torch.long)
    change, residual = torch.zeros(n_layers, dtype=torch.float64), torch.zeros(n_layers, dtype=torch.float64)
    for group in torch.arange(n_layers).split(layer_chunk_size or n_layers):
        top[group], dominant[group], iterations[group], change[group], residual[group] = \
            blocks.lanczos(group.tolist(), seed, tol, max_iter)
    return _spectrum(layer_map.names, top, dominant, iterations, change, residual, tol, max_iter)


def _spectrum(names, top, dominant, iterations, change, residual, tol, max_iter) -> LayerSpectrum:
    """The :class:`LayerSpectrum`, warning about the layers that did not converge."""
    converged = [bool(r <= tol) for r in residual]
    stuck = [f"{names[i]} (last relative change {float(change[i]):.2e}, residual {float(residual[i]):.2e})"
             for i in range(len(names)) if not converged[i]]
    if stuck:
        warnings.warn(f"Lanczos did not reach tol={tol} within max_iter={max_iter} for layers: "
                      + ", ".join(stuck), RuntimeWarning, stacklevel=4)
    return LayerSpectrum(names=names, top=top.numpy(), dominant=dominant.numpy(),
                         iterations=iterations.tolist(), converged=converged,
                         last_relative_change=change.tolist())
