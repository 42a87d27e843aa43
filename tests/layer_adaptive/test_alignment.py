"""SLCA's classifier alignment: the class statistics against numpy, the sampler against its own
Gaussian, the head's re-training on a known separable problem, and the Avalanche plugin on Split
digits (features equal the model's own, refusals before training, checkpoints)."""

import pickle

import numpy as np
import pytest
import torch
from avalanche.training.supervised import Naive
from torch import nn

from avalanche_plugins import ClassifierAlignmentPlugin, LayerAdaptiveLRPlugin
from avalanche_plugins.layer_adaptive.alignment import align_head, class_statistics, sample_features
from tests.cases import build_model
from tests.fixtures import digits_stream, evaluator, one_torch_thread

pytestmark = pytest.mark.numerical
_threads = pytest.fixture(autouse=True)(one_torch_thread)


def test_class_statistics_equal_numpy_mean_and_covariance_per_class():
    g = torch.Generator().manual_seed(0)
    f, y = torch.randn(90, 4, generator=g, dtype=torch.float64), torch.arange(90) % 3
    stats = class_statistics(f, y, ridge=0.0)
    for i, c in enumerate(stats.classes.tolist()):
        own = f[y == c].numpy()
        np.testing.assert_allclose(stats.means[i].numpy(), own.mean(0), rtol=1e-6, atol=1e-6)
        cov = (stats.cholesky[i] @ stats.cholesky[i].T).double().numpy()
        np.testing.assert_allclose(cov, np.cov(own, rowvar=False), rtol=1e-5, atol=1e-6)


def test_a_singular_covariance_gets_the_relative_ridge():
    f = torch.randn(5, 10, generator=torch.Generator().manual_seed(1))  # 5 samples of a 10-wide feature
    stats = class_statistics(f, torch.zeros(5, dtype=torch.long), ridge=1e-2)
    cov = (stats.cholesky[0] @ stats.cholesky[0].T).double()
    expected = torch.cov(f.double().T) + 1e-2 * torch.cov(f.double().T).trace() / 10 * torch.eye(10, dtype=torch.float64)
    torch.testing.assert_close(cov, expected, rtol=1e-5, atol=1e-6)


def test_sampled_features_have_the_classes_mean_and_covariance():
    g = torch.Generator().manual_seed(2)
    base = torch.randn(400, 3, generator=g) @ torch.tensor([[2.0, 0.0, 0.0], [0.5, 1.0, 0.0], [0.0, 0.3, 0.5]])
    labels = torch.arange(400) % 2
    stats = class_statistics(base + 5 * labels[:, None], labels, ridge=0.0)
    n = 40_000
    features, y = sample_features(stats, n, torch.Generator().manual_seed(3))
    assert y.bincount().tolist() == [n, n]
    for i in range(2):
        own = features[y == i].double()
        cov = (stats.cholesky[i] @ stats.cholesky[i].T).double()
        sd = cov.diagonal().sqrt()
        # 6 standard errors of a mean (σ/√n) and of a variance (σ²·√(2/n))
        assert ((own.mean(0) - stats.means[i].double()).abs() <= 6 * sd / n ** 0.5).all()
        assert ((torch.cov(own.T) - cov).diagonal().abs() <= 6 * sd ** 2 * (2 / n) ** 0.5).all()


