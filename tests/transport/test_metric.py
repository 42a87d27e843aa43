"""TransportKeyMetric inside a 3-experience Avalanche run with EWC and Replay, through the loggers."""

import io

import pytest
import torch
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.logging import InteractiveLogger, TensorboardLogger, TextLogger
from avalanche.training.plugins import EvaluationPlugin, EWCPlugin, ReplayPlugin
from avalanche.training.supervised import Naive
from torch import nn

from avalanche_plugins import TransportKeyMetric
from avalanche_plugins.core.calls import sample_stride
from avalanche_plugins.transport import (
    fit_transport_key,
    gauss_newton_key,
    stage_activations,
    stitch,
    stitched_accuracy,
)
from tests.cases import build_model
from tests.fixtures import digits_stream, evaluator

STAGES = ["trunk.features.0", "trunk.features.1"]
PREFIX = "TransportKeyAcc/eval_phase/test_stream/Task000/Exp000"


def run(metric=None, tmp_path=None, text=None):
    stream = digits_stream(task_incremental=True)
    torch.manual_seed(0)
    model = build_model("cnn", stream.input_shape, 2, multihead=True, widths=(8, 16))
    loggers = [] if metric is None else [TextLogger(text), InteractiveLogger(),
                                         TensorboardLogger(tb_log_dir=str(tmp_path / "tb"))]
    evaluator = EvaluationPlugin(accuracy_metrics(experience=True), *([metric] if metric else []),
                                 loggers=loggers)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=2, eval_mb_size=64,
                     plugins=[EWCPlugin(ewc_lambda=1.0), ReplayPlugin(mem_size=40)], evaluator=evaluator)
    for experience in stream.benchmark.train_stream[:3]:
        strategy.train(experience)
        strategy.eval(stream.benchmark.test_stream[:3])
    return strategy, stream, loggers


def test_metric_logs_stitched_accuracy_and_recovery_and_leaves_training_alone(tmp_path):
    metric = TransportKeyMetric(stages=STAGES, n_anchors=20, experiences=[0, 1], gauss_newton_iterations=1)
    text = io.StringIO()
    strategy, stream, loggers = run(metric, tmp_path, text)
    last = strategy.evaluator.get_last_metrics()

    for stage in STAGES:
        for family in ("identity", "channel", "cross_channel"):
            assert 0.0 <= last[f"{PREFIX}/stage={stage}/family={family}"] <= 1.0
        for control in ("channel_permutation", "global_shuffle", "within_class_shuffle"):
            assert f"{PREFIX}/stage={stage}/family=channel/control={control}" in last
        assert 0.0 <= last[f"{PREFIX}/stage={stage}/family=cross_channel+gauss_newton"] <= 1.0
    rec_name = f"TransportKeyRecovery/eval_phase/test_stream/Task000/Exp000/stage={STAGES[0]}/family=channel"
    assert rec_name in last
    # acc_AB is the strategy's own accuracy on the same batches
    assert last["TransportKeyAccUpdated/eval_phase/test_stream/Task000/Exp000"] == pytest.approx(
        last["Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp000"])
    # no stitched values for the experience just trained (nothing to recover yet)
    assert not any(k.startswith("TransportKeyAcc/eval_phase/test_stream/Task002") for k in last)
    assert {(r["experience"], r["after"]) for r in metric.history} == {(0, 1), (0, 2), (1, 2)}

    # independent recomputation from the snapshot, its anchors and the test data
    snap = metric.snapshots[0]
    test = stream.benchmark.test_stream[0].dataset.eval()
    x, y, t = (torch.stack([test[i][k] if k == 0 else torch.as_tensor(test[i][k]) for i in range(len(test))])
               for k in (0, 1, 2))
    model = strategy.model
    with torch.no_grad():
        model.eval()
        u = stage_activations(model, STAGES[1], snap["x"], snap["task"])
        v = stage_activations(snap["model"], STAGES[1], snap["x"], snap["task"])
    key = fit_transport_key(u, v, "cross_channel", ridge=1e-4)
    direct = stitched_accuracy(stitch(model, snap["model"], STAGES[1], key), x, y, t)
    assert last[f"{PREFIX}/stage={STAGES[1]}/family=cross_channel"] == pytest.approx(direct)
    gauss_newton_key(key, stitch(model, snap["model"], STAGES[1], key), snap["x"], snap["task"], iterations=1)
    direct = stitched_accuracy(stitch(model, snap["model"], STAGES[1], key), x, y, t)
    assert last[f"{PREFIX}/stage={STAGES[1]}/family=cross_channel+gauss_newton"] == pytest.approx(direct)
    assert last["TransportKeyAccCheckpoint/eval_phase/test_stream/Task000/Exp000"] == pytest.approx(
        stitched_accuracy(snap["model"], x, y, t))

    # loggers: text and TensorBoard (scalars and the per-stage figure)
    assert f"{PREFIX}/stage={STAGES[0]}/family=channel" in text.getvalue()
    tb = loggers[2]
    tb.writer.flush()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "images": 0}).Reload()
    assert f"{PREFIX}/stage={STAGES[0]}/family=channel" in events.Tags()["scalars"]
    assert any(tag.startswith("TransportKeyProfile") for tag in events.Tags()["images"])

    # the metric did not change training: same final weights as a run without it
    plain, _, _ = run()
    for (name, a), b in zip(strategy.model.state_dict().items(), plain.model.state_dict().values()):
        assert torch.equal(a, b), name



