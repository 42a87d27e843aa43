"""Estimators run where the model and data are: no tensor is created on a hard-coded CPU.

Parametrised over the available devices; the CUDA cases are skipped on machines without a GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from avalanche_plugins.layer_adaptive import layer_fisher_eigenvalues, layer_top_eigenvalues
from avalanche_plugins.transport import (
    fit_transport_key,
    gauss_newton_key,
    stage_activations,
    stitch,
)

CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))
DEVICES = ["cpu", CUDA]


def _net(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(device)


@pytest.mark.parametrize("device", [CUDA])  # on the CPU it would compare a computation with itself
def test_layer_spectrum_on_the_models_device_matches_the_cpu(device):
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    reference = layer_top_eigenvalues(_net("cpu"), nn.CrossEntropyLoss(), x, y, tol=1e-6, max_iter=500)
    spectrum = layer_top_eigenvalues(_net(device), nn.CrossEntropyLoss(), x.to(device), y.to(device),
                                     tol=1e-6, max_iter=500)
    assert spectrum.top == pytest.approx(reference.top, rel=1e-3)


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("labels", ["sampled", "true"])
def test_fisher_blocks_on_the_models_device_match_the_cpu(device, labels):
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    reference = layer_fisher_eigenvalues(_net("cpu"), nn.CrossEntropyLoss(), x, y, labels=labels)
    spectrum = layer_fisher_eigenvalues(_net(device), nn.CrossEntropyLoss(), x.to(device), y.to(device),
                                        labels=labels)
    assert spectrum.top == pytest.approx(reference.top, rel=1e-4)  # the same labels are drawn on the CPU


@pytest.mark.parametrize("device", DEVICES)
def test_cross_channel_and_gauss_newton_keys_on_the_models_device(device):
    checkpoint, updated, x = _net(device), _net(device), torch.randn(32, 4, device=device)
    with torch.no_grad():
        updated[0].weight.add_(0.1 * torch.randn_like(updated[0].weight))
    key = fit_transport_key(stage_activations(updated, "1", x), stage_activations(checkpoint, "1", x), "cross_channel",
                            ridge=1e-3)
    assert key.weight.device.type == torch.device(device).type
    refined = gauss_newton_key(key, stitch(updated, checkpoint, "1", key), x, iterations=1)
    assert all(torch.isfinite(p).all() for p in refined.parameters())
