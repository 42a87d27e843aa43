"""LayerSensitivityMetric through Avalanche's loggers; LayerAdaptiveLRPlugin's parameter groups."""

import io

import numpy as np
import pytest
import torch
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.logging import InteractiveLogger, TensorboardLogger, TextLogger
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.supervised import Naive
from torch import nn

from avalanche_plugins import LayerAdaptiveEWCPlugin, LayerAdaptiveLRPlugin, LayerSensitivityMetric
from avalanche_plugins.layer_adaptive import geometric_fit
from tests.fixtures import build_model, digits_stream


def strategy_for(plugins=(), metrics=(), loggers=(), seed=0, epochs=1):
    stream = digits_stream(task_incremental=True)
    torch.manual_seed(seed)
    model = build_model("mlp", stream.input_shape, 2, hidden=(32, 16), multihead=True)
    evaluator = EvaluationPlugin(accuracy_metrics(experience=True), *metrics, loggers=list(loggers))
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=epochs,
                     plugins=list(plugins), evaluator=evaluator)
    return strategy, stream


def test_metric_names_values_and_loggers(tmp_path):
    text = io.StringIO()
    tb = TensorboardLogger(tb_log_dir=str(tmp_path / "tb"))
    metric = LayerSensitivityMetric(n_samples=64)
    strategy, stream = strategy_for(metrics=[metric], loggers=[TextLogger(text), InteractiveLogger(), tb])
    for experience in stream.benchmark.train_stream[:2]:
        strategy.train(experience)
        strategy.eval(stream.benchmark.test_stream[:1])
    last = strategy.evaluator.get_last_metrics()
    name = "LayerSensitivity/train_phase/train_stream/Task001/Exp001"
    assert set(last[name]) == {"trunk.features.1", "trunk.features.3", "head.classifiers.1.classifier"}
    kappa = last["LayerSensitivityKappa/train_phase/train_stream/Task001/Exp001"]
    assert kappa == pytest.approx(max(last[name].values()) / min(last[name].values()))
    assert "LayerSensitivityAlphaHat/train_phase/train_stream/Task001/Exp001" in last
    assert metric.result() == pytest.approx(last[name])
    assert [r.experience for r in metric.history] == [0, 1]  # one profile per trained experience
    assert metric.history[-1].kappa == pytest.approx(kappa)
    assert "LayerSensitivityKappa" in text.getvalue()
    tb.writer.flush()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert any(t.startswith("LayerSensitivity/train_phase") for t in events.Tags()["scalars"])
    assert any(t.startswith("LayerSensitivityProfile") for t in events.Tags()["images"])


def test_metric_does_not_change_the_run():
    plain, stream = strategy_for()
    measured, _ = strategy_for(metrics=[LayerSensitivityMetric(n_samples=64)])
    for strategy in (plain, measured):
        torch.manual_seed(123)  # same shuffling stream for both runs
        for experience in stream.benchmark.train_stream[:2]:
            strategy.train(experience)
    for p, q in zip(plain.model.parameters(), measured.model.parameters()):
        assert torch.equal(p, q)


def test_ewc_plugin_log_profile_publishes():
    plugin = LayerAdaptiveEWCPlugin(10.0, schedule="geometric", alpha=2.0, log_profile=True, spectrum_samples=64)
    strategy, stream = strategy_for(plugins=[plugin])
    strategy.train(stream.benchmark.train_stream[0])
    last = strategy.evaluator.get_last_metrics()
    assert "LayerSensitivityKappa/train_phase/train_stream/Task000/Exp000" in last
    assert plugin.profiles[0].spectrum is not None


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


class KillLayer(SupervisedPlugin):
    """Kills every unit after the trunk's first layer before each experience: s_l = 0 there."""

    def before_training_exp(self, strategy, **kwargs):
        with torch.no_grad():
            strategy.model.trunk.features[1].weight.zero_()
            strategy.model.trunk.features[1].bias.fill_(-100.0)


def test_metric_with_a_dead_layer_logs_finite_values_and_names_it():
    metric = LayerSensitivityMetric(n_samples=64)
    strategy, stream = strategy_for(plugins=[KillLayer()], metrics=[metric])
    strategy.optimizer = torch.optim.SGD(strategy.model.parameters(), lr=0.0)  # keep the layer dead
    with pytest.warns(RuntimeWarning, match=r"dead layer.*trunk\.features\.1"):
        strategy.train(stream.benchmark.train_stream[0])
    assert metric.history[-1].dead_layers[0] == "trunk.features.1"
    for name, value in strategy.evaluator.get_last_metrics().items():
        values = value.values() if isinstance(value, dict) else [value] if isinstance(value, float) else []
        assert all(np.isfinite(v) for v in values), name
    assert np.isfinite(metric.history[-1].kappa)


def test_every_layer_dead_publishes_the_profile_without_kappa():
    """All-zero bias-free weights: every s_ℓ is 0; the published values (LayerAdaptiveEWCPlugin's
    log_profile goes through sensitivity_values) leave κ out instead of crashing on kappa None."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8, bias=False), nn.ReLU(), nn.Linear(8, 10, bias=False))
    for p in model.parameters():
        nn.init.zeros_(p)
    plugin = LayerAdaptiveEWCPlugin(1.0, schedule="geometric", log_profile=True, spectrum_samples=16)
    stream = digits_stream(5)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), criterion=nn.CrossEntropyLoss(),
                     train_mb_size=32, train_epochs=1, plugins=[plugin],
                     evaluator=EvaluationPlugin(accuracy_metrics(experience=True), loggers=[]))
    with pytest.warns(RuntimeWarning, match="dead"):
        strategy.train(stream.benchmark.train_stream[0], num_workers=0)
    assert plugin.profiles[0].kappa is None
    last = strategy.evaluator.get_last_metrics()
    assert "LayerSensitivity/train_phase/train_stream/Task000/Exp000" in last
    assert not any(name.startswith("LayerSensitivityKappa") for name in last)
