"""The loss-of-plasticity literature's diagnostics (issue 33) against independent computations:
NumPy SVDs for the ranks, hand-written forward passes for dormant units, a loop for weight magnitude."""

import numpy as np
import pytest
import torch
from torch import nn

from avalanche_plugins.readiness import (
    PLASTICITY_DIAGNOSTICS,
    active_unit_fraction,
    average_weight_magnitude,
    dormant_unit_fraction,
    feature_rank,
    srank,
)


def _np_srank(phi: np.ndarray, delta: float) -> int:
    sigma = np.linalg.svd(phi, compute_uv=False)
    ratios = np.cumsum(sigma) / sigma.sum()
    return int(np.argmax(ratios >= 1 - delta)) + 1


@pytest.mark.parametrize("seed", range(4))
def test_srank_and_feature_rank_against_numpy_svd(seed):
    rng = np.random.default_rng(seed)
    # a decaying spectrum with values away from the thresholds
    u, _ = np.linalg.qr(rng.standard_normal((60, 20)))
    v, _ = np.linalg.qr(rng.standard_normal((20, 20)))
    spectrum = 3.0 * 0.7 ** np.arange(20)
    phi = (u * spectrum) @ v.T
    for delta in (0.01, 0.1, 0.3):
        assert srank(torch.tensor(phi), delta=delta) == _np_srank(phi, delta)
    sigma = np.linalg.svd(phi / np.sqrt(60), compute_uv=False)
    for eps in (0.01, 0.05, 0.2):
        expected = int((sigma > eps).sum())
        assert feature_rank(torch.tensor(phi, dtype=torch.float32), epsilon=eps) == expected
    # conv-shaped features are flattened per sample
    assert srank(torch.tensor(phi).reshape(60, 5, 2, 2)) == _np_srank(phi, 0.01)


def test_ranks_of_degenerate_matrices():
    assert srank(torch.zeros(5, 3)) == 0 and feature_rank(torch.zeros(5, 3)) == 0
    assert srank(torch.ones(4, 3)) == 1 and feature_rank(torch.ones(4, 3)) == 1
    with pytest.raises(ValueError, match="delta"):
        srank(torch.eye(3), delta=1.0)
    with pytest.raises(ValueError, match="epsilon"):
        feature_rank(torch.eye(3), epsilon=-0.1)


def _np_dormant(hs: list[np.ndarray], tau: float) -> float:
    dormant = total = 0
    for h in hs:
        means = np.abs(h).mean(axis=0)
        scores = means / means.mean() if means.mean() > 0 else np.zeros_like(means)
        dormant += int((scores <= tau).sum())
        total += means.size
    return dormant / total


def test_dormant_units_against_a_hand_written_forward_pass():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 3))
    with torch.no_grad():
        net[0].bias[:5] = -20.0  # five dead units in layer 1
        net[0].weight[5:8] *= 1e-3  # three nearly dormant ones
        net[0].bias[5:8] = 0.0
    x = torch.randn(200, 6)
    w1, b1, w2, b2 = (p.detach().double().numpy() for p in list(net.parameters())[:4])
    h1 = np.maximum(x.double().numpy() @ w1.T + b1, 0)
    h2 = np.maximum(h1 @ w2.T + b2, 0)
    for tau in (0.0, 0.025, 0.1, 0.5):
        assert dormant_unit_fraction(net, x, tau=tau) == pytest.approx(_np_dormant([h1, h2], tau), abs=0)
    assert dormant_unit_fraction(net, x, tau=0.0) == pytest.approx(1 - active_unit_fraction(net, x), abs=1e-12)
    assert dormant_unit_fraction(net, x, tau=0.025) >= 8 / 28  # the dead and the scaled-down units
    assert dormant_unit_fraction(net, x, chunk_size=7) == dormant_unit_fraction(net, x)


def test_dormant_units_conv_channels_average_over_positions():
    conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    with torch.no_grad():
        conv[0].weight.zero_()
        conv[0].bias.copy_(torch.tensor([1.0, 0.02, -1.0, 2.98]))  # channel scores 1, .02, 0, 2.98
    assert dormant_unit_fraction(conv, torch.randn(3, 1, 6, 6), tau=0.025) == 0.5
    assert dormant_unit_fraction(conv, torch.randn(3, 1, 6, 6), tau=0.0) == 0.25


def test_all_dead_layer_is_all_dormant_and_no_hidden_layer_raises():
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    with torch.no_grad():
        net[0].weight.zero_()
        net[0].bias.fill_(-1.0)
    assert dormant_unit_fraction(net, torch.randn(4, 2)) == 1.0
    with pytest.raises(ValueError, match="hidden layer"):
        dormant_unit_fraction(nn.Linear(2, 1), torch.randn(4, 2))


def test_average_weight_magnitude_against_a_loop():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(48, 4))
    weights = [net[0].weight, net[4].weight]
    expected = sum(float(w.detach().abs().sum()) for w in weights) / sum(w.numel() for w in weights)
    assert average_weight_magnitude(net) == pytest.approx(expected, rel=1e-6)
    every = list(net.parameters())
    expected_all = sum(float(p.detach().abs().sum()) for p in every) / sum(p.numel() for p in every)
    assert average_weight_magnitude(net, include_bias=True) == pytest.approx(expected_all, rel=1e-6)
    net[0].weight.requires_grad_(False)  # frozen weights are not the network's trainable weights
    assert average_weight_magnitude(net) == pytest.approx(float(net[4].weight.detach().abs().mean()), rel=1e-6)


def test_orientation_table():
    assert PLASTICITY_DIAGNOSTICS["dormant_units"] == -1 and PLASTICITY_DIAGNOSTICS["weight_magnitude"] == -1
    assert all(PLASTICITY_DIAGNOSTICS[k] == 1 for k in ("effective_rank", "srank", "feature_rank", "active_units"))
