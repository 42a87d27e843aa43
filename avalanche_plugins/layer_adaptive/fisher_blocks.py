"""Per-layer curvature that scales: the top eigenvalue of every layer's Fisher (Gauss–Newton) block.

For a classifier trained with cross-entropy the Hessian of the mean loss is
``H = G + R`` with the generalised Gauss–Newton matrix ``G = F`` (the true Fisher, for softmax
outputs) and a residual ``R`` that vanishes where the model fits its targets. The Fisher block of
layer ℓ is an average of outer products of per-sample gradients,

.. math::

    F_{ℓℓ} = \\frac{1}{N}\\sum_{i=1}^{N} g_i^{(ℓ)} g_i^{(ℓ)\\top},\\qquad
    g_i^{(ℓ)} = \\nabla_{θ^{(ℓ)}} \\big(-\\log p_θ(\\hat y_i \\mid x_i)\\big),\\quad
    \\hat y_i \\sim p_θ(\\cdot \\mid x_i),

so with ``M_ℓ`` the ``N × P_ℓ`` matrix of per-sample gradients its non-zero eigenvalues are those of
the small Gram matrix ``K_ℓ = M_ℓ M_ℓᵀ / N`` (``N × N``): one symmetric eigendecomposition, no
iteration and no convergence question. One ``vmap``-ed per-sample-gradient pass serves every
layer at once; layers are grouped so that the stored gradients of a group fit in ``memory_mb``
(more groups, more passes, bounded memory). A ``Linear`` layer on ``(samples, features)`` inputs
needs no per-sample gradients (with sampled labels): sample ``i``'s gradient is ``δ_i a_iᵀ``, so
``K_ℓ = ((ΔΔᵀ) ⊙ (AAᵀ) + ΔΔᵀ) / N`` from its inputs ``A`` and output gradients ``Δ`` of ordinary
batched backward passes; a ``Conv2d`` on a small map (a ResNet's last stage, whose per-sample
gradients are the largest) likewise from its input patches and output gradients, summed over
positions, wherever that costs fewer multiply-adds (``_conv_pays``).

**Small-sample bias.** With ``P_ℓ ≫ N`` the per-sample gradients are nearly orthogonal and
``λ_max(K_ℓ)`` is dominated by the largest single ``‖g_i‖² / N`` — each sample's product with
itself, not curvature shared across samples. On a trained MLP at N = 64 it overshoots the
population value five-fold, by a different factor in every layer. The default (``debias=True``)
drops those self-products:

.. math:: s_ℓ = \\frac{N}{N-1}\\,λ_{\\max}\\big(K_ℓ - \\operatorname{diag} K_ℓ\\big),

only products of distinct samples, as in a U-statistic. It is exact for a rank-one block whose
per-sample gradients have equal norms (``g_i = ±a u``: ``s_ℓ = a²``), zero for orthogonal
gradients (pure self-products), never negative (a zero-diagonal matrix has trace 0), and its
agreement with the exact Hessian blocks is measured in ``docs/RESULTS.md``. ``debias=False``
gives the plain ``λ_max(K_ℓ)``.

``labels="sampled"`` (default) draws ``ŷ_i`` from the model's own predictive distribution, an
unbiased Monte-Carlo estimate of the true Fisher (= Gauss–Newton) block; ``labels="true"`` uses the
data labels (the *empirical* Fisher, defined for any per-sample loss). ``labels="expected"`` takes
the expectation over ``ŷ`` exactly: with ``p_ic = p_θ(c | x_i)`` and ``g_ic`` the gradient of
``−log p_θ(c | x_i)``,

.. math:: F_{ℓℓ} = \\frac{1}{N}\\sum_{i=1}^{N}\\sum_{c=1}^{C} p_{ic}\\, g_{ic}^{(ℓ)} g_{ic}^{(ℓ)\\top},

the generalised Gauss–Newton block of softmax cross-entropy, from the ``NC × NC`` Gram of the
rows ``√p_ic g_ic`` (``C`` times the gradients of ``"sampled"``: for a few classes); ``debias``
then drops the products of each sample's own ``C`` rows with each other.

**Reductions.** The ``1/N`` above is that of a mean-reduced ``loss_fn``: the blocks are those of
the loss as ``loss_fn`` reduces it over the samples, ``L = c Σ_i ℓ_i``, so a sum-reduced loss
(``c = 1``) gives ``N`` times the values, whatever ``chunk_size``
(:mod:`avalanche_plugins.core.reductions`). ``"sampled"`` and ``"expected"`` need ``(samples,
classes)`` logits (one label per sample); ``"true"`` takes any output shape.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import grad, vmap

from avalanche_plugins.core.calls import (
    eval_mode,
    iterate_batches,
    model_forward,
    sample_loss,
    task_groups,
)
from avalanche_plugins.core.checks import (
    check_choice,
    check_estimator_inputs,
    check_finite_loss,
    check_inputs,
    check_int,
    check_positive,
)
from avalanche_plugins.core.layers import LayerMap, discover_layers, example_input
from avalanche_plugins.core.reductions import loss_reduction
from avalanche_plugins.layer_adaptive.hessian import LayerSpectrum, block_lanczos

__all__ = ["FISHER_LABELS", "layer_fisher_eigenvalues"]

FISHER_LABELS = ("sampled", "true", "expected")


def layer_fisher_eigenvalues(model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor, *,
                             labels: str = "sampled", debias: bool = True, chunk_size: int = 16,
                             memory_mb: float = 1024.0, seed: int = 0, task_labels: torch.Tensor | None = None,
                             layer_map: LayerMap | None = None) -> LayerSpectrum:
    """Top eigenvalue of every layer's Fisher block, exactly, from the Gram matrix of per-sample gradients.

    .. math:: s_ℓ = \\frac{N}{N-1} λ_{\\max}\\big(K_ℓ - \\operatorname{diag} K_ℓ\\big),\\qquad
              K_ℓ = \\frac{1}{N} M_ℓ M_ℓ^\\top,\\quad (M_ℓ)_{i\\cdot} = g_i^{(ℓ)}

    (``debias=False``: ``s_ℓ = λ_max(K_ℓ) = λ_max(M_ℓᵀ M_ℓ / N)``, the top eigenvalue of the sample
    Fisher block itself.) These are for a mean-reduced ``loss_fn``; for a sum-reduced one, the
    blocks of the summed loss, ``N`` times larger (module docstring).

    Args:
        model: any model of the layer map (evaluated in eval mode; its mode is restored).
            Recurrent layers (``nn.LSTM``/``nn.GRU``) are supported: where ``vmap`` has no rule for
            their kernels, the per-sample gradients are taken one sample at a time (same values).
        loss_fn: the training loss. ``labels="sampled"`` needs ``nn.CrossEntropyLoss`` (the
            model's likelihood is then the softmax; ``loss_fn`` sets only the scale, through its
            reduction); ``labels="true"`` applies ``loss_fn`` to one sample at a time, so any
            mean- or sum-reduced loss works (a plain callable is probed on two samples).
        inputs, targets: the data; ``task_labels`` for multi-task models.
        labels: ``"sampled"`` (Monte-Carlo true Fisher = Gauss–Newton), ``"true"`` (empirical
            Fisher) or ``"expected"`` (the Gauss–Newton block exactly: every class, weighted by its
            probability; ``C`` times the cost and memory of ``"sampled"``).
        debias: drop each sample's product with itself (see the module docstring); needs N >= 2.
        chunk_size: samples per ``vmap``-ed per-sample-gradient call (bounds activation memory).
        memory_mb: budget for the stored per-sample gradients of one group of layers; a single
            layer larger than the budget forms a group of its own.
        seed: seeds the sampled labels.
        layer_map: reuse a :func:`~avalanche_plugins.core.layers.discover_layers` result.

    Raises:
        ValueError: bad ``labels``/``chunk_size``/``memory_mb``/``seed``, ``labels="sampled"``
            with a loss other than cross-entropy or logits other than ``(samples, classes)``,
            empty or non-finite data, a non-finite gradient, or a loss whose reduction over the
            samples is ``"none"`` or cannot be read.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        >>> x, y = torch.randn(32, 3), torch.randint(0, 2, (32,))
        >>> spec = layer_fisher_eigenvalues(net, nn.CrossEntropyLoss(), x, y)
        >>> spec.names, spec.method, bool((spec.top > 0).all())
        (['0', '2'], 'fisher', True)
    """
    check_estimator_inputs(model, inputs, targets, loss_fn=loss_fn, task_labels=task_labels)
    check_inputs(inputs, targets)
    check_choice("labels", labels, FISHER_LABELS)
    check_int("chunk_size", chunk_size)
    check_positive("memory_mb", memory_mb)
    check_int("seed", seed, minimum=0)
    if not isinstance(debias, bool):
        raise ValueError(f"debias must be a bool, got {debias!r}")
    if debias and inputs.shape[0] < 2:
        raise ValueError(f"debias=True needs at least 2 samples (it drops each sample's self-product), got "
                         f"{inputs.shape[0]}")
    if labels != "true" and not isinstance(loss_fn, nn.CrossEntropyLoss):
        raise ValueError(f"labels={labels!r} takes labels from a softmax and needs nn.CrossEntropyLoss, got "
                         f"{type(loss_fn).__name__}; use labels='true' (empirical Fisher) or the exact "
                         "Hessian (method='hessian')")
    # model labels use loss_fn for its scale only: class weights do not enter the likelihood's Fisher
    reduction = loss_reduction(loss_fn, "layer_fisher_eigenvalues", model=model, inputs=inputs, targets=targets,
                               task_labels=task_labels, decomposable=labels == "true")
    if layer_map is None:
        layer_map = discover_layers(model, example_input(model, inputs, task_labels))

    with eval_mode(model):
        rows = _Rows.of(model, inputs, targets, task_labels, labels, chunk_size, seed)
        top = np.zeros(len(layer_map))
        # Linear layers on (samples, features) inputs: the Gram from activations and output
        # gradients of batched passes (model labels: the loss is a plain sum over samples)
        grams = _linear_layer_grams(model, rows.inputs, rows.targets, rows.groups, layer_map, chunk_size) \
            if labels != "true" else {}
        for name, (a, delta, bias) in grams.items():
            top[layer_map[name].index] = _linear_top_eigenvalue(a, rows.scale(delta), bias, rows=rows, debias=debias)
        # convolutions on small maps (sampled labels: one row per sample), the same way
        conv_grams = _conv_layer_grams(model, rows.inputs, rows.targets, rows.groups, layer_map, chunk_size) \
            if labels == "sampled" else {}
        done = set(grams) | set(conv_grams)
        for name in list(conv_grams):
            top[layer_map[name].index] = _top_eigenvalue(conv_grams.pop(name), rows=rows, debias=debias)
        rest = [layer for layer in layer_map if layer.name not in done]
        for layer_group in _layer_groups(rest, rows.inputs.shape[0], memory_mb):
            gradients = _per_sample_gradients(model, loss_fn, rows.inputs, rows.targets, rows.groups, layer_group,
                                              chunk_size, sampled=labels != "true")
            for layer in layer_group:  # each layer's gradients freed once its Gram is formed
                top[layer.index] = _top_gram_eigenvalue([rows.scale(gradients.pop(k)) for k in layer.params],
                                                        rows=rows, debias=debias)
    if reduction == "sum":  # the blocks of Σ_i ℓ_i, not of their mean
        top *= inputs.shape[0]
    n = len(layer_map)
    return LayerSpectrum(names=layer_map.names, top=top, dominant=top.copy(), iterations=[1] * n,
                         converged=[True] * n, last_relative_change=[0.0] * n, method="fisher")


class _Rows:
    """The rows whose per-row gradients form the Gram: one per sample (``"true"``/``"sampled"``
    labels), or ``C`` per sample (``"expected"``: every class, weighted by ``√p_ic``). ``sample``
    maps a row to its sample, ``n`` is the number of samples (the Gram's ``1/N``)."""

    def __init__(self, inputs, targets, groups, weights, sample, n):
        self.inputs, self.targets, self.groups = inputs, targets, groups
        self.weights, self.sample, self.n = weights, sample, n

    @classmethod
    def of(cls, model, inputs, targets, task_labels, labels, chunk_size, seed) -> _Rows:
        n = inputs.shape[0]
        groups = task_groups(model, n, task_labels)
        if labels == "true":
            return cls(inputs, targets, groups, None, None, n)
        if labels == "sampled":
            return cls(inputs, _sample_labels(model, inputs, groups, chunk_size, seed), groups, None, None, n)
        return cls._expected(model, inputs, task_labels, groups, chunk_size)

    @classmethod
    def _expected(cls, model, inputs, task_labels, groups, chunk_size) -> _Rows:
        """Each sample repeated once per class of its task's output, target the class, weight ``√p``."""
        parts = []
        for label, index in groups:
            rows = torch.arange(inputs.shape[0], device=inputs.device) if index is None else index
            probs = torch.cat([_probabilities(model, inputs[rows[s]], label) for s in iterate_batches(len(rows),
                                                                                                        chunk_size)])
            c = probs.shape[1]
            parts.append((rows.repeat_interleave(c), torch.arange(c, device=inputs.device).repeat(len(rows)),
                          probs.flatten().sqrt()))
        sample, targets, weights = (torch.cat(t) for t in zip(*parts))
        labels = None if task_labels is None else task_labels.reshape(-1).to(inputs.device)[sample]
        expanded = inputs[sample]
        return cls(expanded, targets, task_groups(model, expanded.shape[0], labels), weights, sample,
                   inputs.shape[0])

    def scale(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows times their weights ``√p_ic`` (unchanged without weights)."""
        if self.weights is None:
            return rows
        return rows * self.weights.to(rows).view(-1, *[1] * (rows.dim() - 1))

    def input_gram(self, a: torch.Tensor) -> torch.Tensor:
        """``AAᵀ`` of a layer's per-row inputs; a sample's ``C`` rows share their input, so with
        ``"expected"`` labels it is the ``N × N`` Gram of the samples' inputs, indexed."""
        if self.sample is None:
            return a @ a.T
        sample = self.sample.to(a.device)
        unique = torch.zeros(self.n, a.shape[1], dtype=a.dtype, device=a.device).index_copy_(0, sample, a)
        return (unique @ unique.T)[sample][:, sample]

    def hollow(self, gram: torch.Tensor) -> torch.Tensor:
        """``gram`` without the products of a sample's rows with each other, times ``N/(N-1)``."""
        if self.sample is None:
            own = torch.eye(gram.shape[0], dtype=torch.bool, device=gram.device)
        else:
            sample = self.sample.to(gram.device)
            own = sample[:, None] == sample[None, :]
        return gram.masked_fill(own, 0.0) * (self.n / (self.n - 1))


def _check_logits(logits: torch.Tensor, labels: str) -> None:
    """Model labels need one class per sample: ``(samples, classes)`` logits."""
    if logits.dim() != 2:
        raise ValueError(f"layer_fisher_eigenvalues(labels={labels!r}) takes labels from a softmax over the last "
                         f"dimension and needs (samples, classes) logits, but the model outputs "
                         f"{tuple(logits.shape)}; use labels='true' (the empirical Fisher blocks, any output shape) "
                         "or the exact Hessian (method='hessian')")


def _probabilities(model, x, label) -> torch.Tensor:
    """``softmax(f(x))`` in float64, no gradient."""
    with torch.no_grad():
        logits = model_forward(model, x, label)
        _check_logits(logits, "expected")
        check_finite_loss(logits.sum(), "(model outputs) while weighting classes for the Fisher")
        return torch.softmax(logits.double(), dim=-1)


def _sample_labels(model, inputs, groups, chunk_size, seed) -> torch.Tensor:
    """``ŷ_i ~ softmax(f(x_i))``, drawn with a CPU generator (the same labels on every device)."""
    generator = torch.Generator().manual_seed(seed)
    sampled = torch.empty(inputs.shape[0], dtype=torch.long)
    with torch.no_grad():
        for label, index in groups:
            rows = torch.arange(inputs.shape[0]) if index is None else index.cpu()
            for s in iterate_batches(len(rows), chunk_size):
                logits = model_forward(model, inputs[rows[s].to(inputs.device)], label)
                _check_logits(logits, "sampled")
                check_finite_loss(logits.sum(), "(model outputs) while sampling labels for the Fisher")
                probs = torch.softmax(logits.double(), dim=-1).cpu()
                sampled[rows[s]] = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return sampled.to(inputs.device)


def _linear_layer_grams(model, inputs, targets, groups, layer_map, chunk_size) -> dict[str, tuple]:
    """``{layer name: (inputs A, output gradients Δ, has bias)}`` (float64), from which
    :func:`_linear_top_eigenvalue` gets ``M Mᵀ``, for every ``nn.Linear`` layer whose own parameters
    are its weight (and bias) and whose input is ``(samples, features)``, without per-sample
    gradients: sample ``i``'s weight gradient is ``δ_i a_iᵀ`` (input ``a_i``, output gradient ``δ_i``
    of the summed cross-entropy of the sampled labels; the samples are independent in eval
    mode), so ``⟨g_i, g_j⟩ = (δ_i·δ_j)(a_i·a_j) + δ_i·δ_j`` (the last term for the bias):
    ``N²·(fan_in + fan_out)`` multiply-adds instead of ``N·fan_in·fan_out``. Other layers are
    left out (per-sample gradients)."""
    candidates = {layer.name: layer for layer in layer_map if isinstance(layer.module, nn.Linear)
                  and _owns_its_parameters(layer)}
    # token / sequence inputs: positions mix in the Gram
    captured = _inputs_and_output_gradients(model, inputs, targets, groups, candidates, chunk_size,
                                            accept=lambda module, a, out: a.dim() == 2)
    return {name: (a.double(), delta.double(), candidates[name].module.bias is not None)
            for name, (a, delta) in captured.items()}


def _owns_its_parameters(layer) -> bool:
    """The layer's parameters in the layer map are exactly its module's weight (and bias)."""
    return {id(p) for p in layer.params.values()} == {id(p) for p in layer.module.parameters()}


def _conv_pays(module: nn.Module, a: torch.Tensor, out: torch.Tensor) -> bool:
    """A plain ``Conv2d`` (zero padding, one group) whose Gram from activations costs fewer
    multiply-adds per sample pair than from per-sample gradients: ``T²(K + C) < K·C`` with ``T``
    output positions, ``K`` = fan-in, ``C`` output channels (the late, small-map convolutions of a
    ResNet, whose per-sample gradients are the largest)."""
    if a.dim() != 4 or module.groups != 1 or module.padding_mode != "zeros" or isinstance(module.padding, str):
        return False
    positions, fan_in = out.shape[2] * out.shape[3], module.weight[0].numel()
    return positions**2 * (fan_in + module.out_channels) < fan_in * module.out_channels


def _conv_layer_grams(model, inputs, targets, groups, layer_map, chunk_size) -> dict[str, torch.Tensor]:
    """``{layer name: M Mᵀ}`` (float64 ``N × N``) of the ``Conv2d`` layers where it pays
    (:func:`_conv_pays`), without per-sample gradients. Sample ``i``'s weight gradient is
    ``Σ_t δ_{it} u_{it}ᵀ`` over output positions ``t`` (``u_{it}`` the input patch, ``δ_{it}`` the output
    gradient of the summed cross-entropy of the sampled labels), so

    .. math:: ⟨g_i, g_j⟩ = \\sum_{t,s} (u_{it}·u_{js})(δ_{it}·δ_{js}) + (\\textstyle\\sum_t δ_{it})·(\\sum_s δ_{js}),

    the last term for the bias. Only the layer inputs and output gradients are stored (a
    ResNet-18's ``layer4`` convolution: 8 MB for 128 samples instead of 1.2 GB of gradients); the
    patches are unfolded for blocks of samples of at most ``CONV_BLOCK_POSITIONS`` positions."""
    candidates = {layer.name: layer for layer in layer_map if isinstance(layer.module, nn.Conv2d)
                  and _owns_its_parameters(layer)}
    captured = _inputs_and_output_gradients(model, inputs, targets, groups, candidates, chunk_size,
                                            accept=_conv_pays)
    return {name: _conv_products(candidates[name].module, a, delta) for name, (a, delta) in captured.items()}


CONV_BLOCK_POSITIONS = 2048  # patch rows per block of samples in _conv_products (memory bound)


def _conv_products(conv: nn.Conv2d, a: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``M Mᵀ`` of a convolution's per-sample gradients from its inputs ``a`` and output gradients
    ``delta`` (:func:`_conv_layer_grams`), block by block of samples."""
    n, c_out = delta.shape[0], delta.shape[1]
    positions = delta.shape[2] * delta.shape[3]
    block = max(1, CONV_BLOCK_POSITIONS // positions)
    d = delta.double().reshape(n, c_out, positions).transpose(1, 2)  # (N, T, C)

    def patches(rows):  # (rows·T, K) float64
        u = nn.functional.unfold(a[rows].double(), conv.kernel_size, dilation=conv.dilation,
                                 padding=conv.padding, stride=conv.stride)
        return u.transpose(1, 2).reshape(-1, u.shape[1])

    products = torch.zeros(n, n, dtype=torch.float64, device=a.device)
    for i in iterate_batches(n, block):
        u_i, d_i = patches(i), d[i].reshape(-1, c_out)
        for j in iterate_batches(n, block):
            pairs = (u_i @ patches(j).T) * (d_i @ d[j].reshape(-1, c_out).T)
            products[i, j] = pairs.reshape(d_i.shape[0] // positions, positions, -1, positions).sum((1, 3))
    if conv.bias is not None:
        summed = d.sum(1)
        products += summed @ summed.T
    return products


def _inputs_and_output_gradients(model, inputs, targets, groups, candidates, chunk_size, *, accept) -> dict:
    """``{name: (inputs, output gradients)}`` of the candidate layers over all samples (in the
    layers' dtype), from batched passes of the summed cross-entropy of ``targets``; a layer that
    ``accept(module, input, output)`` refuses on any batch is left out."""
    if not candidates:
        return {}
    n = inputs.shape[0]
    captured: dict[str, tuple] = {}
    unsupported: set[str] = set()
    outputs: dict[str, tuple] = {}

    def capture(name):
        def hook(module, args, output):
            if not output.requires_grad or not accept(module, args[0], output):
                unsupported.add(name)
            else:
                outputs[name] = (args[0].detach(), output)
        return hook

    handles = [layer.module.register_forward_hook(capture(name)) for name, layer in candidates.items()]
    try:
        for label, index in groups:
            rows_of_group = torch.arange(n, device=inputs.device) if index is None else index
            for s in iterate_batches(rows_of_group.shape[0], chunk_size):
                rows = rows_of_group[s]
                outputs.clear()
                x = inputs[rows].detach().requires_grad_(inputs.is_floating_point())
                with torch.enable_grad():
                    logits = model_forward(model, x, label)
                    loss = nn.functional.cross_entropy(logits, targets[rows], reduction="sum")
                    check_finite_loss(loss, "while estimating the Fisher blocks")
                    names = [k for k in outputs if k not in unsupported]
                    if not names:  # no candidate takes this path: no backward pass
                        continue
                    deltas = torch.autograd.grad(loss, [outputs[k][1] for k in names], allow_unused=True)
                for name, delta in zip(names, deltas):
                    if delta is not None:
                        a = outputs[name][0]
                        if name not in captured:
                            captured[name] = (a.new_zeros((n, *a.shape[1:])), delta.new_zeros((n, *delta.shape[1:])))
                        captured[name][0][rows] = a
                        captured[name][1][rows] = delta.detach()
    finally:
        for handle in handles:
            handle.remove()
    return {name: value for name, value in captured.items() if name not in unsupported}


def _linear_top_eigenvalue(a: torch.Tensor, delta: torch.Tensor, bias: bool, *, rows: _Rows, debias: bool) -> float:
    """:func:`_top_gram_eigenvalue` of a Linear layer from its inputs ``a`` and (weighted) output
    gradients ``delta``: through the Gram ``(ΔΔᵀ) ⊙ (AAᵀ) (+ ΔΔᵀ)``, or, for a layer with fewer
    parameters than rows, through its per-row gradients ``δ_r ⊗ a_r`` formed explicitly."""
    n, n_params = a.shape[0], delta.shape[1] * (a.shape[1] + int(bias))
    if n_params < n:
        parts = [torch.einsum("no,ni->noi", delta, a).flatten(1)] + ([delta] if bias else [])
        return _top_gram_eigenvalue(parts, rows=rows, debias=debias)
    outer = delta @ delta.T
    return _top_eigenvalue(outer * rows.input_gram(a) + (outer if bias else 0.0), rows=rows, debias=debias)


def _layer_groups(layer_map, n_samples: int, memory_mb: float) -> list[list]:
    """Consecutive layers (of a layer map or a list of its layers) whose ``n_samples × P`` stored
    gradients (float32) fit in ``memory_mb``."""
    budget = memory_mb * 2**20
    groups, current, used = [], [], 0.0
    for layer in layer_map:
        size = 4.0 * n_samples * layer.num_params
        if current and used + size > budget:
            groups.append(current)
            current, used = [], 0.0
        current.append(layer)
        used += size
    if current:
        groups.append(current)
    return groups


def _per_sample_gradients(model, loss_fn, inputs, targets, groups, layer_group, chunk_size, *, sampled: bool):
    """``{name: (N, numel)}``: per-sample gradients of the group's parameters, the rest held fixed."""
    names = [k for layer in layer_group for k in layer.params]
    state = {k: v.detach() for k, v in model.named_parameters()}
    state.update({k: v.detach() for k, v in model.named_buffers()})
    params = {k: state[k] for k in names}
    consts = {k: v for k, v in state.items() if k not in params}
    n = inputs.shape[0]
    out = {k: torch.empty((n, params[k].numel()), dtype=params[k].dtype, device=params[k].device) for k in names}
    for label, index in groups:
        xs, ys = (inputs, targets) if index is None else (inputs[index], targets[index])
        # -log p(ŷ|x) is the plain cross-entropy of the sampled label (whatever smoothing or class
        # weights the training loss has: the Fisher is that of the model's likelihood)
        per_sample_loss = nn.CrossEntropyLoss() if sampled else loss_fn
        loss_of = sample_loss(model, per_sample_loss, consts, label)
        per_sample = vmap(grad(loss_of), in_dims=(None, 0, 0))
        for s in iterate_batches(xs.shape[0], chunk_size):
            rows = s if index is None else index[s]  # a slice copies contiguously
            try:
                grads = per_sample(params, xs[s], ys[s])
            except (RuntimeError, NotImplementedError):
                # no vmap rule (nn.GRU's kernel, other recurrent or custom ops): the same per-sample
                # gradients one sample at a time (reverse mode only)
                one = grad(loss_of)
                parts = [one(params, x, y) for x, y in zip(xs[s], ys[s])]
                grads = {k: torch.stack([p[k] for p in parts]) for k in names}
            for k, g in grads.items():
                out[k][rows] = g.reshape(g.shape[0], -1)
    return out  # finiteness is checked on the (much smaller) Gram matrices


def _top_gram_eigenvalue(parts: list[torch.Tensor], *, debias: bool, rows: _Rows | None = None) -> float:
    """Top eigenvalue of the Gram ``K = MMᵀ / N`` of ``M = [parts]`` (columns side by side; ``N``
    samples, ``rows.n``, each with one row or, with ``"expected"`` labels, ``C``), hollow and
    rescaled by ``N/(N-1)`` with ``debias``. ``MMᵀ = Σ_k P_k P_kᵀ``, so ``M`` is never
    concatenated; products run in the gradients' dtype (one BLAS call each), the eigensolve in
    float64. Without ``debias`` a narrow ``M`` uses ``MᵀM`` (the same non-zero spectrum)."""
    n = parts[0].shape[0] if rows is None else rows.n
    if not debias and sum(p.shape[1] for p in parts) < parts[0].shape[0]:
        m = torch.cat(parts, dim=1)
        return _largest(_finite((m.T @ m).double() / n))
    return _top_eigenvalue(sum(p @ p.T for p in parts).double(), debias=debias, rows=rows)


def _top_eigenvalue(products: torch.Tensor, *, debias: bool, rows: _Rows | None = None) -> float:
    """``λ_max`` of ``K = products / N`` (``products = M Mᵀ``), without each sample's products with
    itself and rescaled by ``N/(N-1)`` with ``debias``."""
    n = products.shape[0] if rows is None else rows.n
    gram = _finite(products.double() / n)
    if debias:
        gram = rows.hollow(gram) if rows is not None else (gram - torch.diag(torch.diagonal(gram))) * (n / (n - 1))
    return _largest(gram)


DENSE_EIGENSOLVE = 1024  # larger Gram matrices (e.g. N·C rows of labels="expected") use Lanczos


def _largest(matrix: torch.Tensor) -> float:
    """``max(λ_max(matrix), 0)`` of a symmetric float64 matrix: a dense eigensolve up to
    ``DENSE_EIGENSOLVE`` rows, above it :func:`block_lanczos` to a relative residual of 1e-12
    (float64 rounding of the products is ~1e-16 · n: the same value, at O(n²) per step instead of
    the O(n³) of a full decomposition)."""
    if matrix.shape[0] <= DENSE_EIGENSOLVE:
        return float(torch.linalg.eigvalsh(matrix)[-1].clamp_min(0.0))
    start = {"v": torch.randn(matrix.shape[0], generator=torch.Generator().manual_seed(0), dtype=matrix.dtype)}
    out = block_lanczos(lambda v, rows: {"v": matrix @ v["v"]}, {"v": start["v"].to(matrix.device)}, {"v": 0},
                        1e-12, 1000)
    return max(float(out.estimate[0]), 0.0)


def _finite(gram: torch.Tensor) -> torch.Tensor:
    if not bool(torch.isfinite(gram).all()):
        raise ValueError("a per-sample gradient is not finite while estimating the Fisher blocks")
    return gram
