"""OptimizationReadinessMetric: names and values through Avalanche, loggers, no side effects, bad arguments."""

import copy
import io

import pytest
import torch
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.logging import TensorboardLogger, TextLogger
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.supervised import Naive
from torch import nn

from avalanche_plugins import OptimizationReadinessMetric
from avalanche_plugins._avalanche.data import experience_tensors
from avalanche_plugins.readiness import (
    active_unit_fraction,
    entk_energy_rank,
    hessian_energy_rank,
    k_step_gain,
    optimization_readiness,
    representation_ranks,
)
from tests.cases import build_model
from tests.fixtures import digits_stream

SUFFIX = "train_phase/train_stream/Task001/Exp001"
BASELINE_NAMES = ("ORBaselineEffectiveRank", "ORBaselineEnergyRank", "ORBaselineENTKEnergyRank",
                  "ORBaselineHessianEnergyRank", "ORBaselineActiveUnitFraction")


class Snapshot(SupervisedPlugin):
    """Before the evaluator: copies the checkpoint, the RNG state and the metric's samples."""

    def __init__(self, n_samples, seed=0):
        super().__init__()
        self.n_samples, self.seed, self.records = n_samples, seed, []

    def before_training_exp(self, strategy, **kwargs):
        exp = strategy.clock.train_exp_counter
        x, y, t = experience_tensors(strategy, n_samples=self.n_samples, seed=self.seed + exp)
        self.records.append({"model": copy.deepcopy(strategy.model), "x": x, "y": y, "t": t,
                             "rng": torch.get_rng_state(),
                             "grads": [None if p.grad is None else p.grad.clone()
                                       for p in strategy.model.parameters()],
                             "optimizer": copy.deepcopy(strategy.optimizer.state_dict())})


class Unchanged(SupervisedPlugin):
    """After the evaluator: the metric left model, grads, optimizer and RNG as the snapshot saw them."""

    def __init__(self, snapshot):
        super().__init__()
        self.snapshot, self.checked = snapshot, 0

    def before_training_exp(self, strategy, **kwargs):
        record = self.snapshot.records[-1]
        before = record["model"].state_dict()
        for name, value in strategy.model.state_dict().items():
            assert torch.equal(value, before[name]), name
        for p, g in zip(strategy.model.parameters(), record["grads"], strict=True):
            assert (p.grad is None and g is None) or torch.equal(p.grad, g)
        assert strategy.model.training  # mode restored
        assert torch.equal(torch.get_rng_state(), record["rng"])
        assert str(strategy.optimizer.state_dict()) == str(record["optimizer"])
        self.checked += 1


def strategy_for(metrics=(), plugins=(), loggers=(), multihead=True, noise=0.0):
    stream = digits_stream(task_incremental=multihead, noise=noise)
    torch.manual_seed(0)
    model = build_model("mlp", stream.input_shape, stream.n_classes if not multihead else 2,
                        hidden=(32, 16), multihead=multihead)
    evaluator = EvaluationPlugin(accuracy_metrics(experience=True), *metrics, loggers=list(loggers))
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1,
                     plugins=list(plugins), evaluator=evaluator)
    return strategy, stream


