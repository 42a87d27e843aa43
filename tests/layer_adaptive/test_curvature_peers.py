"""Per-layer curvature held to an independent library: curvlinops' linear operators.

For every layer ℓ (the layer map's parameters: weight, bias and an attached norm), curvlinops
builds the block operator on those parameters only (``HessianLinearOperator``,
``EFLinearOperator``, ``GGNLinearOperator``); on these tiny models it is applied to the identity
(one vmapped product) and scipy's dense ``eigvalsh`` gives the block's largest eigenvalue
(``benchmarks.curvature_peers`` runs the same operators through ``eigsh`` on the large models).
The models run in float64, so the tolerances are the solvers' own: ours stops at a relative
residual ``TOL`` (an eigenvalue within ``TOL·|θ|``), the dense reference is exact to float64
rounding (~1e-15 relative, as are the products): values agree to ``RTOL = 10·TOL``. The Fisher
blocks are exact (a float64 eigendecomposition of the Gram), so they meet the same ``RTOL``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from avalanche_plugins.core.calls import is_multitask
from avalanche_plugins.core.layers import discover_layers
from avalanche_plugins.layer_adaptive import (
    layer_curvature,
    layer_fisher_eigenvalues,
    layer_top_eigenvalues,
)
from tests.cases import build_model, small_bn_cnn
from tests.fixtures import digits_stream

curvlinops = pytest.importorskip("curvlinops")
eigvalsh = pytest.importorskip("scipy.linalg").eigvalsh

CE = nn.CrossEntropyLoss()
TOL = 1e-10
RTOL = 10 * TOL


class _Residual(nn.Module):
    """conv -> BN -> ReLU, a residual conv -> BN branch added back, global pool, linear head."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(h + self.bn2(self.conv2(h)))
        return self.head(h.mean((2, 3)))


class _Tasked(nn.Module):
    """A multi-task model as curvlinops calls it: one input, ``{"x": inputs, "t": task label}``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs):
        return self.model(inputs["x"], inputs["t"])


def _case(name):
    """``(model, x, y, task labels)`` in float64, the model in eval mode with non-trivial BN statistics."""
    torch.manual_seed(0)
    t = None
    if name == "linear":
        model, x = nn.Sequential(nn.Linear(5, 4)), torch.randn(40, 5)
    elif name == "conv_bn":
        model, x = small_bn_cnn(), torch.randn(24, 1, 8, 8)
    elif name == "residual":
        model, x = _Residual(), torch.randn(24, 2, 6, 6)
        model.train()
        with torch.no_grad():
            model(torch.randn(64, 2, 6, 6))  # running statistics that are not (0, 1)
    else:
        from avalanche.models.dynamic_modules import avalanche_model_adaptation

        model = build_model("mlp", multihead=True, hidden=(8,))
        for experience in digits_stream(5, task_incremental=True).benchmark.train_stream[:2]:
            avalanche_model_adaptation(model, experience)  # heads for tasks 0 and 1
        torch.manual_seed(0)
        x, t = torch.randn(24, 1, 8, 8), torch.tensor([0, 1] * 12)
    model = model.double().eval()
    n_classes = 2 if name == "multi_head" else model(x[:1].double()).shape[1]
    return model, x.double(), torch.randint(0, n_classes, (x.shape[0],)), t


def _peer(operator, model, x, y, t, **kwargs) -> np.ndarray:
    """curvlinops' block operator of every layer, its largest eigenvalue from the dense block."""
    layers = discover_layers(model, x[:2] if t is None else (x[:2], int(t[0])))
    if is_multitask(model):  # one batch per task, so every forward pass has one task label
        func = _Tasked(model)
        data = [({"x": x[t == u], "t": int(u)}, y[t == u]) for u in torch.unique(t)]
        kwargs["batch_size_fn"] = lambda inputs: inputs["x"].shape[0]
    else:
        func, data = model, [(x, y)]
    tops = []
    for layer in layers:
        op = operator(func, CE, list(layer.params.values()), data, check_deterministic=False, **kwargs)
        dense = (op @ torch.eye(op.shape[1], dtype=torch.float64)).numpy()  # one vmapped product: tiny blocks
        tops.append(float(eigvalsh(dense)[-1]))
    return np.array(tops)


