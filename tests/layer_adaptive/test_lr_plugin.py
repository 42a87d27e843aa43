"""LayerAdaptiveLRPlugin's parameter groups, rates and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from avalanche.core import SupervisedPlugin

from avalanche_plugins import LayerAdaptiveLRPlugin
from avalanche_plugins.layer_adaptive import geometric_fit
from tests.layer_adaptive.test_sensitivity_metric import strategy_for


def group_of(groups, param):
    """Index of the group (of an optimizer's ``param_groups`` or a list of them) holding ``param``."""
    groups = getattr(groups, "param_groups", groups)
    return next(i for i, g in enumerate(groups) if any(p is param for p in g["params"]))


def optimizer_state(strategy):
    """A copy of the optimizer's per-parameter state, keyed by parameter name."""
    state = strategy.optimizer.state
    return {name: {k: v.clone() for k, v in state[p].items()}
            for name, p in strategy.model.named_parameters() if state.get(p)}


class StateAtStart(SupervisedPlugin):
    """Placed after the plugin under test: the optimizer state and groups once every plugin has
    prepared the experience (the groups are built at its first epoch), just before its first step."""

    def __init__(self):
        super().__init__()
        self.states, self.groups = [], []

    def before_training_epoch(self, strategy, **kwargs):
        if strategy.clock.train_exp_epochs == 0:
            self.states.append(optimizer_state(strategy))
            self.groups.append([{**{k: v for k, v in g.items() if k != "params"}, "params": list(g["params"])}
                                for g in strategy.optimizer.param_groups])


def test_lr_plugin_geometric_groups_keep_state_and_cover_new_heads():
    plugin, probe = LayerAdaptiveLRPlugin(schedule="geometric", alpha=0.5), StateAtStart()
    strategy, stream = strategy_for(plugins=[plugin, probe])
    strategy.train(stream.benchmark.train_stream[0])
    opt, model = strategy.optimizer, strategy.model
    # alpha < 1: deeper layers faster, never above the base rate (the head gets it)
    assert [g["lr"] for g in probe.groups[0]] == pytest.approx([0.0125, 0.025, 0.05])
    assert all(g["momentum"] == 0.9 for g in probe.groups[0])
    # between experiences: one group at the base rate, as Avalanche's optimizer adaptation expects
    assert [g["lr"] for g in opt.param_groups] == [0.05]
    after_first = optimizer_state(strategy)
    assert "trunk.features.1.weight" in after_first  # momentum buffers exist
    strategy.train(stream.benchmark.train_stream[1])  # adds head 1: grouped with the head layer
    # the regrouped optimizer starts experience 1 with every buffer experience 0 left, unchanged
    kept = probe.states[1]
    assert kept.keys() == after_first.keys()
    for name, buffers in after_first.items():
        assert all(torch.equal(kept[name][k], v) for k, v in buffers.items()), name
    params = list(model.parameters())
    groups = probe.groups[1]
    assert sorted(id(p) for g in groups for p in g["params"]) == sorted(id(p) for p in params)
    head1 = model.head.classifiers["1"].classifier.weight
    w = model.trunk.features[1].weight
    assert groups[group_of(groups, head1)]["lr"] == pytest.approx(0.05)
    assert groups[group_of(groups, w)]["lr"] == pytest.approx(0.0125)
    assert not torch.equal(opt.state[w]["momentum_buffer"], after_first["trunk.features.1.weight"]["momentum_buffer"])
    assert head1.grad is not None and "momentum_buffer" in opt.state[head1]


def test_lr_plugin_smoothed_uses_inverse_curvature():
    plugin = LayerAdaptiveLRPlugin(schedule="smoothed", spectrum_samples=64)
    strategy, stream = strategy_for(plugins=[plugin])
    for experience in stream.benchmark.train_stream[:2]:
        strategy.train(experience)
    first, second = plugin.history
    assert first["lr"] == pytest.approx([0.05] * 3)  # no profile before the first experience
    rates = np.array(second["lr"])
    fitted = geometric_fit(second["spectrum"]).profile(3)  # ŝ_ℓ measured after experience 0
    expected = 0.05 * (1 / fitted) / (1 / fitted).max()
    assert rates == pytest.approx(expected)
    assert rates.max() == pytest.approx(0.05)
    assert np.argmax(rates) == np.argmin(fitted)  # the least sensitive layer moves fastest


def test_lr_plugin_bad_arguments():
    with pytest.raises(ValueError, match="schedule"):
        LayerAdaptiveLRPlugin(schedule="measured")
    with pytest.raises(ValueError, match="alpha"):
        LayerAdaptiveLRPlugin(alpha=0)


def test_lr_plugin_floor_keeps_every_layer_training_under_extreme_curvature():
    # MobileNetV3-small measured kappa ~ 4.4e22: without the floor the smoothed rule gave 8e-17
    plugin = LayerAdaptiveLRPlugin(schedule="smoothed", base_lr=0.1)
    plugin.last_spectrum = (10.0 ** -np.linspace(0, 22, 12)).tolist()
    plugin.last_names = [f"layer{i}" for i in range(12)]
    with pytest.warns(RuntimeWarning, match="max_ratio"):
        rates = plugin.layer_rates(12)
    assert (rates >= 1e-3 * 0.1 * (1 - 1e-12)).all() and rates.max() == pytest.approx(0.1)
    assert rates[-1] == pytest.approx(0.1) and rates[0] == pytest.approx(1e-4)  # the most sensitive: the floor
    with pytest.warns(RuntimeWarning, match=r"dead layers \['layer1'\]"):  # dead: the fit's rate, floored
        plugin.last_spectrum = [4.0, 0.0, 1.0] + [1.0] * 9
        assert (plugin.layer_rates(12) >= 1e-4 * (1 - 1e-12)).all()
    deep = LayerAdaptiveLRPlugin(schedule="geometric", alpha=0.5, base_lr=0.1, min_lr_ratio=0.01)
    rates = deep.layer_rates(21)  # 2^-20 relative without the floor
    assert rates.min() == pytest.approx(1e-3) and rates.max() == pytest.approx(0.1)
    unfloored = LayerAdaptiveLRPlugin(schedule="geometric", alpha=0.5, base_lr=0.1, min_lr_ratio=0)
    assert unfloored.layer_rates(21).min() == pytest.approx(0.1 * 2.0**-20)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="min_lr_ratio"):
            LayerAdaptiveLRPlugin(min_lr_ratio=bad)
