"""Streams and settings a component cannot serve are refused before the first iteration, naming the
component, the reason and a fix (issue 38, cases 6, 7 and 9).

Case 6: on Avalanche's task-agnostic continuous stream (``split_continuous_linear_decay_stream``:
sub-experiences without an original experience) OR crashed at the first sub-experience and
LayerSensitivity, ADS and TransportKey after the last one, each with an ``AttributeError`` on None.
Case 7: TransportKey at ``n_anchors=100`` on a small experience trained it whole and then died.
Case 9: OR on an experience smaller than ``n_samples`` measured on fewer samples without a word."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import avalanche_plugins as ap
from tests.fixtures import evaluator, few_digits_benchmark


class IterationCounter:
    def __init__(self):
        self.iterations = 0

    def after_training_iteration(self, strategy, **kwargs):
        self.iterations += 1


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def _train(experiences, plugins=(), metrics=()):
    """Train on ``experiences``; returns ``(the error or None, iterations before it, metrics)``."""
    from avalanche.training import Naive

    counter = IterationCounter()
    model = _mlp()
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=8, plugins=[*plugins, counter],
                     evaluator=evaluator(*metrics))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            for experience in experiences:
                strategy.train(experience, num_workers=0)
        except ValueError as error:
            return error, counter.iterations
    return None, counter.iterations


def _continuous_stream():
    from avalanche.benchmarks.scenarios.online import split_continuous_linear_decay_stream

    bench = few_digits_benchmark(4, 20, 5, 2)
    return list(split_continuous_linear_decay_stream(list(bench.train_stream), experience_size=20,
                                                     iters_per_virtual_epoch=4, beta=0.5, shuffle=False))


COMPONENTS = {
    "OptimizationReadinessMetric": lambda: ([], [ap.OptimizationReadinessMetric(n_samples=16, batch_size=4, n_batches=2)]),
    "LayerSensitivityMetric": lambda: ([], [ap.LayerSensitivityMetric(n_samples=16)]),
    "ArchitectureDrivenShiftMetric": lambda: ([], [ap.ArchitectureDrivenShiftMetric(calibration_size=8)]),
    "TransportKeyMetric": lambda: ([], [ap.TransportKeyMetric(stages=["2"], n_anchors=4)]),
    "LayerAdaptiveEWCPlugin": lambda: ([ap.LayerAdaptiveEWCPlugin(ewc_lambda=1.0)], []),
    "GrowPlugin": lambda: ([ap.GrowPlugin(0.75, seed_compactness=0.25, grow_fraction_per_cycle=0.25)], []),
    "LayerAdaptiveLRPlugin": lambda: ([ap.LayerAdaptiveLRPlugin("smoothed", spectrum_samples=16)], []),
}


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_a_task_agnostic_stream_is_refused_before_the_first_iteration(component):
    plugins, metrics = COMPONENTS[component]()
    error, iterations = _train(_continuous_stream(), plugins, metrics)
    assert error is not None and iterations == 0
    message = str(error)
    assert component in message and "task-agnostic" in message
    assert "split_online_stream(..., access_task_boundaries=True)" not in message  # advice that cannot apply


def test_anchors_an_experience_cannot_fill_are_refused_before_training():
    bench = few_digits_benchmark(4, 20, 5, 2)  # 2 classes of 20 samples per experience
    error, iterations = _train(list(bench.train_stream), metrics=[ap.TransportKeyMetric(stages=["2"], n_anchors=100)])
    assert error is not None and iterations == 0
    assert "TransportKeyMetric" in str(error) and "n_anchors" in str(error)


def test_fewer_samples_than_asked_are_said_once_and_recorded():
    bench = few_digits_benchmark(4, 20, 5, 2)  # 40 samples per experience
    metric = ap.OptimizationReadinessMetric(n_samples=1024, batch_size=4, n_batches=2)
    with pytest.warns(UserWarning, match="OptimizationReadinessMetric") as caught:
        error, _ = _train(list(bench.train_stream), metrics=[metric])
    assert error is None
    said = [w for w in caught if "OptimizationReadinessMetric" in str(w.message) and "1024" in str(w.message)]
    assert len(said) == 1
    assert metric.history and all(r["n_samples_used"] == 40 for r in metric.history)


def _sequence_benchmark():
    """Digits as sequences of 8 rows of 8 pixels, for Avalanche's LSTM classifier (case 8)."""
    from avalanche.benchmarks.scenarios import benchmark_from_datasets
    from avalanche.benchmarks.utils import as_classification_dataset
    from torch.utils.data import TensorDataset

    from tests.fixtures import digits_arrays

    x_train, y_train, x_test, y_test = digits_arrays()
    keep = y_train < 4
    x, y = x_train[keep][:80].reshape(-1, 8, 8), y_train[keep][:80]
    parts = [(x[(y // 2) == e], y[(y // 2) == e]) for e in range(2)]
    datasets = []
    for xs, ys in parts:
        ds = TensorDataset(xs, ys)
        ds.targets = ys.tolist()
        datasets.append(as_classification_dataset(ds))
    return benchmark_from_datasets(train=datasets, test=datasets)


def _lstm():
    from avalanche.models import SimpleSequenceClassifier

    torch.manual_seed(0)
    return SimpleSequenceClassifier(input_size=8, hidden_size=8, n_classes=4)


def test_a_stage_with_a_tuple_output_is_refused_before_training_with_the_way_out():
    from avalanche.training import Naive

    bench = _sequence_benchmark()
    counter, model = IterationCounter(), _lstm()
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=8, plugins=[counter],
                     evaluator=evaluator(ap.TransportKeyMetric(stages=["rnn"], n_anchors=4)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(Exception) as caught:
            strategy.train(bench.train_stream[0], num_workers=0)
    assert counter.iterations == 0
    assert "TransportKeyMetric" in str(caught.value) and "stage_transforms" in str(caught.value)


def test_joint_training_refusal_says_what_to_use_instead():
    from avalanche.training import JointTraining

    bench = few_digits_benchmark(4, 20, 5, 2)
    model = _mlp()
    strategy = JointTraining(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                             criterion=nn.CrossEntropyLoss(), train_mb_size=8,
                             plugins=[ap.LayerAdaptiveEWCPlugin(ewc_lambda=1.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError) as caught:
            strategy.train(bench.train_stream, num_workers=0)
    message = str(caught.value)
    assert "LayerAdaptiveEWCPlugin" in message and "JointTraining" in message and "Naive" in message