CASES = ["linear", "conv_bn", "residual", "multi_head"]


@pytest.mark.parametrize("name", CASES)
def test_hessian_blocks_match_curvlinops(name):
    model, x, y, t = _case(name)
    spec = layer_top_eigenvalues(model, CE, x, y, task_labels=t, tol=TOL, max_iter=500, chunk_size=10)
    assert all(spec.converged)
    np.testing.assert_allclose(spec.top, _peer(curvlinops.HessianLinearOperator, model, x, y, t), rtol=RTOL)


@pytest.mark.parametrize("name", CASES)
def test_empirical_fisher_blocks_match_curvlinops(name):
    model, x, y, t = _case(name)
    spec = layer_fisher_eigenvalues(model, CE, x, y, task_labels=t, labels="true", debias=False, chunk_size=7)
    np.testing.assert_allclose(spec.top, _peer(curvlinops.EFLinearOperator, model, x, y, t), rtol=RTOL)


@pytest.mark.parametrize("name", CASES)
def test_expected_label_fisher_blocks_are_the_ggn_blocks_of_curvlinops(name):
    model, x, y, t = _case(name)
    spec = layer_fisher_eigenvalues(model, CE, x, y, task_labels=t, labels="expected", debias=False, chunk_size=7)
    np.testing.assert_allclose(spec.top, _peer(curvlinops.GGNLinearOperator, model, x, y, t), rtol=RTOL)


def test_layer_curvature_matches_curvlinops_for_both_methods():
    model, x, y, t = _case("conv_bn")
    hessian = layer_curvature(model, CE, x, y, method="hessian", tol=TOL, max_iter=500)
    np.testing.assert_allclose(hessian.top, _peer(curvlinops.HessianLinearOperator, model, x, y, t), rtol=RTOL)
    fisher = layer_curvature(model, CE, x, y, method="fisher", labels="true", debias=False)
    np.testing.assert_allclose(fisher.top, _peer(curvlinops.EFLinearOperator, model, x, y, t), rtol=RTOL)


@pytest.mark.parametrize("name", ["conv_bn", "multi_head"])
def test_sampled_label_fisher_is_an_unbiased_estimate_of_the_ggn_block(name):
    """Sampled labels: ``F̂ = (1/N) Σ_i g(ŷ_i) g(ŷ_i)ᵀ`` with ``ŷ_i ~ p_θ(·|x_i)`` has expectation
    the GGN block (softmax cross-entropy). Each input is repeated ``R`` times so ``F̂`` averages
    ``R`` draws per input; over ``S`` seeds the mean of ``λ_max(F̂)`` must lie within 4 standard
    errors of curvlinops' exact ``λ_max(GGN)``, widened by one standard deviation of a single
    estimate for the bias ``E λ_max(F̂) − λ_max(E F̂) ≥ 0`` (second order in the sampling error,
    so much smaller than one standard deviation at this size)."""
    model, x, y, t = _case(name)
    exact = _peer(curvlinops.GGNLinearOperator, model, x, y, t)
    repeats, seeds = 50, 6
    xr, tr = x.repeat(repeats, *[1] * (x.dim() - 1)), None if t is None else t.repeat(repeats)
    draws = np.stack([layer_fisher_eigenvalues(model, CE, xr, y.repeat(repeats), task_labels=tr, debias=False,
                                               chunk_size=256, seed=s).top for s in range(seeds)])
    mean, std = draws.mean(0), draws.std(0, ddof=1)
    assert (np.abs(mean - exact) <= 4 * std / np.sqrt(seeds) + std).all(), (mean, std, exact)
    assert (std < 0.1 * exact).all()  # the tolerance is a tight one: 50 draws per input concentrate F̂
