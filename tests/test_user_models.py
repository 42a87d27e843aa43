"""Models and settings users bring: never a silent wrong number, and bad input fails before training."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from avalanche_plugins.layer_adaptive import layer_top_eigenvalues


def _saddle_loss(out, y):
    # ½ Σ_i y_i o_i² with o = (w1, w2), y = (+1, −1): the Hessian in w is diag(+1, −1)
    return 0.5 * (y * out.squeeze(-1) ** 2).sum()


def test_power_iteration_with_symmetric_extreme_eigenvalues_is_never_reported_converged_wrong():
    """Block eigenvalues {+1, −1}: plain power iteration oscillates with a steady Rayleigh quotient
    anywhere in (−1, 1); it must either find s = +1 or say it did not converge."""
    net = nn.Sequential(nn.Linear(2, 1, bias=False))
    x, y = torch.eye(2), torch.tensor([1.0, -1.0])
    outcomes = []
    for seed in range(8):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            spec = layer_top_eigenvalues(net, _saddle_loss, x, y, max_iter=50, tol=1e-6, seed=seed)
        converged, top = spec.converged[0], float(spec.top[0])
        assert not converged or abs(top - 1.0) < 1e-3, (seed, top)
        assert converged or any("did not reach" in str(w.message) for w in caught)
        outcomes.append(converged)
    assert not all(outcomes)  # some starts have a positive dominant Rayleigh quotient and cannot converge
