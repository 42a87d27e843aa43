"""ArchitectureDrivenShiftMetric inside Avalanche runs: names, values against direct calls,
loggers, no side effects on the run, bad arguments."""

import copy
import io
import math

import pytest
import torch
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.logging import TextLogger
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.supervised import Naive
from torch import nn

from avalanche_plugins import ArchitectureDrivenShiftMetric
from avalanche_plugins.ads import (
    architecture_driven_shift,
    logit_shift,
)
from avalanche_plugins.core.stats import expected_calibration_error
from tests.cases import build_model
from tests.fixtures import digits_stream


class Snapshot(SupervisedPlugin):
    """Runs before the evaluator: copies the checkpoint each metric measurement sees."""

    def __init__(self):
        super().__init__()
        self.models = []

    def before_training_exp(self, strategy, **kwargs):
        self.models.append(copy.deepcopy(strategy.model))


def strategy_for(metrics=(), plugins=(), loggers=(), multihead=False, adam=False, noise=0.0):
    stream = digits_stream(task_incremental=multihead, noise=noise)
    torch.manual_seed(0)
    model = build_model("mlp", stream.input_shape, 2 if multihead else stream.n_classes,
                        hidden=(32, 16), multihead=multihead)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) if adam else \
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    evaluator = EvaluationPlugin(accuracy_metrics(experience=True), *metrics, loggers=list(loggers))
    strategy = Naive(model=model, optimizer=optimizer, criterion=nn.CrossEntropyLoss(), train_mb_size=32,
                     train_epochs=1, plugins=list(plugins), evaluator=evaluator)
    return strategy, stream


def test_predicted_and_realised_side_by_side_and_direct_recomputation():
    metric = ArchitectureDrivenShiftMetric(calibration_size=64, path="budget", seed=2)
    snapshot = Snapshot()
    text = io.StringIO()
    strategy, stream = strategy_for(metrics=[metric], plugins=[snapshot], loggers=[TextLogger(text)])
    for experience in stream.benchmark.train_stream[:2]:
        strategy.train(experience)
    strategy.eval(stream.benchmark.test_stream[:1])  # TextLogger prints buffered values here
    last = strategy.evaluator.get_last_metrics()
    suffix = "train_phase/train_stream/Task000/Exp001"
    names = ("ADS", "ADSFirstStep", "ADSPathFactor", "ADSLayerShift", "ADSOldECEBefore",
             "ADSRealisedShift", "ADSOldECE")
    for name in names:
        assert f"{name}/{suffix}" in last, name
        assert f"{name}/{suffix}" in text.getvalue(), name
    assert not any(k.startswith("ADS") and k.endswith("Exp000") for k in last)  # nothing before exp 1
    assert len(metric.history) == 1 and metric.result() == last[f"ADS/{suffix}"]

    # Same checkpoint, samples and settings: a direct call gives the logged prediction.
    record, cal, before = metric.history[-1], metric.calibration, snapshot.models[-1]
    n_batches = math.ceil(len(stream.benchmark.train_stream[1].dataset) / 32)
    assert record["steps"] == n_batches and record["lr"] == pytest.approx(0.05 / (1 - 0.9))
    assert record["n_old"] == 64 and torch.all(cal["old_targets"] < 2)  # old set = experience 0
    direct = architecture_driven_shift(before, nn.CrossEntropyLoss(), cal["old_inputs"], cal["new_inputs"],
                                       cal["new_targets"], lr=0.5, steps=n_batches)
    assert last[f"ADS/{suffix}"] == pytest.approx(direct.ads, rel=1e-6)
    assert last[f"ADSPathFactor/{suffix}"] == pytest.approx(0.5 * n_batches)
    assert last[f"ADSLayerShift/{suffix}"] == pytest.approx(
        {n: direct.path_factor * s for n, s in zip(direct.layer_names, direct.layer_shifts)}, rel=1e-6)
    # Realised: the true shift on the same old set between the checkpoint and the trained model.
    assert last[f"ADSRealisedShift/{suffix}"] == pytest.approx(
        logit_shift(before, strategy.model, cal["old_inputs"]), rel=1e-6)
    with torch.no_grad():
        strategy.model.eval()
        ece = expected_calibration_error(strategy.model(cal["old_inputs"]), cal["old_targets"])
    assert last[f"ADSOldECE/{suffix}"] == pytest.approx(ece, rel=1e-6)
    assert record["realised_shift"] > 0 and record["ads"] > 0


