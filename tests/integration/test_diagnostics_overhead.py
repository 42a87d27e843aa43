"""What issue 41 removed from the diagnostics leaves their values alone.

Each removal is checked against the path it replaced: the stitched evaluation in cache-sized
chunks against one pass per batch (counts, so equal exactly), a repeated read of an experience's
samples against reading them through the dataset again, the cycle accuracy's kept test batches
against re-reading them, OR's default pass size against its former 16, and the figures: rendered
when something of the run can take them, not otherwise.
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from avalanche.benchmarks.utils.data import AvalancheDataset
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.supervised import Naive
from torch import nn

import avalanche_plugins.layer_adaptive.curvature_metric as curvature_metric
import avalanche_plugins.transport.metric as transport_metric
from avalanche_plugins import (
    CycleAccuracyMetric,
    LayerSensitivityMetric,
    TidyCSVLogger,
    TransportKeyMetric,
)
from avalanche_plugins._avalanche import data as data_module
from avalanche_plugins._avalanche.data import experience_tensors
from avalanche_plugins._avalanche.evaluation import stream_accuracy
from avalanche_plugins.readiness import optimization_readiness
from tests.cases import build_model
from tests.fixtures import digits_stream, evaluator, one_torch_thread

single_thread = pytest.fixture(autouse=True)(one_torch_thread)


def _strategy(metrics=(), *, collect_all=True, loggers=()):
    torch.manual_seed(0)
    stream = digits_stream(n_experiences=5)
    model = build_model("cnn", stream.input_shape, 10, widths=(8, 16))
    plugin = EvaluationPlugin(*metrics, loggers=list(loggers), collect_all=collect_all) if loggers or not collect_all \
        else evaluator(*metrics)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05), criterion=nn.CrossEntropyLoss(),
                     train_mb_size=32, train_epochs=1, eval_mb_size=100, evaluator=plugin)
    return strategy, stream


def _stitched_accuracies(monkeypatch, chunk_floats: int) -> dict:
    monkeypatch.setattr(transport_metric, "CHUNK_FLOATS", chunk_floats)
    metric = TransportKeyMetric(stages=["features.0", "features"], n_anchors=20, experiences=[0])
    strategy, stream = _strategy([metric])
    for experience in stream.benchmark.train_stream[:2]:
        strategy.train(experience)
    strategy.eval(stream.benchmark.test_stream[:1])
    return metric.history[-1]["acc"]


def test_stitched_evaluation_in_chunks_counts_what_one_pass_per_batch_counts(monkeypatch):
    one_pass = _stitched_accuracies(monkeypatch, 1 << 40)  # every evaluation batch (100 samples) whole
    chunked = _stitched_accuracies(monkeypatch, 1)  # 16 samples a chunk: 7 chunks a batch
    assert transport_metric.evaluation_chunk(8 * 4 * 4) == 16
    assert len(one_pass) == 2 * 9 and chunked == one_pass


def _count_reads(monkeypatch) -> list:
    reads = []
    original = AvalancheDataset.__getitem__

    def counted(self, index):
        reads.append(index)
        return original(self, index)

    monkeypatch.setattr(AvalancheDataset, "__getitem__", counted)
    return reads


def test_a_repeated_read_of_the_same_samples_comes_from_the_kept_copy(monkeypatch):
    monkeypatch.setattr(data_module, "WHOLE_READ_LIMIT", 10)  # a "large" experience: subsets are read
    strategy, stream = _strategy()
    strategy.experience = stream.benchmark.train_stream[1]
    reads = _count_reads(monkeypatch)
    first = experience_tensors(strategy, n_samples=50, seed=3)
    n_first = len(reads)
    again = experience_tensors(strategy, n_samples=50, seed=3)
    other = experience_tensors(strategy, n_samples=50, seed=4)
    assert n_first >= 50 and len(reads) - n_first >= 50  # seed 4: other samples, read
    with monkeypatch.context() as patch:  # the copy, not a new read
        patch.setattr(AvalancheDataset, "__getitem__", lambda *a: pytest.fail("read again"))
        kept = experience_tensors(strategy, n_samples=50, seed=4)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0]) and torch.equal(kept[0], other[0])
    kept[0].zero_()  # a caller changing its copy changes nothing kept
    assert torch.equal(experience_tensors(strategy, n_samples=50, seed=4)[0], other[0])
    assert pickle.loads(pickle.dumps(strategy.__dict__["_avalanche_plugins_experience_reads"])) == {}


def test_a_small_experience_is_read_once_and_every_subset_equals_its_own_read(monkeypatch):
    strategy, stream = _strategy()
    strategy.experience = stream.benchmark.train_stream[1]
    n = len(strategy.experience.dataset)
    assert n <= data_module.WHOLE_READ_LIMIT
    with monkeypatch.context() as patch:  # the reference: each subset read on its own
        patch.setattr(data_module, "WHOLE_READ_LIMIT", 0)
        separate = {(k, s): experience_tensors(strategy, n_samples=k, seed=s) for k, s in ((50, 3), (20, 4), (n, 0))}
    strategy.__dict__.pop("_avalanche_plugins_experience_reads")
    reads = _count_reads(monkeypatch)
    shared = {(k, s): experience_tensors(strategy, n_samples=k, seed=s) for k, s in ((50, 3), (20, 4), (n, 0))}
    assert len(reads) == n  # the whole experience, once
    for key, tensors in separate.items():
        for a, b in zip(tensors, shared[key]):
            assert torch.equal(a, b)
    shared[(50, 3)][0].zero_()  # a caller changing its copy changes nothing kept
    assert torch.equal(experience_tensors(strategy, n_samples=50, seed=3)[0], separate[(50, 3)][0])


def test_the_cycle_accuracy_reads_each_test_experience_once(monkeypatch):
    strategy, stream = _strategy()
    strategy.train(stream.benchmark.train_stream[0])
    seen = stream.benchmark.test_stream[:2]
    reference = stream_accuracy(strategy, seen, batch_size=64)
    cache: dict = {}
    reads = _count_reads(monkeypatch)
    assert stream_accuracy(strategy, seen, batch_size=64, cache=cache) == reference
    n_reads = len(reads)
    assert n_reads == sum(len(e.dataset) for e in seen)
    assert stream_accuracy(strategy, seen, batch_size=64, cache=cache) == reference
    assert len(reads) == n_reads



def test_samples_per_experience_evaluates_every_stride_th_sample_the_same_each_time():
    strategy, stream = _strategy()
    strategy.train(stream.benchmark.train_stream[0])
    seen = stream.benchmark.test_stream[:2]
    correct = total = 0
    with torch.no_grad():
        strategy.model.eval()
        for experience in seen:  # a direct count on every ceil(n / 25)-th sample of each
            data = experience.dataset.eval()
            kept = range(0, len(data), -(-len(data) // 25))
            x = torch.stack([data[i][0] for i in kept])
            y = torch.as_tensor([data[i][1] for i in kept])
            correct += int((strategy.model(x).argmax(1) == y).sum())
            total += len(kept)
    cache: dict = {}
    subsampled = stream_accuracy(strategy, seen, batch_size=16, cache=cache, samples_per_experience=25)
    assert subsampled == correct / total and total < sum(len(e.dataset) for e in seen)
    assert stream_accuracy(strategy, seen, batch_size=16, cache=cache, samples_per_experience=25) == subsampled
    assert stream_accuracy(strategy, seen, batch_size=16, samples_per_experience=10_000) == \
        stream_accuracy(strategy, seen, batch_size=16)
    with pytest.raises(ValueError, match="eval_samples"):
        CycleAccuracyMetric(stream.benchmark.test_stream, 1, eval_samples=0)

def test_readiness_default_pass_size_gives_the_values_of_passes_of_16():
    torch.manual_seed(0)
    net = build_model("mlp", (1, 8, 8), 10)
    x, y = torch.randn(256, 1, 8, 8), torch.randint(0, 10, (256,))
    for estimator in ("sampled", "per_sample"):
        default = optimization_readiness(net, nn.CrossEntropyLoss(), x, y, estimator=estimator)
        sixteen = optimization_readiness(net, nn.CrossEntropyLoss(), x, y, estimator=estimator, chunk_size=16)
        for field in ("loss", "grad_norm_sq", "second_moment", "readiness"):
            assert math.isclose(getattr(default, field), getattr(sixteen, field), rel_tol=1e-5), (estimator, field)


@pytest.mark.parametrize("collect_all, images, defer, rendered",
                         [(False, False, False, 0), (False, True, False, 1), (True, False, False, 0),
                          (True, True, False, 1), (True, True, True, 1)])
def test_the_profile_figure_is_drawn_only_when_a_logger_reads_it(tmp_path, monkeypatch, collect_all, images, defer,
                                                                 rendered):
    figures = []
    original = curvature_metric.profile_figure
    monkeypatch.setattr(curvature_metric, "profile_figure", lambda *a, **k: figures.append(a) or original(*a, **k))
    metric = LayerSensitivityMetric(n_samples=32)
    logger = TidyCSVLogger(tmp_path / "run.csv", images=images, defer_images=defer)
    strategy, stream = _strategy([metric], collect_all=collect_all, loggers=[logger])
    strategy.train(stream.benchmark.train_stream[0])
    assert len(figures) == (0 if defer else rendered)  # a deferred image is drawn when the logger closes
    logger.close()
    assert len(figures) == rendered and len(metric.history) == 1
    assert (tmp_path / "run_images").exists() == bool(rendered and images)
    if collect_all and not images:  # kept by the evaluator, undrawn: drawn (once) when something reads it
        kept = [v for name, v in strategy.evaluator.get_all_metrics().items() if "LayerSensitivityProfile" in name]
        assert kept and kept[0][1][0].convert("RGB").size == kept[0][1][0].size and len(figures) == 1