def test_eval_samples_evaluates_every_stride_th_sample_of_the_experience(tmp_path):
    metric = TransportKeyMetric(stages=STAGES, n_anchors=20, experiences=[0], controls=False, eval_samples=50)
    strategy, stream, _ = run(metric, tmp_path, io.StringIO())
    last = strategy.evaluator.get_last_metrics()
    test = stream.benchmark.test_stream[0].dataset.eval()
    stride = sample_stride(len(test), 50)
    assert stride > 1
    kept = range(0, len(test), stride)  # the evaluation order: the dataset's (no shuffling)
    x, y, t = (torch.stack([test[i][k] if k == 0 else torch.as_tensor(test[i][k]) for i in kept]) for k in (0, 1, 2))
    snap, model = metric.snapshots[0], strategy.model
    with torch.no_grad():
        model.eval()
        u = stage_activations(model, STAGES[0], snap["x"], snap["task"])
        v = stage_activations(snap["model"], STAGES[0], snap["x"], snap["task"])
    key = fit_transport_key(u, v, "channel", ridge=1e-4)
    expected = {f"{PREFIX}/stage={STAGES[0]}/family=channel": stitched_accuracy(stitch(model, snap["model"], STAGES[0], key), x, y, t),
                "TransportKeyAccCheckpoint/eval_phase/test_stream/Task000/Exp000": stitched_accuracy(snap["model"], x, y, t),
                "TransportKeyAccUpdated/eval_phase/test_stream/Task000/Exp000": stitched_accuracy(model, x, y, t)}
    for name, value in expected.items():  # counts over len(kept) samples: equal up to float32 logits' ties
        assert last[name] == pytest.approx(value, abs=0.5 / len(kept)), name
    assert metric.history[-1]["samples"] == len(kept) < len(test)
    with pytest.raises(ValueError, match="eval_samples"):
        TransportKeyMetric(stages=STAGES, eval_samples=0)

