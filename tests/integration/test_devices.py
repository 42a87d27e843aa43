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
@pytest.mark.parametrize("solver", ["direct", "cg"])
def test_cross_channel_and_gauss_newton_keys_on_the_models_device(device, solver):
    def refined_key(dev):
        checkpoint, updated = _net(dev), _net(dev)
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1)).to(dev)
        with torch.no_grad():
            updated[0].weight.add_(0.1 * torch.randn(updated[0].weight.shape, generator=torch.Generator().manual_seed(2)).to(dev))
        key = fit_transport_key(stage_activations(updated, "1", x), stage_activations(checkpoint, "1", x),
                                "cross_channel", ridge=1e-3)
        before = key.weight.detach().clone()
        gauss_newton_key(key, stitch(updated, checkpoint, "1", key), x, iterations=1, solver=solver)
        assert key.weight.device.type == torch.device(dev).type and not torch.equal(key.weight, before)
        return key.weight.detach()

    _same(refined_key(device), refined_key("cpu"))


def _same(got, want, rel=1e-4):
    """Tensors (any device) / dicts of them / floats equal to the CPU reference."""
    if isinstance(got, dict):
        assert sorted(got) == sorted(want)
        for k in got:
            _same(got[k], want[k], rel)
    elif isinstance(got, torch.Tensor):
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=rel, atol=1e-6)
    else:
        assert got == pytest.approx(want, rel=rel)


@pytest.mark.parametrize("device", DEVICES)
def test_every_tensor_estimator_runs_where_the_model_is_and_matches_the_cpu(device):
    from avalanche_plugins.ads import architecture_driven_shift
    from avalanche_plugins.layer_adaptive import batched_fisher, empirical_fisher, expected_fisher
    from avalanche_plugins.readiness import (
        active_unit_fraction,
        entk_energy_rank,
        optimization_readiness,
        representation_ranks,
    )
    from avalanche_plugins.structural import UnitMasks

    torch.manual_seed(1)
    x, y, new_x = torch.randn(24, 4), torch.randint(0, 3, (24,)), torch.randn(24, 4)
    ce = nn.CrossEntropyLoss()

    def everything(dev):
        net, xd, yd = _net(dev), x.to(dev), y.to(dev)
        out = {f"or_{e}": optimization_readiness(net, ce, xd, yd, estimator=e).readiness
               for e in ("sampled", "per_sample")}
        out["ads"] = architecture_driven_shift(net, ce, xd, new_x.to(dev), yd, lr=0.1, steps=10, path="logit").ads
        out["expected"] = expected_fisher(net, xd, chunk_size=5)
        out["empirical"] = empirical_fisher(net, ce, xd, yd, chunk_size=5)
        out["batched"] = batched_fisher(net, ce, [(xd[:12], yd[:12]), (xd[12:], yd[12:])])
        out["ranks"] = representation_ranks(net, xd)
        out["active"] = active_unit_fraction(net, xd)
        out["entk"] = entk_energy_rank(net, xd)
        masks = UnitMasks(net, xd[:2])
        masks.set_masks({name: (torch.arange(m.numel(), device=m.device) % 2).float() for name, m in masks.masks.items()})
        out["masked_logits"] = net(xd)
        for tensors in (out["expected"], out["empirical"], out["batched"], {"logits": out["masked_logits"]}):
            assert all(t.device.type == torch.device(dev).type for t in tensors.values())
        return out

    _same(everything(device), everything("cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_every_plugin_and_metric_in_a_strategy_on_the_device(device):
    from avalanche.training.supervised import Naive

    from avalanche_plugins import (
        ArchitectureDrivenShiftMetric,
        GrowPlugin,
        LayerAdaptiveEWCPlugin,
        LayerSensitivityMetric,
        OptimizationReadinessMetric,
        TransportKeyMetric,
    )
    from tests.cases import build_model
    from tests.fixtures import digits_stream, evaluator

    stream = digits_stream(5)
    torch.manual_seed(0)
    model = build_model("mlp")
    metrics = (OptimizationReadinessMetric(n_samples=64), ArchitectureDrivenShiftMetric(calibration_size=32),
               LayerSensitivityMetric(n_samples=32),
               TransportKeyMetric(stages=["features.1"], n_anchors=20, experiences=[0], gauss_newton_iterations=1))
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05), criterion=nn.CrossEntropyLoss(),
                     train_mb_size=32, train_epochs=1, device=device, evaluator=evaluator(*metrics),
                     plugins=[LayerAdaptiveEWCPlugin(ewc_lambda=10.0, schedule="smoothed", fisher="expected",
                                                     fisher_samples=32),
                              GrowPlugin(0.5, seed_compactness=0.25, grow_fraction_per_cycle=0.125, epochs_per_cycle=1)])
    for experience in stream.benchmark.train_stream[:2]:
        strategy.train(experience, num_workers=0)
    strategy.eval(stream.benchmark.test_stream[:1])  # the transport keys are fitted for old experiences
    last = strategy.evaluator.get_last_metrics()
    for prefix in ("OptimizationReadiness", "ADS", "ADSRealisedShift", "LayerSensitivityKappa", "TransportKeyAcc"):
        values = [v for k, v in last.items() if k.startswith(prefix + "/")]
        assert values and all(isinstance(v, float) and v == v for v in values), (prefix, sorted(last))
    assert next(model.parameters()).device.type == torch.device(device).type