@pytest.mark.parametrize("path_kwargs", [{"path": "probe", "probe_steps": 3}, {}], ids=["probe", "default"])
def test_multihead_adam_probe_and_run_unchanged(path_kwargs):
    """Task-incremental (multi-head) with Adam and the probe or the default (logit) path; the run
    ends with the same weights, optimizer state and RNG as a run without the metric, although the
    training samples carry noise drawn from the global RNG at every read (a random transform)."""
    plain, stream = strategy_for(multihead=True, adam=True, noise=0.5)
    metric = ArchitectureDrivenShiftMetric(calibration_size=48, **path_kwargs)
    measured, _ = strategy_for(metrics=[metric], multihead=True, adam=True, noise=0.5)
    rng_after = []
    for strategy in (plain, measured):
        torch.manual_seed(123)
        for experience in stream.benchmark.train_stream[:3]:
            strategy.train(experience)
        rng_after.append(torch.get_rng_state())
    assert len(metric.history) == 2
    assert metric.history[-1]["optimizer"] == "adam" and metric.history[-1]["n_old"] == 48
    assert 0 < metric.history[-1]["path_factor"] <= metric.history[-1]["lr"] * metric.history[-1]["steps"]
    last = measured.evaluator.get_last_metrics()
    assert "ADS/train_phase/train_stream/Task002/Exp002" in last
    assert "ADSRealisedShift/train_phase/train_stream/Task002/Exp002" in last
    for p, q in zip(plain.model.parameters(), measured.model.parameters(), strict=True):
        assert torch.equal(p, q)
    for p, q in zip(plain.model.parameters(), measured.model.parameters()):
        a, b = plain.optimizer.state[p], measured.optimizer.state[q]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(*rng_after)


def test_parameter_groups_at_different_step_sizes_are_refused_before_any_training():
    # ADS models one step size; reading the first group's lr (a backbone at a lower rate) would predict
    # silently wrong, so the metric refuses at the first experience, before a single step
    stream = digits_stream()
    torch.manual_seed(0)
    model = build_model("mlp", stream.input_shape, stream.n_classes, hidden=(32, 16))
    params = list(model.parameters())

    def strategy(groups, metric):
        return Naive(model=model, optimizer=torch.optim.SGD(groups, lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1,
                     evaluator=EvaluationPlugin(metric))

    before = [p.detach().clone() for p in params]
    uneven = [{"params": params[:2], "lr": 0.005}, {"params": params[2:]}]
    with pytest.raises(ValueError, match=r"groups step at different sizes \(0.05, 0.5 \(lr / \(1 - momentum\)\)\)"):
        strategy(uneven, ArchitectureDrivenShiftMetric()).train(stream.benchmark.train_stream[0])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing was trained
    explicit = ArchitectureDrivenShiftMetric(lr=0.1)  # the user names the step size ADS models: accepted
    even = ArchitectureDrivenShiftMetric()  # two groups at one rate: read as that rate
    for metric, groups in ((explicit, uneven), (even, [{"params": params[:2]}, {"params": params[2:]}])):
        run = strategy([dict(g) for g in groups], metric)
        for experience in stream.benchmark.train_stream[:2]:
            run.train(experience)
    assert explicit.history[-1]["lr"] == 0.1 and even.history[-1]["lr"] == pytest.approx(0.05 / (1 - 0.9))


@pytest.mark.parametrize("kwargs, argument", [
    ({"calibration_size": 0}, "calibration_size"),
    ({"lr": -1.0}, "lr"),
    ({"steps": 0}, "steps"),
    ({"optimizer": "rmsprop"}, "optimizer"),
    ({"path": "exact"}, "path"),
    ({"probe_steps": 1}, "probe_steps"),
    ({"n_bins": 0}, "n_bins"),
    ({"seed": -1}, "seed"),
])
def test_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        ArchitectureDrivenShiftMetric(**kwargs)


def test_result_and_reset():
    metric = ArchitectureDrivenShiftMetric()
    assert metric.result() is None and str(metric) == "ArchitectureDrivenShift"
    metric.history.append({"ads": 2.0})
    assert metric.result() == 2.0
    metric.reset()
    assert metric.result() is None and metric.calibration is None
