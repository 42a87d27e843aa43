"""Label-agnostic plasticity baselines: representation ranks, active units, eNTK and Hessian energy
ranks."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.func import grad, jacrev, vmap

from avalanche_plugins.core.calls import (
    batch_loss,
    check_task_labels,
    eval_mode,
    iterate_batches,
    model_forward,
    split_params,
    stateless_forward,
    task_batches,
    task_groups,
)
from avalanche_plugins.core.checks import (
    check_estimator_inputs,
    check_finite_loss,
    check_inputs,
    check_int,
    check_no_recurrent,
    check_positive,
)
from avalanche_plugins.core.layers import discover_layers, example_input
from avalanche_plugins.core.reductions import mean_loss

__all__ = ["effective_rank", "energy_rank", "hidden_features", "representation_ranks",
           "active_unit_fraction", "entk_energy_rank", "hessian_energy_rank", "srank", "feature_rank",
           "dormant_unit_fraction", "average_weight_magnitude", "PLASTICITY_DIAGNOSTICS"]

#: The loss-of-plasticity literature's diagnostics of a network (label-agnostic), with the
#: direction in which each is read as "more plastic": +1 higher is more plastic, −1 lower is.
PLASTICITY_DIAGNOSTICS = {
    "effective_rank": +1,  # Roy & Vetterli (2007) entropy rank, as used by Dohare et al. (2024)
    "srank": +1,  # Kumar et al. (2021)
    "feature_rank": +1,  # Lyle et al. (2022)
    "active_units": +1,  # Dohare et al. (2024), Lyle et al. (2023)
    "dormant_units": -1,  # Sokar et al. (2023)
    "weight_magnitude": -1,  # Dohare et al. (2024)
}




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


def _check_fraction(name: str, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")


def srank(features: torch.Tensor, delta: float = 0.01) -> int:
    r"""Effective rank ``srank_δ`` of Kumar et al. (2021, "Implicit Under-Parameterization Inhibits
    Data-Efficient Deep Reinforcement Learning", ICLR), the rank measure of the loss-of-plasticity
    literature (Kumar et al. 2021; Lyle et al. 2022):

    .. math:: \operatorname{srank}_δ(Φ) = \min\Big\{k : \frac{\sum_{i\le k} σ_i(Φ)}{\sum_i σ_i(Φ)}
              \ge 1 - δ\Big\}

    over the singular values ``σ_1 ≥ σ_2 ≥ …`` of the ``(n, d)`` feature matrix Φ (not squared,
    unlike :func:`energy_rank`); δ = 0.01 as in the paper. Trailing dimensions are flattened; a
    zero matrix has srank 0.

    Example:
        >>> srank(torch.diag(torch.tensor([5.0, 4.0, 1.0, 0.0])))  # 9/10 < 0.99 ≤ 10/10
        3
        >>> srank(torch.diag(torch.tensor([100.0, 0.5])))  # 100/100.5 = 0.995 ≥ 0.99
        1
    """
    _check_fraction("delta", delta)
    sigma = torch.linalg.svdvals(_as_matrix(features)).sort(descending=True).values
    total = float(sigma.sum())
    if total == 0:
        return 0
    cumulative = sigma.cumsum(0) / total
    return min(int((cumulative < (1 - delta) * (1 - 1e-12)).sum()) + 1, sigma.numel())


def feature_rank(features: torch.Tensor, epsilon: float = 0.01) -> int:
    r"""Feature rank of Lyle et al. (2022, "Understanding and Preventing Capacity Loss in
    Reinforcement Learning", ICLR): the number of singular values of the ``(n, d)`` feature matrix,
    scaled by ``1/√n``, that exceed ``ε`` (0.01 as in the paper):

    .. math:: ρ(Φ) = \#\{σ ∈ \operatorname{spec}(Φ/\sqrt n) : σ > ε\}

    Unlike :func:`srank` it counts directions of non-negligible absolute size, so it falls when
    features shrink as well as when they collapse onto fewer directions.

    Example:
        >>> phi = torch.cat([torch.eye(3), torch.zeros(1, 3)])  # n = 4: singular values 1/2
        >>> feature_rank(phi), feature_rank(phi, epsilon=0.6), feature_rank(0.01 * phi)
        (3, 0, 0)
    """
    _check_fraction("epsilon", epsilon)
    matrix = _as_matrix(features)
    sigma = torch.linalg.svdvals(matrix / math.sqrt(matrix.shape[0]))
    return int((sigma > epsilon).sum())


def average_weight_magnitude(model: nn.Module, *, include_bias: bool = False) -> float:
    r"""Average weight magnitude, the loss-of-plasticity diagnostic of Dohare et al. (2024,
    "Loss of plasticity in deep continual learning", Nature): the mean absolute value of the
    network's weights,

    .. math:: \frac{1}{P}\sum_{i=1}^{P} |w_i|

    over the ``P`` entries of every trainable weight matrix / kernel (parameters with ≥ 2
    dimensions; ``include_bias=True`` adds the 1-d ones: biases and norm scales). Large weights go
    with lost plasticity, so lower reads as more plastic.

    Example:
        >>> net = nn.Linear(2, 2)
        >>> with torch.no_grad():
        ...     _ = net.weight.copy_(torch.tensor([[1.0, -3.0], [0.0, 2.0]]))
        >>> average_weight_magnitude(net)
        1.5
    """
    tensors = [p for p in model.parameters() if p.requires_grad and (include_bias or p.dim() >= 2)]
    if not tensors:
        raise ValueError("model has no trainable weights: the average weight magnitude is undefined")
    with torch.no_grad():
        total = sum(p.detach().abs().double().sum() for p in tensors)
        count = sum(p.numel() for p in tensors)
    return float(total) / count


def _unit_abs_means(model, inputs, task_labels, chunk_size) -> list[torch.Tensor]:
    """Per hidden layer, ``E_x |h_u(x)|`` of every unit ``u`` (conv: also over positions), float64."""
    hidden = _layers(model, inputs, task_labels)[:-1]
    feats = hidden_features(model, inputs, task_labels=task_labels, chunk_size=chunk_size)
    if not feats:
        raise ValueError("model has no hidden layer (only one layer): unit statistics are undefined")
    means = []
    for layer in hidden:
        h = feats[layer.name].abs().double()
        unit_dim = 1 if layer.kind == "conv" and h.dim() >= 3 else h.dim() - 1
        means.append(h.movedim(unit_dim, -1).reshape(-1, h.shape[unit_dim]).mean(dim=0))
    return means


def dormant_unit_fraction(model: nn.Module, inputs: torch.Tensor, *, tau: float = 0.025,
                          task_labels: torch.Tensor | None = None, chunk_size: int = 1024) -> float:
    r"""Fraction of τ-dormant hidden units (Sokar et al., 2023, "The Dormant Neuron Phenomenon in Deep
    Reinforcement Learning", ICML). Unit ``i`` of hidden layer ℓ (``H_ℓ`` units) has the score

    .. math:: s_i^\ell = \frac{\mathbb{E}_x |h_i^\ell(x)|}
                              {\frac{1}{H_\ell}\sum_{k} \mathbb{E}_x |h_k^\ell(x)|}

    and is τ-dormant when ``s_i^ℓ ≤ τ`` (τ = 0.025, the paper's value for its main results; τ = 0
    counts exactly-dead units). Expectations are over ``inputs`` (and spatial positions for conv
    channels); features are the post-activation ones of :func:`hidden_features`. A layer whose
    features are all zero has every unit dormant. Returns ``Σ_ℓ dormant_ℓ / Σ_ℓ H_ℓ``; lower reads
    as more plastic.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.zero_(); _ = net[0].bias.copy_(torch.tensor([1.0, 0.01, 0.0, 2.99]))
        >>> dormant_unit_fraction(net, torch.randn(5, 2))  # scores 1, 0.01, 0, 2.99
        0.5
    """
    check_estimator_inputs(model, inputs)
    check_inputs(inputs)
    check_positive("tau", tau, allow_zero=True)
    check_int("chunk_size", chunk_size)
    check_task_labels(task_labels, inputs.shape[0])
    dormant = total = 0
    for means in _unit_abs_means(model, inputs, task_labels, chunk_size):
        layer_mean = means.mean()
        scores = means / layer_mean if layer_mean > 0 else torch.zeros_like(means)
        dormant += int((scores <= tau).sum())
        total += means.numel()
    return dormant / total


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
    return list(discover_layers(model, example_input(model, inputs, task_labels)))


def hidden_features(model: nn.Module, inputs: torch.Tensor, *, task_labels: torch.Tensor | None = None,
                    chunk_size: int = 1024) -> dict[str, torch.Tensor]:
    """Post-activation features of every hidden layer, ``{layer name: (n, ...)}``.

    Hidden layers are the layers of :func:`avalanche_plugins.core.layers.discover_layers` except the last
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
    check_estimator_inputs(model, inputs)
    check_inputs(inputs)
    check_int("chunk_size", chunk_size)
    check_task_labels(task_labels, inputs.shape[0])
    layers = _layers(model, inputs, task_labels)
    hidden = layers[:-1]
    if not hidden:
        return {}
    modules = [layer.module for layer in layers]
    parts: list[list[torch.Tensor]] = [[] for _ in hidden]
    with eval_mode(model):
        for label, x, _, _ in task_batches(model, inputs, task_labels=task_labels):
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
    check_estimator_inputs(model, inputs)
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
    check_estimator_inputs(model, inputs)
    check_inputs(inputs)
    check_positive("threshold", threshold, allow_zero=True)
    check_task_labels(task_labels, inputs.shape[0])
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
    for label, x, _, _ in task_batches(model, inputs, task_labels=task_labels, chunk_size=chunk_size):

        def out_of(p, xi, label=label):
            return stateless_forward(model, {**consts, **p}, xi.unsqueeze(0), label)[0]

        jac = vmap(jacrev(out_of), in_dims=(None, 0))(params, x)  # {name: (m, *out_shape, *param_shape)}
        m = x.shape[0]
        with torch.no_grad():
            out = vmap(out_of, in_dims=(None, 0))(params, x)
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
    check_estimator_inputs(model, inputs)
    check_no_recurrent(model, "entk_energy_rank")
    check_inputs(inputs)
    _check_energy(energy)
    check_int("chunk_size", chunk_size)
    check_task_labels(task_labels, inputs.shape[0])
    params, consts = split_params(model)
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

    The energy rank is scale-free; the Hessian is that of the per-sample mean loss (a sum-reduced
    ``loss_fn`` divided by the sample count, as every readiness function does).

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
    check_estimator_inputs(model, inputs, targets, loss_fn=loss_fn, task_labels=task_labels)
    check_no_recurrent(model, "hessian_energy_rank")
    check_inputs(inputs, targets)
    _check_energy(energy)
    check_int("max_params", max_params)
    check_int("chunk_size", chunk_size)
    n = inputs.shape[0]
    check_task_labels(task_labels, n)
    loss_fn = mean_loss(loss_fn, "hessian_energy_rank", model=model, inputs=inputs, targets=targets,
                        task_labels=task_labels)
    params, consts = split_params(model)
    names = list(params)
    shapes = [params[k].shape for k in names]
    sizes = [params[k].numel() for k in names]
    n_params = sum(sizes)
    groups = task_groups(model, n, task_labels)
    with eval_mode(model):
        if n_params <= max_params:
            flat0 = torch.cat([params[k].reshape(-1) for k in names])
            hessian = torch.zeros(n_params, n_params, dtype=torch.float64, device=flat0.device)
            for label, x, y, _ in task_batches(model, inputs, targets, chunk_size=chunk_size, groups=groups):
                loss_of = batch_loss(model, loss_fn, consts, label)

                def loss_of_flat(flat, xb, yb, loss_of=loss_of):
                    pieces = torch.split(flat, sizes)
                    p = {k: v.view(shape) for k, v, shape in zip(names, pieces, shapes)}
                    return loss_of(p, xb, yb)

                check_finite_loss(loss_of_flat(flat0, x, y).detach(), "while computing the Hessian")
                hessian += jacrev(grad(loss_of_flat), chunk_size=256)(flat0, x, y).double() * x.shape[0]
            hessian = (hessian + hessian.T) / (2 * n)
            if not torch.isfinite(hessian).all():
                raise ValueError("the Hessian has non-finite values")
            return _energy_rank_from_squares(torch.linalg.eigvalsh(hessian).pow(2), energy)

        jac, outputs = _output_jacobian(model, params, consts, inputs, task_labels, chunk_size)
        ordered_targets = torch.cat([y for _, _, y, _ in task_batches(model, inputs, targets, groups=groups)], dim=0)
        out_shape = outputs.shape[1:]

        def output_loss(out, y):
            return loss_fn(out.unsqueeze(0), y.unsqueeze(0))

        def out_hessian(out, y):
            flat_hessian = jacrev(grad(lambda o: output_loss(o.view(out_shape), y)))
            return flat_hessian(out.reshape(-1))

        blocks = vmap(out_hessian)(outputs.detach(), ordered_targets).double()  # (n, C, C)
        evals, evecs = torch.linalg.eigh((blocks + blocks.transpose(1, 2)) / 2)
        roots = evecs @ torch.diag_embed(evals.clamp(min=0).sqrt()) @ evecs.transpose(1, 2)
        c = blocks.shape[1]
        scaled = torch.bmm(roots, jac.reshape(n, c, -1)).reshape(n * c, -1) / math.sqrt(n)
    if not torch.isfinite(scaled).all():
        raise ValueError("the Gauss–Newton factor has non-finite values")
    return _energy_rank_from_squares(_gram_eigenvalues(scaled).pow(2), energy)