def test_anchors_read_through_a_random_transform_leave_the_run_unchanged():
    """The training data draw noise from torch's global RNG at every read, in training and
    evaluation mode alike (like a torchvision dataset built with ``transform=RandomCrop``): reading
    the anchors after experience 0 must not shift the random stream that shuffles and augments
    experience 1 (the metric restores the RNG state around the reads)."""

    def train(metric=None):
        stream = digits_stream(task_incremental=True, noise=0.5)
        torch.manual_seed(0)
        model = build_model("cnn", stream.input_shape, 2, multihead=True, widths=(4, 8))
        strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                         criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1,
                         evaluator=evaluator(*([metric] if metric else [])))
        for experience in stream.benchmark.train_stream[:2]:
            strategy.train(experience)
        return strategy, torch.get_rng_state()

    metric = TransportKeyMetric(stages=["trunk.features.0"], families=("identity",), n_anchors=20,
                                controls=False, experiences=[0])
    (measured, rng_measured), (plain, rng_plain) = train(metric), train()
    assert list(metric.snapshots) == [0] and metric.snapshots[0]["x"].shape[0] == 20
    for (name, a), b in zip(measured.model.state_dict().items(), plain.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(rng_measured, rng_plain)


def test_auto_stages_change_nothing_else_in_the_run():
    """``stages="auto"`` chooses stages at the first training experience, after the untrained
    model's evaluation (the study's b̄ of forward transfer), on a model with BatchNorm and data that
    draw from the global RNG at every read: the probe runs on a detached copy, so every metric of
    the run, the transport values included, and the final weights and BatchNorm statistics are
    bit-identical to a run given the same stages explicitly."""
    from avalanche.evaluation.metrics import loss_metrics

    def train(stages):
        stream = digits_stream(task_incremental=True, noise=0.5)
        torch.manual_seed(0)
        model = build_model("cnn", stream.input_shape, 2, multihead=True, widths=(4, 8))
        metric = TransportKeyMetric(stages=stages, families=("identity", "channel"), n_anchors=20,
                                    controls=False, experiences=[0])
        plugin = EvaluationPlugin(accuracy_metrics(experience=True, stream=True), loss_metrics(experience=True),
                                  metric, loggers=[])
        strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                         criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1, eval_mb_size=64,
                         evaluator=plugin)
        strategy.eval(stream.benchmark.test_stream[:3])  # the untrained model first
        for experience in stream.benchmark.train_stream[:3]:
            strategy.train(experience)
            strategy.eval(stream.benchmark.test_stream[:3])
        values = {name: values for name, (_, values) in plugin.get_all_metrics().items()
                  if not name.startswith("TransportKeyProfile")}  # figures: images
        return metric, values, strategy.model.state_dict(), torch.get_rng_state()

    auto, auto_values, auto_state, auto_rng = train("auto")
    assert auto.stages == ["trunk.features.0", "trunk"]  # before the second conv block; before the heads
    explicit, values, state, rng = train(list(auto.stages))
    assert any(name.startswith("TransportKeyAcc/") for name in values)
    assert auto_values == values
    for (name, a), b in zip(auto_state.items(), state.values(), strict=True):
        assert torch.equal(a, b), name  # running_mean / running_var included
    assert torch.equal(auto_rng, rng)


def test_auto_stages_leave_the_model_alone():
    from avalanche_plugins.transport.stages import auto_stages

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 3)).train()
    calls = []
    model[1].register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(5, 1, 8, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    assert auto_stages(model, x) == ["2", "4"]  # before the second conv and before the head
    assert model.training and not calls  # mode kept; hooks of the model never run on the probe
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BN statistics too
    assert torch.equal(rng, torch.get_rng_state())


def test_bad_arguments():
    with pytest.raises(ValueError, match="stages must be a non-empty list"):
        TransportKeyMetric(stages="layer1")
    with pytest.raises(ValueError, match="families must be one of"):
        TransportKeyMetric(stages=["a"], families=("affine",))
    with pytest.raises(ValueError, match="n_anchors must be"):
        TransportKeyMetric(stages=["a"], n_anchors=0)
    with pytest.raises(ValueError, match="gauss_newton_iterations must be"):
        TransportKeyMetric(stages=["a"], gauss_newton_iterations=-1)
