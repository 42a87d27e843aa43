"""Models and settings users bring: never a silent wrong number, and bad input fails before training."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import nn

from avalanche_plugins.layer_adaptive import layer_top_eigenvalues


def _saddle_loss(out, y):
    # ½ Σ_i y_i o_i² with o = (w1, w2), y = (+1, −1): the Hessian in w is diag(+1, −1)
    return 0.5 * (y * out.squeeze(-1) ** 2).sum()


def test_power_iteration_with_symmetric_extreme_eigenvalues_is_never_reported_converged_wrong():
    """Block eigenvalues {+1, −1}: plain power iteration oscillates with a steady Rayleigh quotient
    anywhere in (−1, 1); the estimator must either find s = +1 or say it did not converge."""
    net = nn.Sequential(nn.Linear(2, 1, bias=False))
    x, y = torch.eye(2), torch.tensor([1.0, -1.0])
    outcomes = []
    for seed in range(8):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            spec = layer_top_eigenvalues(net, _saddle_loss, x, y, max_iter=50, tol=1e-6, seed=seed)
        converged, top = spec.converged[0], float(spec.top[0])
        assert not converged or abs(top - 1.0) < 1e-3, (seed, top)
        assert converged or any("did not reach" in str(w.message) for w in caught)
        outcomes.append(converged)
    assert all(outcomes)  # Lanczos (issue 32): the 2-D Krylov space holds both, θ = +1 from every start


# ---------------------------------------------------------------------------------------------
# Silent wrong results now raise, naming the argument


def _mlp(d_in=4, hidden=6, d_out=3):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def test_tied_weights_are_rejected_by_the_layer_map_and_everything_built_on_it():
    from avalanche_plugins.ads import architecture_driven_shift
    from avalanche_plugins.core.layers import discover_layers

    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    net[2].weight = net[0].weight
    x, y = torch.randn(8, 4), torch.randint(0, 4, (8,))
    with pytest.raises(ValueError, match="tied weights"):
        discover_layers(net, x)
    with pytest.raises(ValueError, match="tied weights"):
        layer_top_eigenvalues(net, nn.CrossEntropyLoss(), x, y)
    with pytest.raises(ValueError, match="tied weights"):
        architecture_driven_shift(net, nn.CrossEntropyLoss(), x, x, y, lr=0.1, steps=1)


@pytest.mark.parametrize("call", ["expected_fisher", "hessian_later_chunk", "ads_old", "logit_shift", "ece",
                                  "identity_key", "channel_key", "k_step_gain", "or_targets"])
def test_non_finite_inputs_raise_a_value_error_naming_the_argument(call):
    from avalanche_plugins.ads import architecture_driven_shift, logit_shift
    from avalanche_plugins.core.stats import expected_calibration_error
    from avalanche_plugins.layer_adaptive import expected_fisher
    from avalanche_plugins.readiness import k_step_gain, optimization_readiness
    from avalanche_plugins.transport import fit_transport_key

    net, ce = _mlp(), nn.CrossEntropyLoss()
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    bad = x.clone()
    bad[-1, 0] = float("nan")
    calls = {
        "expected_fisher": lambda: expected_fisher(net, bad),
        "hessian_later_chunk": lambda: layer_top_eigenvalues(net, ce, bad, y, chunk_size=4),
        "ads_old": lambda: architecture_driven_shift(net, ce, bad, x, y, lr=0.1, steps=1),
        "logit_shift": lambda: logit_shift(net, _mlp(), bad),
        "ece": lambda: expected_calibration_error(bad[:, :3], y),
        "identity_key": lambda: fit_transport_key(bad, x, "identity"),
        "channel_key": lambda: fit_transport_key(x, bad, "channel"),
        "k_step_gain": lambda: k_step_gain(net, ce, bad, y, x, y, k=1, lr=0.1, batch_size=4, n_runs=2),
        "or_targets": lambda: optimization_readiness(_mlp(d_out=1), nn.MSELoss(), x, torch.full((16, 1), float("inf"))),
    }
    with pytest.raises(ValueError, match="non-finite"):
        calls[call]()


def test_regression_targets_that_would_broadcast_are_rejected():
    from avalanche_plugins.readiness import optimization_readiness

    net, x = _mlp(d_out=1), torch.randn(32, 4)
    y = torch.randn(32)
    with pytest.raises(ValueError, match="reshape the targets"):
        optimization_readiness(net, nn.MSELoss(), x, y)
    res = optimization_readiness(net, nn.MSELoss(), x, y.unsqueeze(1), estimator="per_sample")
    assert res.readiness > 0


def test_mask_values_other_than_0_1_and_nan_scores_are_rejected():
    from avalanche_plugins.structural import UnitMasks, lowest_active

    masks = UnitMasks(_mlp(), torch.randn(2, 4))
    with pytest.raises(ValueError, match="0/1"):
        masks.set_masks({"0": torch.tensor([1.0, 0.5, 0.0, 1.0, 1.0, 1.0])})
    masks.set_masks({"0": torch.tensor([1, 0, 0, 1, 1, 1])})
    assert masks.masks["0"].tolist() == [True, False, False, True, True, True]
    with pytest.raises(ValueError, match="NaN"):
        lowest_active(torch.tensor([float("nan"), 1.0, 2.0]), torch.ones(3, dtype=torch.bool), 1)


def test_constant_anchors_are_rejected_and_numpy_accuracies_are_numbers():
    import numpy as np

    from avalanche_plugins.transport import fit_transport_key, recovery

    with pytest.raises(ValueError, match="constant across the anchors"):
        fit_transport_key(torch.zeros(10, 3), torch.randn(10, 3), "channel")
    assert recovery(np.float32(0.8), 0.5, np.float64(0.9)).value == pytest.approx(0.75)


def test_logit_shift_chunk_size_is_checked():
    from avalanche_plugins.ads import logit_shift

    with pytest.raises(ValueError, match="chunk_size"):
        logit_shift(_mlp(), _mlp(), torch.randn(4, 4), chunk_size=0)


def _conv1d_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), nn.Conv1d(4, 5, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(5 * 6, 3))


def test_conv1d_activations_are_channel_maps_and_a_pure_channel_drift_is_undone():
    from avalanche_plugins.transport import fit_transport_key, stage_activations, stage_layout

    checkpoint, x = _conv1d_net(), torch.randn(64, 2, 10)
    updated = _conv1d_net()
    with torch.no_grad():  # per-output-channel scale and shift of the first conv: an exact channel drift
        scale, shift = torch.tensor([2.0, 0.5, -1.0, 3.0]), torch.tensor([0.1, -0.2, 0.3, 0.0])
        updated[0].weight.mul_(scale.view(-1, 1, 1))
        updated[0].bias.mul_(scale).add_(shift)
    u, v = stage_activations(updated, "0", x), stage_activations(checkpoint, "0", x)
    layout = stage_layout(updated, "0", x)
    assert layout == "channels_first" and stage_layout(updated, "1", x) == "channels_first"
    key = fit_transport_key(u, v, "channel", layout=layout, ridge=0.0)
    assert key.num_parameters == 2 * 4
    assert key.residual < 1e-8
    assert torch.allclose(key(u), v, atol=1e-5)


def test_token_stages_are_read_as_tokens_and_ambiguous_stages_ask_for_a_layout():
    from avalanche_plugins.transport import stage_layout

    tokens = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2))
    assert stage_layout(tokens, "1", torch.randn(2, 5, 3)) == "tokens"

    class Unfold(nn.Module):
        def forward(self, x):
            return x.reshape(x.shape[0], 2, -1)

    ambiguous = nn.Sequential(Unfold(), nn.Flatten(), nn.Linear(8, 2))
    with pytest.raises(ValueError, match="pass the layout explicitly"):
        stage_layout(ambiguous, "0", torch.randn(2, 8))


def test_transport_metric_validates_layouts():
    from avalanche_plugins import TransportKeyMetric

    with pytest.raises(ValueError, match="layouts"):
        TransportKeyMetric(stages=["0"], layouts={"0": "nchw"})
    assert TransportKeyMetric(stages=["0", "2"], layouts="channels_first").layouts == {
        "0": "channels_first", "2": "channels_first"}


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_batchnorm_after_the_activation_is_masked_after_the_norm(kind):
    """Layer -> ReLU -> BatchNorm: masked units must output exactly 0 after the norm, and the norm's
    affine parameters and running statistics of masked units must not train."""
    from avalanche_plugins.core.layers import discover_layers
    from avalanche_plugins.structural import UnitMasks

    torch.manual_seed(0)
    if kind == "linear":
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(inplace=True), nn.BatchNorm1d(8), nn.Linear(8, 3))
        x = torch.randn(32, 6)
    else:
        model = nn.Sequential(nn.Conv2d(2, 8, 3), nn.ReLU(), nn.BatchNorm2d(8), nn.Flatten(),
                              nn.Linear(8 * 4 * 4, 3))
        x = torch.randn(32, 2, 6, 6)
    y = torch.randint(0, 3, (32,))
    assert discover_layers(model, x[:2])[0].norm == "2"
    masks = UnitMasks(model, x[:2])
    units = [1, 4, 6]
    mask = torch.ones(8, dtype=torch.bool)
    mask[units] = False
    masks.set_masks({"0": mask})
    bn = model[2]
    frozen = [t.detach().clone()[units] for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-1)
    model.train()
    for _ in range(20):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        masks.step(opt)
    for before, now in zip(frozen, (bn.weight, bn.bias, bn.running_mean, bn.running_var)):
        assert torch.equal(now.detach()[units], before)
    for mode in (True, False):
        model.train(mode)
        hidden = model[:3](x)
        assert torch.all(hidden[:, units] == 0)
        assert hidden[:, [0, 2, 3, 5, 7]].abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# Runs that used to crash after an experience of training


@pytest.mark.parametrize("fisher", ["empirical", "expected"])
def test_layer_adaptive_ewc_per_sample_fisher_on_a_multi_head_model(fisher):
    from avalanche.training.supervised import Naive

    from avalanche_plugins import LayerAdaptiveEWCPlugin
    from tests.cases import build_model
    from tests.fixtures import digits_stream, evaluator

    stream = digits_stream(5, task_incremental=True)
    penalties = []
    for chunk_size in (16, 5):  # the memory knob does not change the importances
        torch.manual_seed(0)
        model = build_model("mlp", multihead=True)
        plugin = LayerAdaptiveEWCPlugin(ewc_lambda=10.0, schedule="geometric", fisher=fisher, fisher_samples=32,
                                        fisher_chunk_size=chunk_size)
        strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                         criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1,
                         plugins=[plugin], evaluator=evaluator())
        for experience in stream.benchmark.train_stream[:3]:
            strategy.train(experience, num_workers=0)
        assert len(plugin.profiles) == 3
        penalties.append(float(plugin.penalty(model)))
    assert penalties[0] > 0
    assert penalties[1] == pytest.approx(penalties[0], rel=1e-5)


def test_per_sample_fisher_with_mixed_task_labels_matches_each_task_alone():
    from avalanche.models.dynamic_modules import avalanche_model_adaptation

    from avalanche_plugins.layer_adaptive import empirical_fisher, expected_fisher
    from tests.cases import build_model
    from tests.fixtures import digits_stream

    torch.manual_seed(0)
    model = build_model("mlp", multihead=True)
    for experience in digits_stream(5, task_incremental=True).benchmark.train_stream[:2]:
        avalanche_model_adaptation(model, experience)
    x, y = torch.randn(12, 1, 8, 8), torch.randint(0, 2, (12,))
    t = torch.tensor([0, 1] * 6)
    both = empirical_fisher(model, nn.CrossEntropyLoss(), x, y, task_labels=t)
    parts = [empirical_fisher(model, nn.CrossEntropyLoss(), x[t == k], y[t == k], task_labels=t[t == k])
             for k in (0, 1)]
    for name in both:
        assert torch.allclose(both[name], (parts[0][name] + parts[1][name]) / 2, atol=1e-7)
    expected = expected_fisher(model, x, task_labels=t)
    assert all(torch.isfinite(v).all() for v in expected.values())



def _two_width_heads(seed=0):
    from avalanche.models import MultiTaskModule

    class TwoWidthHeads(MultiTaskModule):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Linear(4, 8)
            self.heads = nn.ModuleDict({"0": nn.Linear(8, 2), "1": nn.Linear(8, 3)})

        def forward_single_task(self, x, task_label):
            return self.heads[str(task_label)](torch.relu(self.trunk(x)))

    torch.manual_seed(seed)
    return TwoWidthHeads()


def test_logit_shift_and_ads_with_task_heads_of_different_widths():
    from avalanche_plugins.ads import architecture_driven_shift, logit_shift

    before, after = _two_width_heads(0), _two_width_heads(1)
    x, t = torch.randn(10, 4), torch.tensor([0, 1] * 5)
    shift = logit_shift(before, after, x, task_labels=t)
    per_task = [logit_shift(before, after, x[t == k], task_labels=t[t == k]) for k in (0, 1)]
    assert shift == pytest.approx(sum(per_task) / 2)  # 5 samples each
    new_x, new_y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    res = architecture_driven_shift(before, nn.CrossEntropyLoss(), x, new_x, new_y, lr=0.1, steps=2,
                                    old_task_labels=t, new_task_labels=torch.ones(8, dtype=torch.long))
    assert res.ads > 0 and math.isfinite(res.first_order_shift)
    # mixed task labels are a multi-task batch, not "weight sharing"
    y_old = torch.randint(0, 2, (10,))
    spectrum = layer_top_eigenvalues(before, nn.CrossEntropyLoss(), x, y_old, task_labels=t, max_iter=20)
    assert all(math.isfinite(v) for v in spectrum.top)


def test_layer_spectrum_with_mse_loss_matches_the_dense_blocks():
    from tests.helpers import dense_block_eigenvalues

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    x, y = torch.randn(24, 4), torch.randn(24, 2)
    spec = layer_top_eigenvalues(net, nn.MSELoss(), x, y, tol=1e-8, max_iter=3000)
    dense = dense_block_eigenvalues(net, nn.MSELoss(), x, y)
    for top, eigenvalues in zip(spec.top, dense):
        assert float(top) == pytest.approx(float(eigenvalues.max()), rel=1e-4)


def test_layer_adaptive_ewc_with_a_frozen_layer():
    from avalanche.training.supervised import Naive

    from avalanche_plugins import LayerAdaptiveEWCPlugin
    from tests.cases import build_model
    from tests.fixtures import digits_stream, evaluator

    torch.manual_seed(0)
    model = build_model("mlp")
    frozen_name, frozen = next(iter(model.named_parameters()))
    frozen.requires_grad_(False)
    before = frozen.detach().clone()
    plugin = LayerAdaptiveEWCPlugin(ewc_lambda=10.0, schedule="geometric", fisher="batched")
    strategy = Naive(model=model, optimizer=torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1, plugins=[plugin],
                     evaluator=evaluator())
    for experience in digits_stream(5).benchmark.train_stream[:2]:
        strategy.train(experience, num_workers=0)
    assert torch.equal(frozen, before)
    assert float(plugin.penalty(model)) > 0


def test_batched_fisher_names_an_empty_minibatch():
    from avalanche_plugins.layer_adaptive import batched_fisher

    net = _mlp()
    with pytest.raises(ValueError, match="empty minibatch"):
        batched_fisher(net, nn.CrossEntropyLoss(), [(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))])


@pytest.mark.parametrize("schedule, spectrum", [("smoothed", [2.0, 0.0, -1.0]), ("measured", [0.0, -1.0, -2.0])])
def test_curvature_schedules_fall_back_to_uniform_without_enough_positive_curvature(schedule, spectrum):
    from avalanche_plugins.layer_adaptive import layer_weights

    with pytest.warns(RuntimeWarning, match="uniform weights"):
        weights = layer_weights(schedule, 3, spectrum=spectrum)
    assert weights.tolist() == [1.0, 1.0, 1.0]


def test_transport_metric_on_a_stream_without_task_labels():
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.utils import AvalancheDataset
    from avalanche.training.supervised import Naive
    from torch.utils.data import TensorDataset

    from avalanche_plugins import TransportKeyMetric
    from tests.fixtures import evaluator

    torch.manual_seed(0)

    def dataset(n, flip):
        x = torch.randn(n, 4)
        y = ((x[:, 0] > 0) ^ flip).long()
        data = TensorDataset(x, y)
        data.targets = y
        return AvalancheDataset([data])

    benchmark = benchmark_from_datasets(train=[dataset(64, False), dataset(64, True)],
                                        test=[dataset(32, False), dataset(32, True)])
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    metric = TransportKeyMetric(stages=["1"], n_anchors=10, controls=False)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=16, train_epochs=3, evaluator=evaluator(metric))
    for experience in benchmark.train_stream:
        strategy.train(experience, num_workers=0)
        strategy.eval(benchmark.test_stream, num_workers=0)
    record = metric.history[-1]
    assert (record["experience"], record["after"]) == (0, 1)
    assert set(record["acc"]) == {f"stage=1/family={f}" for f in ("identity", "channel", "cross_channel")}


class _Recurrent(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(3, 5, batch_first=True)
        self.fc = nn.Linear(5, 2)

    def forward(self, x):
        return self.fc(self.rnn(x)[0][:, -1])


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_recurrent_layers_are_refused_up_front_where_torch_func_cannot_run_them(cell):
    from avalanche_plugins.ads import architecture_driven_shift
    from avalanche_plugins.layer_adaptive import batched_fisher, empirical_fisher, expected_fisher
    from avalanche_plugins.readiness import entk_energy_rank, k_step_gain, optimization_readiness

    torch.manual_seed(0)
    model, ce = _Recurrent(cell), nn.CrossEntropyLoss()
    x, y = torch.randn(8, 4, 3), torch.randint(0, 2, (8,))
    refusals = [lambda: empirical_fisher(model, ce, x, y), lambda: expected_fisher(model, x),
                lambda: optimization_readiness(model, ce, x, y, batch_size=2, n_batches=4),
                lambda: k_step_gain(model, ce, x, y, x, y, k=1, lr=0.1, batch_size=2, n_runs=2),
                lambda: entk_energy_rank(model, x)]
    for call in refusals:
        with pytest.raises(TypeError, match=f"'rnn' is a {cell.__name__}"):
            call()
    # the per-layer spectrum (reverse-mode HVPs) and Avalanche's batched Fisher do run them
    spectrum = layer_top_eigenvalues(model, ce, x, y, max_iter=20)
    assert len(spectrum.top) == 2 and all(math.isfinite(v) for v in spectrum.top)
    assert all(torch.isfinite(v).all() for v in batched_fisher(model, ce, [(x, y)]).values())
    # ADS (double-vjp where forward-mode AD is missing) and the Fisher blocks (per-sample
    # gradients one at a time where vmap is) fall back instead of refusing: tests/integration/test_fallbacks.py
    assert architecture_driven_shift(model, ce, x, x, y, lr=0.1, steps=1).ads > 0


@pytest.mark.parametrize("name, base, bad", [
    ("LayerAdaptiveEWCPlugin", {"ewc_lambda": 1.0}, {"spectrum_chunk_size": 0}),
    ("LayerAdaptiveEWCPlugin", {"ewc_lambda": 1.0}, {"spectrum_max_iter": 0}),
    ("LayerAdaptiveEWCPlugin", {"ewc_lambda": 1.0}, {"fisher_chunk_size": 0}),
    ("ArchitectureDrivenShiftMetric", {}, {"calibration_size": 0}),
    ("LayerAdaptiveEWCPlugin", {"ewc_lambda": 1.0}, {"spectrum_tol": -1.0}),
    ("LayerAdaptiveEWCPlugin", {"ewc_lambda": 1.0}, {"seed": -1}),
    ("LayerAdaptiveEWCPlugin", {"ewc_lambda": 1.0}, {"seed": "0"}),
    ("LayerAdaptiveLRPlugin", {}, {"seed": -1}),
    ("LayerSensitivityMetric", {}, {"chunk_size": 0}),
    ("LayerSensitivityMetric", {}, {"seed": "0"}),
    ("OptimizationReadinessMetric", {}, {"batch_size": 0}),
    ("ArchitectureDrivenShiftMetric", {}, {"seed": -1}),
    ("TransportKeyMetric", {"stages": ["0"]}, {"experiences": [-1]}),
    ("GrowPlugin", {"target_compactness": 0.5, "seed_compactness": 0.2}, {"threshold": math.inf}),
    ("PrunePlugin", {"target_compactness": 0.5}, {"threshold": math.inf}),
])
def test_bad_constructor_values_fail_at_construction_naming_the_argument(name, base, bad):
    import avalanche_plugins

    argument = next(iter(bad))
    with pytest.raises((ValueError, TypeError), match=argument):
        getattr(avalanche_plugins, name)(**base, **bad)


def test_unknown_transport_stages_fail_before_any_training():
    from avalanche.training.supervised import Naive

    from avalanche_plugins import TransportKeyMetric
    from tests.fixtures import digits_stream, evaluator

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    before = copy.deepcopy(model.state_dict())
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32,
                     evaluator=evaluator(TransportKeyMetric(stages=["features.0"])))
    with pytest.raises(ValueError, match=r"stages \['features.0'\] name no submodule"):
        strategy.train(digits_stream(5).benchmark.train_stream[0], num_workers=0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_layer_adaptive_lr_never_exceeds_the_base_rate_and_a_diverging_run_says_why():
    from avalanche.training.supervised import Naive

    from avalanche_plugins import LayerAdaptiveLRPlugin
    from tests.fixtures import digits_stream, evaluator

    plugin = LayerAdaptiveLRPlugin(schedule="geometric", alpha=0.5, base_lr=0.01)
    rates = plugin.layer_rates(21)  # a ResNet-18's depth: 2^-20 relative, floored at min_lr_ratio=1e-3
    assert rates.max() == pytest.approx(0.01) and rates.min() == pytest.approx(0.01 * 1e-3)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    diverging = LayerAdaptiveLRPlugin(schedule="geometric", alpha=2.0, base_lr=1e30)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, plugins=[diverging], evaluator=evaluator())
    with pytest.raises(FloatingPointError, match="lower base_lr"):
        strategy.train(digits_stream(5).benchmark.train_stream[0], num_workers=0)


def _components():
    import avalanche_plugins as ap

    return {
        "LayerAdaptiveEWCPlugin": lambda stream: ([ap.LayerAdaptiveEWCPlugin(ewc_lambda=1.0)], []),
        "GrowPlugin": lambda stream: ([ap.GrowPlugin(0.5, seed_compactness=0.2)], []),
        "CycleAccuracyMetric": lambda stream: ([], [ap.CycleAccuracyMetric(stream.test_stream)]),
        "TransportKeyMetric": lambda stream: ([], [ap.TransportKeyMetric(stages=["1"])]),
        "OptimizationReadinessMetric": lambda stream: ([], [ap.OptimizationReadinessMetric(n_samples=32)]),
    }


@pytest.mark.parametrize("component", sorted(_components()))
@pytest.mark.parametrize("run", ["joint"])  # online streams: tests/integration/test_strategies.py (issue 31)
def test_experience_indexed_components_refuse_joint_training(component, run):
    from avalanche.training.supervised import JointTraining

    from tests.fixtures import digits_stream, evaluator

    benchmark = digits_stream(5).benchmark
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    plugins, metrics = _components()[component](benchmark)
    kwargs = dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                  criterion=nn.CrossEntropyLoss(), train_mb_size=16, plugins=plugins, evaluator=evaluator(*metrics))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=f"{component} works per experience"):
        JointTraining(**kwargs).train(benchmark.train_stream[:2], num_workers=0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_unit_masks_on_a_dict_input_model_says_what_it_needs():
    from avalanche_plugins.structural import UnitMasks

    class DictInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 2)

        def forward(self, batch):
            return self.b(torch.relu(self.a(batch["x"])))

    with pytest.raises(TypeError, match="example_input must be a tensor"):
        UnitMasks(DictInput(), {"x": torch.randn(2, 4)})


@pytest.mark.parametrize("score", ["activation", "gradient"])
def test_grow_with_an_incremental_classifier_keeps_masked_outgoing_weights_in_the_live_head(score):
    from avalanche.core import SupervisedPlugin
    from avalanche.models import IncrementalClassifier
    from avalanche.training.supervised import Naive

    from avalanche_plugins import GrowPlugin
    from tests.fixtures import digits_stream, evaluator

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Sequential(nn.Flatten(), nn.Linear(64, 24), nn.ReLU())
            self.head = IncrementalClassifier(24, initial_out_features=2)

        def forward(self, x):
            return self.head(self.trunk(x))

    class Probe(SupervisedPlugin):
        """After adaptation (and the grow plugin's sync), and after training: the live head's columns."""

        def __init__(self, grow):
            super().__init__()
            self.grow, self.checked = grow, 0

        def before_training_exp(self, strategy, **kwargs):
            self.off = (~self.grow.masks.masks["trunk.1"]).nonzero().reshape(-1)
            self.weight = strategy.model.head.classifier.weight.detach().clone()

        def after_training_exp(self, strategy, **kwargs):
            still_off = [u for u in self.off.tolist() if not self.grow.masks.masks["trunk.1"][u]]
            live = strategy.model.head.classifier.weight.detach()
            assert live.shape == self.weight.shape
            assert torch.equal(live[:, still_off], self.weight[:, still_off])
            self.checked += len(still_off) > 0

    torch.manual_seed(0)
    model = Net()
    grow = GrowPlugin(0.6, seed_compactness=0.2, grow_fraction_per_cycle=0.1, epochs_per_cycle=1,
                      score=score, outgoing="zero")
    probe = Probe(grow)
    strategy = Naive(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=2, plugins=[grow, probe],
                     evaluator=evaluator())
    for experience in digits_stream(5).benchmark.train_stream[:3]:
        strategy.train(experience, num_workers=0)
    assert model.head.classifier.out_features >= 6 and probe.checked >= 2


@pytest.mark.parametrize("score", ["activation", "gradient"])
def test_grow_with_a_multi_head_classifier_freezes_and_zeroes_every_task_head(score):
    """Task-incremental: each new task adds a head. Masked units' outgoing weights must stay fixed in
    every head, and ``outgoing="zero"`` growth must leave every task's outputs unchanged."""
    from avalanche.core import SupervisedPlugin
    from avalanche.training.supervised import Naive

    from avalanche_plugins import GrowPlugin
    from tests.cases import build_model
    from tests.fixtures import digits_stream, evaluator

    x_fixed = torch.randn(6, 1, 8, 8)

    def heads(model):
        return {t: c.classifier.weight for t, c in model.head.classifiers.items()}

    def outputs(model):
        with torch.no_grad():
            was = model.training
            model.eval()
            out = {t: model(x_fixed, int(t)).clone() for t in model.head.classifiers}
            model.train(was)
        return out

    class Before(SupervisedPlugin):
        def before_training_epoch(self, strategy, **kwargs):
            self.outputs = outputs(strategy.model)

    class After(SupervisedPlugin):
        def __init__(self, grow, before):
            super().__init__()
            self.grow, self.before, self.edits, self.checked = grow, before, 0, 0

        def before_training_epoch(self, strategy, **kwargs):  # runs after the grow edit
            now = outputs(strategy.model)
            for t, out in self.before.outputs.items():
                assert torch.allclose(now[t], out, atol=1e-6), t
            self.edits += 1

        def before_training_exp(self, strategy, **kwargs):
            name = self.grow.masks.names[-1]
            self.off = (~self.grow.masks.masks[name]).nonzero().reshape(-1).tolist()
            self.frozen = {t: w.detach().clone() for t, w in heads(strategy.model).items()}

        def after_training_exp(self, strategy, **kwargs):
            name = self.grow.masks.names[-1]
            still = [u for u in self.off if not self.grow.masks.masks[name][u]]
            for t, w in heads(strategy.model).items():
                assert torch.equal(w.detach()[:, still], self.frozen[t][:, still]), t
            self.checked += len(self.frozen)

    torch.manual_seed(0)
    model = build_model("mlp", multihead=True)
    grow = GrowPlugin(0.7, seed_compactness=0.2, grow_fraction_per_cycle=0.1, epochs_per_cycle=1, outgoing="zero",
                      score=score)
    before = Before()
    after = After(grow, before)
    strategy = Naive(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=2,
                     plugins=[before, grow, after], evaluator=evaluator())
    for experience in digits_stream(5, task_incremental=True).benchmark.train_stream[:3]:
        strategy.train(experience, num_workers=0)
    assert len(model.head.classifiers) == 3 and after.checked >= 1 + 2 + 3 and after.edits >= 6


def test_logged_figures_are_compact_png_images_not_live_figures():
    from PIL import Image

    from avalanche_plugins._avalanche.figures import figure_image, profile_figure

    fig = profile_figure([f"layer{i}" for i in range(21)], [float(i + 1) for i in range(21)], "s_l")
    image = figure_image(fig)
    assert isinstance(image, Image.Image) and image.format == "PNG"
    assert len(image.fp.getvalue()) < 100_000  # a few tens of kB kept per logged figure
    assert image.size[0] > 100 and image.convert("RGB").getpixel((5, 5)) == (255, 255, 255)


def test_log_profile_next_to_the_sensitivity_metric_measures_and_logs_once(monkeypatch):
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.training.supervised import Naive

    import avalanche_plugins.layer_adaptive.curvature_metric as curvature
    from avalanche_plugins import LayerAdaptiveEWCPlugin, LayerSensitivityMetric
    from tests.fixtures import digits_stream

    calls = []
    real = curvature.layer_curvature
    # measurements only: the pre-flight probes of both (2 samples) are not measurements
    monkeypatch.setattr(curvature, "layer_curvature",
                        lambda *a, **k: (a[2].shape[0] > 2 and calls.append(1)) or real(*a, **k))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    plugin = LayerAdaptiveEWCPlugin(ewc_lambda=1.0, schedule="geometric", log_profile=True, spectrum_samples=64)
    metric = LayerSensitivityMetric(n_samples=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluator = EvaluationPlugin(metric, loggers=[])
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, plugins=[plugin], evaluator=evaluator)
    for experience in digits_stream(5).benchmark.train_stream[:2]:
        strategy.train(experience, num_workers=0)
    assert len(calls) == 2  # one measurement per experience, shared
    assert [p.spectrum for p in plugin.profiles] == [p.spectrum for p in metric.history]
    kappa = [name for name in evaluator.get_all_metrics() if name.startswith("LayerSensitivityKappa/")]
    assert len(kappa) == 2 and all(len(evaluator.get_all_metrics()[name][1]) == 1 for name in kappa)


def test_prune_refuses_a_rewind_point_beyond_the_first_prune_before_training():
    from avalanche.training.supervised import Naive

    from avalanche_plugins import PrunePlugin
    from tests.fixtures import digits_stream, evaluator

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    before = copy.deepcopy(model.state_dict())
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=2,
                     plugins=[PrunePlugin(0.5, rewind_to=10_000)], evaluator=evaluator())
    with pytest.raises(ValueError, match="rewind_to=10000 iterations, but the first prune comes after"):
        strategy.train(digits_stream(5).benchmark.train_stream[0], num_workers=0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_unit_masks_refuse_a_batchnorm_behind_a_functional_activation():
    from avalanche_plugins.structural import UnitMasks

    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn, self.head = nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2)

        def forward(self, x):
            return self.head(self.bn(torch.relu(self.fc(x))))

    with pytest.raises(ValueError, match="activation called as a function"):
        UnitMasks(Functional(), torch.randn(2, 4))
    # the module form is supported and exact (see the BatchNorm-after-activation test above)
    UnitMasks(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.BatchNorm1d(6), nn.Linear(6, 2)), torch.randn(2, 4))