def test_align_head_learns_a_separable_problem_and_plain_cross_entropy_without_temperature():
    torch.manual_seed(0)
    centres = torch.tensor([[4.0, 0.0], [-4.0, 0.0], [0.0, 4.0]])
    labels = torch.arange(150) % 3
    f = centres[labels] + torch.randn(150, 2)
    head = nn.Linear(2, 3)
    losses = align_head(head, class_statistics(f, labels), n_per_class=128, epochs=4, seed=0)
    assert (head(f).argmax(1) == labels).float().mean() >= 0.97
    assert losses[-1] < losses[0]
    # temperature=None: one step equals plain cross-entropy SGD from the same start on the same samples
    a, b = nn.Linear(2, 3), nn.Linear(2, 3)
    b.load_state_dict(a.state_dict())
    stats = class_statistics(f, labels)
    align_head(a, stats, n_per_class=4, epochs=1, batch_size=12, temperature=None, momentum=0.0, lr=0.1, seed=5)
    g = torch.Generator().manual_seed(5)
    feats, ys = sample_features(stats, 4, g)
    order = torch.randperm(12, generator=g)
    nn.functional.cross_entropy(b(feats[order]), ys[order]).backward()
    with torch.no_grad():
        for p in b.parameters():
            p -= 0.1 * p.grad
    torch.testing.assert_close(a.weight, b.weight)


def _strategy(model, plugins, stream):
    return Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                 criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1, eval_mb_size=128,
                 evaluator=evaluator(), plugins=plugins)


def test_the_plugin_measures_the_models_own_features_and_aligns_every_seen_class():
    stream = digits_stream(5)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10, hidden=(32,))
    plugin = ClassifierAlignmentPlugin(n_per_class=64, epochs=2)
    strategy = _strategy(model, [LayerAdaptiveLRPlugin("slca"), plugin], stream)
    seen = []
    for exp in stream.benchmark.train_stream[:2]:
        strategy.train(exp)
        seen += exp.classes_in_this_experience
        x = torch.stack([exp.dataset[i][0] for i in range(len(exp.dataset))])
        y = torch.as_tensor([exp.dataset[i][1] for i in range(len(exp.dataset))])
        with torch.no_grad():
            features = model.features(x)
        for c in exp.classes_in_this_experience:  # the statistics of this experience's classes
            i = plugin.statistics.classes.tolist().index(c)
            torch.testing.assert_close(plugin.statistics.means[i], features[y == c].mean(0), rtol=1e-5, atol=1e-5)
    assert sorted(plugin.history[-1]["seen"]) == sorted(seen)
    assert [h["experience"] for h in plugin.history] == [0, 1]
    assert plugin.history[-1]["losses"][-1] < plugin.history[-1]["losses"][0]
    restored = pickle.loads(pickle.dumps(plugin))
    torch.testing.assert_close(restored.statistics.cholesky, plugin.statistics.cholesky)


def test_unsupported_models_and_arguments_are_refused_before_training():
    stream = digits_stream(5)

    class NoLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 10, 8)

        def forward(self, x):
            return self.conv(x).flatten(1)

    for model, plugin, message in (
            (NoLinear(), ClassifierAlignmentPlugin(), "no nn.Linear"),
            (build_model("mlp", (1, 8, 8), 10, hidden=(16,)), ClassifierAlignmentPlugin(head="nothere"), "not a module"),
            (build_model("mlp", (1, 8, 8), 10, hidden=(16,)), ClassifierAlignmentPlugin(head="features"), "not an nn.Linear"),
            (build_model("mlp", (1, 8, 8), 2, hidden=(16,), multihead=True), ClassifierAlignmentPlugin(), "multi-task")):
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(ValueError, match=message):
            _strategy(model, [plugin], stream).train(stream.benchmark.train_stream[0])
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no step was taken
    for kwargs in ({"n_per_class": 0}, {"epochs": 0}, {"lr": -1.0}, {"temperature": 0.0}):
        with pytest.raises(ValueError):
            ClassifierAlignmentPlugin(**kwargs)


def test_a_frozen_head_is_left_alone_with_a_warning():
    stream = digits_stream(5)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10, hidden=(16,))
    model.head.requires_grad_(False)
    before = model.head.weight.detach().clone()
    plugin = ClassifierAlignmentPlugin(n_per_class=8, epochs=1)
    with pytest.warns(UserWarning, match="frozen"):
        _strategy(model, [plugin], stream).train(stream.benchmark.train_stream[0])
    assert torch.equal(model.head.weight, before)
    assert plugin.history[0]["skipped"] == "frozen head" and len(plugin.statistics) == 2
