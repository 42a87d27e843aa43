"""The metrics' own settings meet the data before training (issue 38, points 7 to 9).

* A setting an experience of the stream cannot meet (``n_anchors`` per class, OR's minibatch and
  ground-truth halves) is refused before the first optimizer step, naming the metric, the setting,
  the experience (a later one too) and the fix; the fix, applied, serves.
* A stage whose module returns a tuple (Avalanche's ``SimpleSequenceClassifier`` LSTM) is refused
  before training with the way out (``stage_transforms``), and with it the metric stitches there:
  the identity-key stitched logits are exactly the checkpoint's head on the updated LSTM's output.
* A measurement on fewer samples than asked warns once (metric, setting, count asked and used) and
  records the count used with every value (history, and ``...SamplesUsed`` beside the values).
"""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import avalanche_plugins as ap
from avalanche_plugins.transport import stitch
from tests.fixtures import digits_arrays, evaluator, few_digits_benchmark


@functools.cache
def uneven_benchmark(first: int, second: int, sequences: bool = False):
    """Digits 0, 1 (``first`` training images each: experience 0) and 2, 3 (``second`` each:
    experience 1); 5 test images per class. ``sequences``: each image as 8 rows of 8 (an LSTM's input)."""
    from avalanche.benchmarks import nc_benchmark

    xtr, ytr, xte, yte = digits_arrays()

    def pick(x, y, counts):
        idx = torch.cat([torch.nonzero(y == c).reshape(-1)[:n] for c, n in enumerate(counts)])
        inputs = x[idx].reshape(-1, 8, 8) if sequences else x[idx]
        return TensorDataset(inputs, y[idx])

    return nc_benchmark(pick(xtr, ytr, (first, first, second, second)), pick(xte, yte, (5, 5, 5, 5)),
                        n_experiences=2, task_labels=False, seed=0, fixed_class_order=[0, 1, 2, 3],
                        class_ids_from_zero_from_first_exp=True)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def lstm(batch_first: bool = True):
    from avalanche.models import SimpleSequenceClassifier

    torch.manual_seed(0)
    return SimpleSequenceClassifier(8, 16, 4, batch_first=batch_first)


class StepCounter:
    def __init__(self):
        self.steps = 0

    def after_update(self, strategy, **kwargs):
        self.steps += 1


def naive(metrics, model=None):
    from avalanche.training.supervised import Naive

    model = mlp() if model is None else model
    counter = StepCounter()
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=10, train_epochs=1, plugins=[counter],
                     evaluator=evaluator(*metrics))
    return strategy, counter


def refused(stream, metric, model=None) -> str:
    """The refusal's message, after asserting no step was taken and the model is unchanged."""
    strategy, counter = naive([metric], model)
    before = copy.deepcopy(strategy.model.state_dict())
    with pytest.raises(ValueError) as error:
        for experience in stream:
            strategy.train(experience, num_workers=0)
    assert counter.steps == 0
    assert all(torch.equal(v, before[k]) for k, v in strategy.model.state_dict().items())
    return str(error.value)


def emitted(strategy, name: str) -> list:
    return [v for k, v in strategy.evaluator.get_last_metrics().items() if k.startswith(f"{name}/")]


# ------------------------------------------------------------------- point 7: anchors per class


def test_default_anchors_on_thirty_images_per_class_are_refused_before_training_and_the_fix_serves():
    bench = few_digits_benchmark(4, 30, 10, 2)  # 2 classes of 30 images per experience
    message = refused(bench.train_stream, ap.TransportKeyMetric(stages=["2"]))
    assert message.startswith("TransportKeyMetric refuses its settings before training: experience 0")
    assert "n_anchors=100 asks 50 anchors of each" in message and "class 0 has 30 samples" in message
    assert "choose n_anchors <= 60" in message

    metric = ap.TransportKeyMetric(stages=["2"], n_anchors=60)
    strategy, counter = naive([metric])
    for experience in bench.train_stream:
        strategy.train(experience, num_workers=0)
    assert counter.steps == 12 and sorted(metric.snapshots) == [0, 1]
    assert metric.snapshots[0]["y"].tolist() == [0] * 30 + [1] * 30


def test_fewer_anchors_than_classes_are_refused():
    message = refused(few_digits_benchmark(4, 30, 10, 2).train_stream, ap.TransportKeyMetric(stages=["2"], n_anchors=1))
    assert "more than n_anchors=1" in message and "choose n_anchors >= 2" in message


def test_a_later_experience_short_of_anchors_is_refused_before_the_first():
    bench = uneven_benchmark(30, 8)
    message = refused(bench.train_stream, ap.TransportKeyMetric(stages=["2"], n_anchors=20))
    assert message.startswith("TransportKeyMetric refuses its settings before training: experience 1 has 16 samples of 2 classes")
    assert "class 2 has 8 samples" in message and "choose n_anchors <= 16" in message
    assert "experiences=[...]" in message

    metric = ap.TransportKeyMetric(stages=["2"], n_anchors=20, experiences=[0])  # experience 1 not snapshotted
    strategy, counter = naive([metric])
    for experience in bench.train_stream:
        strategy.train(experience, num_workers=0)
    assert counter.steps == 8 and sorted(metric.snapshots) == [0]


# ------------------------------------------------------------- point 8: a stage returning a tuple


def test_a_tuple_stage_is_refused_before_training_with_the_way_out():
    message = refused(uneven_benchmark(20, 20, True).train_stream, ap.TransportKeyMetric(stages=["rnn"], n_anchors=8),
                      lstm())
    assert message.startswith("TransportKeyMetric refuses this model before training")
    assert "stage='rnn' outputs a tuple of 2" in message and "stage_transforms={'rnn': 0}" in message