def test_names_values_loggers_and_direct_recomputation(tmp_path):
    n = 96
    metric = OptimizationReadinessMetric(n_samples=n, n_batches=32, baselines=True, n_probe=40,
                                         ground_truth_k=2, ground_truth_runs=8, seed=3)
    snapshot = Snapshot(n, seed=3)
    text = io.StringIO()
    tb = TensorboardLogger(tb_log_dir=str(tmp_path / "tb"))
    strategy, stream = strategy_for(metrics=[metric], plugins=[snapshot], loggers=[TextLogger(text), tb])
    unchanged = Unchanged(snapshot)
    strategy.plugins.append(unchanged)  # runs after the evaluator
    for experience in stream.benchmark.train_stream[:2]:
        strategy.train(experience)
        strategy.eval(stream.benchmark.test_stream[:1])  # TextLogger prints buffered values here
    assert unchanged.checked == 2

    last = strategy.evaluator.get_last_metrics()
    or_, s, r, loss = (last[f"{name}/{SUFFIX}"] for name in
                       ("OptimizationReadiness", "ORStrength", "ORReliability", "ORLoss"))
    assert "OptimizationReadiness/train_phase/train_stream/Task000/Exp000" in last
    assert or_ == pytest.approx(s * r, rel=1e-12)
    assert metric.result() == or_
    assert len(metric.history) == 2 and metric.history[-1]["experience"] == 1

    # Same samples, same seed, same checkpoint (the copy taken just before the metric ran).
    record = snapshot.records[-1]
    model, x, y, t = record["model"], record["x"], record["y"], record["t"]
    direct = optimization_readiness(model, nn.CrossEntropyLoss(), x, y, batch_size=4, n_batches=32,
                                    seed=3 + 1, task_labels=t)
    assert (or_, s, r, loss) == pytest.approx(
        (direct.readiness, direct.strength, direct.reliability, direct.loss), rel=1e-9)
    assert metric.history[-1]["n_samples"] == n == x.shape[0]

    # Baselines: dicts per hidden layer and floats, equal to direct calls on the same probes.
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(4))
    probe = perm[:40]
    ranks = representation_ranks(model, x[probe], task_labels=t[probe])
    assert set(ranks) == {"trunk.features.1", "trunk.features.3"}
    assert last[f"ORBaselineEffectiveRank/{SUFFIX}"] == pytest.approx(
        {k: v["effective_rank"] for k, v in ranks.items()})
    assert last[f"ORBaselineEnergyRank/{SUFFIX}"] == {k: v["energy_rank"] for k, v in ranks.items()}
    assert last[f"ORBaselineENTKEnergyRank/{SUFFIX}"] == entk_energy_rank(model, x[probe], task_labels=t[probe])
    assert last[f"ORBaselineHessianEnergyRank/{SUFFIX}"] == hessian_energy_rank(
        model, nn.CrossEntropyLoss(), x[probe], y[probe], max_params=1, task_labels=t[probe])
    assert last[f"ORBaselineActiveUnitFraction/{SUFFIX}"] == active_unit_fraction(
        model, x[probe], task_labels=t[probe])
    assert all(isinstance(last[f"{name}/{SUFFIX}"], (float, dict)) for name in BASELINE_NAMES)

    # Ground truth: first half trains, second half validates; the model is the task-1 head.
    train, val = perm[: n // 2], perm[n // 2:]
    gain = k_step_gain(model, nn.CrossEntropyLoss(), x[train], y[train], x[val], y[val], k=2, lr=0.01,
                       batch_size=4, n_runs=8, seed=4,
                       task_labels=torch.ones(len(train), dtype=torch.long))
    assert last[f"ORGroundTruthGain/{SUFFIX}"] == pytest.approx(gain.gain, rel=1e-9)
    assert last[f"ORGroundTruthGainStdErr/{SUFFIX}"] == pytest.approx(gain.stderr, rel=1e-9)
    assert metric.history[-1]["ground_truth"]["n_train"] == n // 2

    # Loggers: text and TensorBoard (dicts become one scalar per layer).
    assert f"OptimizationReadiness/{SUFFIX}" in text.getvalue()
    assert f"ORBaselineEffectiveRank/{SUFFIX}/trunk.features.1" in text.getvalue()
    tb.writer.flush()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for name in ("OptimizationReadiness", "ORStrength", "ORReliability", "ORLoss", "ORGroundTruthGain",
                 "ORBaselineENTKEnergyRank", "ORBaselineHessianEnergyRank", "ORBaselineActiveUnitFraction"):
        assert f"{name}/{SUFFIX}" in scalars, name
    assert f"ORBaselineEnergyRank/{SUFFIX}/trunk.features.3" in scalars
    assert events.Scalars(f"OptimizationReadiness/{SUFFIX}")[-1].value == pytest.approx(or_, rel=1e-6)


def test_per_sample_estimator_single_head_model():
    metric = OptimizationReadinessMetric(n_samples=64, estimator="per_sample", batch_size=2, seed=5)
    snapshot = Snapshot(64, seed=5)
    strategy, stream = strategy_for(metrics=[metric], plugins=[snapshot], multihead=False)
    for experience in stream.benchmark.train_stream[:2]:
        strategy.train(experience)
    last = strategy.evaluator.get_last_metrics()
    suffix = "train_phase/train_stream/Task000/Exp001"
    record = snapshot.records[-1]
    direct = optimization_readiness(record["model"], nn.CrossEntropyLoss(), record["x"], record["y"],
                                    batch_size=2, estimator="per_sample", seed=6)
    assert last[f"OptimizationReadiness/{suffix}"] == pytest.approx(direct.readiness, rel=1e-9)
    assert last[f"ORReliability/{suffix}"] == pytest.approx(direct.reliability, rel=1e-9)
    assert not any(k.startswith(("ORBaseline", "ORGroundTruth")) for k in last)


def test_metric_does_not_change_the_run():
    """Training samples carry noise drawn from the global RNG at every read (a random transform,
    also under evaluation transforms): the metric's reads must not shift the run's random stream."""
    plain, stream = strategy_for(noise=0.5)
    metric = OptimizationReadinessMetric(n_samples=64, n_batches=16, baselines=True, n_probe=24,
                                         ground_truth_k=1, ground_truth_runs=4)
    measured, _ = strategy_for(metrics=[metric], noise=0.5)
    rng_after = []
    for strategy in (plain, measured):
        torch.manual_seed(123)  # same shuffling stream for both runs
        for experience in stream.benchmark.train_stream[:3]:
            strategy.train(experience)
        rng_after.append(torch.get_rng_state())
    assert len(metric.history) == 3
    for p, q in zip(plain.model.parameters(), measured.model.parameters(), strict=True):
        assert torch.equal(p, q)
    for p, q in zip(plain.model.parameters(), measured.model.parameters()):
        a, b = plain.optimizer.state[p], measured.optimizer.state[q]
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    assert torch.equal(*rng_after)


@pytest.mark.parametrize("kwargs, argument", [
    ({"n_samples": 0}, "n_samples"),
    ({"n_samples": 2.5}, "n_samples"),
    ({"batch_size": 0}, "batch_size"),
    ({"n_samples": 8, "batch_size": 16}, "batch_size"),
    ({"n_batches": 0}, "n_batches"),
    ({"estimator": "exact"}, "estimator"),
    ({"baselines": 1}, "baselines"),
    ({"n_probe": 0}, "n_probe"),
    ({"ground_truth_k": 0}, "ground_truth_k"),
    ({"ground_truth_k": 1, "n_samples": 6, "batch_size": 4}, "ground_truth_k"),
    ({"ground_truth_lr": 0.0}, "ground_truth_lr"),
    ({"ground_truth_lr": float("nan")}, "ground_truth_lr"),
    ({"ground_truth_optimizer": "rmsprop"}, "ground_truth_optimizer"),
    ({"ground_truth_runs": 0}, "ground_truth_runs"),
    ({"seed": -1}, "seed"),
    ({"hessian_max_params": 0}, "hessian_max_params"),
    ({"diagnostics": ("bogus",)}, "diagnostics"),
    ({"diagnostics": "srank"}, "diagnostics"),
])
def test_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        OptimizationReadinessMetric(**kwargs)


def test_result_before_any_experience_and_reset():
    metric = OptimizationReadinessMetric()
    assert metric.result() is None
    metric.history.append({"readiness": 1.0})
    assert metric.result() == 1.0
    metric.reset()
    assert metric.result() is None and str(metric) == "OptimizationReadiness"


def test_opt_in_diagnostics_logged_beside_or_and_recomputed():
    """Issue 33: ``diagnostics=`` logs the declining-stream diagnostics beside OR under
    Name/phase/stream/TaskNNN/ExpNNN, each equal to a direct call on the snapshot; off by default."""
    from avalanche_plugins.readiness import (
        average_weight_magnitude,
        dormant_unit_fraction,
        effective_rank,
        feature_rank,
        hidden_features,
        srank,
    )
    from avalanche_plugins.readiness.lookahead import curvature_readiness, lookahead_readiness
    from avalanche_plugins.readiness.metric import DEFAULT_DIAGNOSTICS, DIAGNOSTICS

    n = 64
    metric = OptimizationReadinessMetric(n_samples=n, n_batches=16, n_probe=32, seed=2,
                                         diagnostics=tuple(DIAGNOSTICS), ground_truth_lr=0.05)
    snapshot = Snapshot(n, seed=2)
    strategy, stream = strategy_for(metrics=[metric], plugins=[snapshot], multihead=False)
    unchanged = Unchanged(snapshot)
    strategy.plugins.append(unchanged)
    strategy.train(stream.benchmark.train_stream[0])  # measured before its first iteration
    assert unchanged.checked == 1
    last = strategy.evaluator.get_last_metrics()
    suffix = "train_phase/train_stream/Task000/Exp000"
    assert OptimizationReadinessMetric().diagnostics == ()  # opt-in only
    assert set(DEFAULT_DIAGNOSTICS) <= set(DIAGNOSTICS)
    record = snapshot.records[-1]
    model, x, y = record["model"], record["x"], record["y"]
    loss_fn = nn.CrossEntropyLoss()
    probe = torch.randperm(n, generator=torch.Generator().manual_seed(2))[:32]
    feats = list(hidden_features(model, x[probe]).values())[-1]
    direct = {
        "grad_norm_sq": optimization_readiness(model, loss_fn, x, y, n_batches=16, seed=2).grad_norm_sq,
        "lookahead": lookahead_readiness(model, loss_fn, x, y, lr=0.05, k=10, n_runs=8, seed=2 + 7919).readiness,
        "lookahead_gd": lookahead_readiness(model, loss_fn, x[probe], y[probe], lr=0.05, k=10, n_runs=1,
                                            batch_size=32).readiness,
        "quadratic_gain": curvature_readiness(model, loss_fn, x, y, lr=0.05).quadratic_gain,
        "effective_rank": effective_rank(feats), "srank": srank(feats), "feature_rank": feature_rank(feats),
        "dormant_units": dormant_unit_fraction(model, x[probe]),
        "weight_magnitude": average_weight_magnitude(model),
    }
    assert set(direct) == set(DIAGNOSTICS)
    for name, value in direct.items():
        assert last[f"{DIAGNOSTICS[name]}/{suffix}"] == pytest.approx(value, rel=1e-6, abs=1e-12), name
    assert metric.history[-1]["seconds"]["diagnostics"] > 0
    assert OptimizationReadinessMetric(diagnostics=True).diagnostics == DEFAULT_DIAGNOSTICS
