"""LayerAdaptiveEWCPlugin: equivalence with Avalanche's EWCPlugin, per-layer weights, checkpoints."""

import copy
import types

import numpy as np
import pytest
import torch
from avalanche.models import IncrementalClassifier
from avalanche.training.plugins import EWCPlugin
from avalanche.training.supervised import Naive
from torch import nn

from avalanche_plugins import LayerAdaptiveEWCPlugin, fix_checkpoint_pickling
from avalanche_plugins.layer_adaptive import batched_fisher, layer_weights
from tests.cases import build_model
from tests.fixtures import digits_stream, evaluator
from tests.helpers import train_with_checkpoints


def incremental_mlp(stream):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         IncrementalClassifier(32, initial_out_features=2))


def train(plugin, *, head="multihead", n_experiences=3, seed=0, epochs=2, lr=0.05, extra=()):
    stream = digits_stream(task_incremental=head == "multihead")
    torch.manual_seed(seed)
    if head == "multihead":
        model = build_model("mlp", stream.input_shape, stream.n_classes, hidden=(32, 32), multihead=True)
    else:
        model = incremental_mlp(stream)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=epochs,
                     plugins=[plugin, *extra], evaluator=evaluator())
    for experience in stream.benchmark.train_stream[:n_experiences]:
        strategy.train(experience)
    return strategy, stream


def avalanche_ewc_penalty(ewc, model, n_done):
    fake = types.SimpleNamespace(clock=types.SimpleNamespace(train_exp_counter=n_done), model=model,
                                 device="cpu", loss=torch.zeros(1))
    ewc.before_backward(fake)
    return float(fake.loss.detach())


@pytest.mark.parametrize(("head", "mode"), [("multihead", {"mode": "separate"}),
                                            ("incremental", {"mode": "online", "decay_factor": 0.5})])
def test_uniform_batched_equals_avalanche_ewc(head, mode):
    lam = 20.0 if head == "multihead" else 2.0
    ours, _ = train(LayerAdaptiveEWCPlugin(lam, schedule="uniform", fisher="batched", **mode), head=head,
                    lr=0.05 if head == "multihead" else 0.01)
    ref, _ = train(EWCPlugin(lam, **mode), head=head, lr=0.05 if head == "multihead" else 0.01)
    ewc_plugin = ref.plugins[0]
    # same penalty at the same weights (the reference run's, moved off the last anchor), to 1e-6 relative
    probe = copy.deepcopy(ref.model)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in probe.parameters():
            p.add_(0.01 * torch.randn_like(p))
    ref_penalty = avalanche_ewc_penalty(ewc_plugin, probe, 3)
    our_penalty = float(ours.plugins[0].penalty(probe))
    assert ref_penalty > 0
    assert our_penalty == pytest.approx(ref_penalty, rel=1e-6)
    # same trained weights after the 3-experience run (float32 summation order aside)
    for (name, p), (_, q) in zip(ours.model.named_parameters(), ref.model.named_parameters()):
        assert p.shape == q.shape, name
        assert torch.allclose(p, q, atol=1e-5, rtol=0), name
    if head == "incremental":
        assert ours.model[-1].classifier.out_features == 6  # the head grew 2 -> 6


def test_geometric_weights_are_applied_per_layer():
    alpha, lam = 3.0, 10.0
    strategy, stream = train(LayerAdaptiveEWCPlugin(lam, schedule="geometric", alpha=alpha), n_experiences=1,
                             epochs=1)
    plugin, model = strategy.plugins[0], strategy.model
    assert np.allclose(plugin.profiles[0].lambdas, lam * alpha ** -np.arange(3))
    # reference Fisher, computed independently from the same data
    loader = torch.utils.data.DataLoader(stream.benchmark.train_stream[0].dataset, batch_size=32)
    fisher = batched_fisher(model, nn.CrossEntropyLoss(), [(b[0], b[1], b[2]) for b in loader])
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    layer_params = [["trunk.features.1.weight", "trunk.features.1.bias"],
                    ["trunk.features.3.weight", "trunk.features.3.bias"],
                    ["head.classifiers.0.classifier.weight", "head.classifiers.0.classifier.bias"]]
    torch.manual_seed(0)
    for depth, names in enumerate(layer_params):
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(anchor[n])
            deltas = {n: 0.01 * torch.randn_like(anchor[n]) for n in names}
            for n in names:
                dict(model.named_parameters())[n].add_(deltas[n])
        expected = lam * alpha ** -depth * sum(float((fisher[n] * deltas[n] ** 2).sum()) for n in names)
        assert float(plugin.penalty(model)) == pytest.approx(expected, rel=1e-4)


def test_measured_and_smoothed_profiles_are_normalised():
    for schedule in ("measured", "smoothed"):
        strategy, _ = train(LayerAdaptiveEWCPlugin(5.0, schedule=schedule, spectrum_samples=64), n_experiences=2,
                            epochs=1)
        profile = strategy.plugins[0].profiles[-1]
        weights = np.array(profile.lambdas) / 5.0
        assert weights.mean() == pytest.approx(1.0)
        assert np.allclose(weights, layer_weights(schedule, 3, spectrum=profile.spectrum))
        assert profile.kappa == pytest.approx(max(profile.spectrum) / min(profile.spectrum))
        assert profile.alpha_hat is not None and len(strategy.plugins[0].lambdas) == 2


def test_parameters_outside_layers_warn_once_and_get_weight_one():
    class WithBias(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
            self.offset = nn.Parameter(torch.zeros(10))

        def forward(self, x):
            return self.net(x) + self.offset

    stream = digits_stream()
    model = WithBias()
    plugin = LayerAdaptiveEWCPlugin(1.0, schedule="geometric", alpha=4.0)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=64, plugins=[plugin], evaluator=evaluator())
    with pytest.warns(UserWarning, match="outside every layer.*offset"):
        strategy.train(stream.benchmark.train_stream[0])
    assert float(plugin._curvature["offset"].sum()) > 0  # protected with weight 1


@pytest.mark.parametrize("kwargs", [dict(schedule="cosine"), dict(alpha=0.0), dict(alpha=-1.0),
                                    dict(ewc_lambda=-1.0), dict(fisher="full"), dict(mode="online"),
                                    dict(decay_factor=0.5), dict(spectrum_samples=0)])
def test_bad_arguments(kwargs):
    args = {"ewc_lambda": 1.0, **kwargs}
    with pytest.raises(ValueError, match=next(iter(kwargs)).split("_")[0]):
        LayerAdaptiveEWCPlugin(**args)


def test_checkpoint_resume_matches_uninterrupted(tmp_path):
    from avalanche.training.determinism.rng_manager import RNGManager

    fix_checkpoint_pickling()  # torch 2.14 + dill cannot pickle any optimizer otherwise

    def run(resume: bool):
        RNGManager.set_random_seeds(0)
        stream = digits_stream(task_incremental=True)
        RNGManager.set_random_seeds(0)

        def fresh():
            model = build_model("mlp", stream.input_shape, 2, hidden=(32, 32), multihead=True)
            return Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                         criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1,
                         plugins=[LayerAdaptiveEWCPlugin(10.0, schedule="smoothed", spectrum_samples=64)],
                         evaluator=evaluator())

        return train_with_checkpoints(fresh, stream.benchmark.train_stream[:3], tmp_path / f"ckpt_{resume}.pkl",
                                      resume_at=2 if resume else None)

    straight, resumed = run(False), run(True)
    assert len(resumed.plugins[0].profiles) == 3
    for p, q in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)