@pytest.mark.parametrize("select", [0, lambda out: out[0]], ids=["index", "function"])
def test_with_stage_transforms_the_lstm_stage_is_stitched(select):
    bench = uneven_benchmark(20, 20, True)
    metric = ap.TransportKeyMetric(stages=["rnn"], n_anchors=8, stage_transforms={"rnn": select}, controls=False)
    strategy, counter = naive([metric], lstm())
    for experience in bench.train_stream:
        strategy.train(experience, num_workers=0)
        strategy.eval(bench.test_stream, num_workers=0)
    assert counter.steps == 8
    record = metric.history[-1]
    assert (record["experience"], record["after"]) == (0, 1)

    # identity key: the checkpoint's head on the updated LSTM's output, exactly, batch by batch
    test = bench.test_stream[0].dataset.eval()
    x = torch.stack([test[i][0] for i in range(len(test))])
    y = torch.as_tensor([int(test[i][1]) for i in range(len(test))])
    snapshot, model = metric.snapshots[0]["model"], strategy.model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(x), strategy.eval_mb_size):
            xb = x[start:start + strategy.eval_mb_size]
            stitched = stitch(model, snapshot, "rnn", nn.Identity(), select)
            direct = snapshot.classifier(model.rnn(xb)[0][:, -1])
            assert torch.equal(stitched(xb), direct)
            correct += int((direct.argmax(1) == y[start:start + len(xb)]).sum())
    assert record["acc"]["stage=rnn/family=identity"] == correct / len(x)


def test_a_time_first_lstm_and_a_transform_that_builds_a_new_tensor_are_refused():
    bench = uneven_benchmark(20, 20, True)
    message = refused(bench.train_stream, ap.TransportKeyMetric(stages=["rnn"], n_anchors=8,
                                                               stage_transforms={"rnn": 0}), lstm(batch_first=False))
    assert message.startswith("TransportKeyMetric refuses this model before training") and "batch_first" in message
    message = refused(bench.train_stream, ap.TransportKeyMetric(stages=["rnn"], n_anchors=8,
                                                               stage_transforms={"rnn": lambda out: out[0] * 1}),
                      lstm())
    assert "must return one element of its tuple" in message and "index or key instead" in message


def test_stage_transforms_are_checked_at_construction():
    with pytest.raises(TypeError, match=r"stage_transforms\['rnn'\] must be an index, a key or a function"):
        ap.TransportKeyMetric(stages=["rnn"], stage_transforms={"rnn": 1.5})


# ------------------------------------------------------ OR's minibatch and ground truth vs the data


def test_a_minibatch_larger_than_a_later_experience_is_refused_before_the_first():
    bench = uneven_benchmark(10, 3)  # experience 1: 6 images
    message = refused(bench.train_stream, ap.OptimizationReadinessMetric(n_samples=64, batch_size=8, n_batches=2))
    assert message.startswith("OptimizationReadinessMetric refuses its settings before training: experience 1")
    assert "fewer than its minibatch batch_size=8" in message and "choose batch_size <= 6" in message
    message = refused(bench.train_stream, ap.OptimizationReadinessMetric(n_samples=64, batch_size=4, n_batches=2,
                                                                         ground_truth_k=2))
    assert "half of them (3) train the ground truth" in message
    assert "choose batch_size <= 3, or ground_truth_k=None" in message


# ------------------------------------------------------------- point 9: honest sample counts


def _run_two_small_experiences(metric):
    bench = few_digits_benchmark(4, 5, 5, 2)  # 2 experiences of 10 images
    strategy, counter = naive([metric])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for experience in bench.train_stream:
            strategy.train(experience, num_workers=0)
    assert counter.steps == 2
    return strategy, [str(w.message) for w in caught if str(w.message).startswith(str(type(metric).__name__))]


def test_readiness_on_fewer_samples_than_asked_warns_once_and_records_the_count():
    metric = ap.OptimizationReadinessMetric(batch_size=4, n_batches=2)  # n_samples=1024
    strategy, said = _run_two_small_experiences(metric)
    assert len(said) == 1
    assert "n_samples=1024" in said[0] and "measured on the 10 there are" in said[0]
    assert [(r["n_samples_asked"], r["n_samples_used"]) for r in metric.history] == [(1024, 10), (1024, 10)]
    assert emitted(strategy, "ORSamplesUsed") == [10, 10]  # beside each experience's OR


def test_ads_on_fewer_samples_than_asked_warns_once_and_records_the_count():
    metric = ap.ArchitectureDrivenShiftMetric()  # calibration_size=64
    strategy, said = _run_two_small_experiences(metric)
    assert len(said) == 1 and "calibration_size=64" in said[0] and "the 10 there are" in said[0]
    record = metric.history[-1]
    assert (record["calibration_size"], record["n_old"], record["n_new"], record["n_samples_used"]) == (64, 10, 10, 10)
    assert emitted(strategy, "ADSSamplesUsed") == [10]


def test_layer_sensitivity_on_fewer_samples_than_asked_warns_once_and_records_the_count():
    metric = ap.LayerSensitivityMetric()  # n_samples=128
    strategy, said = _run_two_small_experiences(metric)
    assert len(said) == 1 and "n_samples=128" in said[0] and "the 10 there are" in said[0]
    assert [(p.n_samples_asked, p.n_samples_used) for p in metric.history] == [(128, 10), (128, 10)]
    assert emitted(strategy, "LayerSensitivitySamplesUsed") == [10, 10]


def test_the_study_summary_carries_the_sample_counts():
    from avalanche_plugins.study.catalog.diagnostics import summary_scalars

    titles = summary_scalars()
    assert titles["ORSamplesUsed"] == "OR samples" and titles["ADSSamplesUsed"] == "ADS samples"
    assert titles["LayerSensitivitySamplesUsed"] == "κ samples"
