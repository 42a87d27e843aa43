"""LayerSensitivityMetric through Avalanche's loggers, dead layers, and the EWC plugin's published profile."""

from __future__ import annotations

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

from avalanche_plugins import LayerAdaptiveEWCPlugin, LayerSensitivityMetric
from tests.cases import build_model
from tests.fixtures import digits_stream


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
