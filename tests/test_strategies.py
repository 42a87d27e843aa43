"""Every Avalanche strategy, and online streams: each plugin acts or refuses before training (issue 31).

Tiny runs on digits (24 training / 8 test images per class, a 64-16-16-10 MLP, one epoch): the
strategies that replace the model (GDumb, FromScratchTraining), run their own loop (MER), grow the
model (PNN), evaluate through class means (ICaRL) or train on sub-experiences (online streams,
OnlineNaive). Each test asserts what the component did — masks bound to the current model and exact,
per-layer optimizer groups holding every parameter, one measurement per original experience — or
that it refused before the first iteration naming itself, the strategy and the callback.
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
from tests.fixtures import digits_arrays, evaluator

warnings.filterwarnings("ignore", category=DeprecationWarning)


@functools.lru_cache(maxsize=4)
def tiny_benchmark(task_incremental: bool = False, per_class: int = 24):
    from avalanche.benchmarks import nc_benchmark

    xtr, ytr, xte, yte = digits_arrays()

    def pick(x, y, n):
        idx = torch.cat([torch.nonzero(y == c).reshape(-1)[:n] for c in range(10)])
        return TensorDataset(x[idx], y[idx])

    return nc_benchmark(pick(xtr, ytr, per_class), pick(xte, yte, 8), n_experiences=5,
                        task_labels=task_incremental, seed=0,
                        class_ids_from_zero_in_each_exp=task_incremental,
                        class_ids_from_zero_from_first_exp=not task_incremental)


def mlp(seed: int = 0, n_classes: int = 10) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, n_classes))


def common(model, plugins=(), metrics=(), **kwargs):
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                                       weight_decay=1e-3),
                criterion=nn.CrossEntropyLoss(), train_mb_size=16, train_epochs=1, eval_mb_size=64,
                plugins=list(plugins), evaluator=evaluator(*metrics), **kwargs)


def masked_outputs(masks, model, x) -> dict[str, torch.Tensor]:
    """Each masked layer's output (after its mask hook) on ``x``, restricted to its masked units."""
    captured, handles = {}, []
    modules = dict(model.named_modules())
    for name, layer in masks.layers.items():
        point = layer.norm if layer.norm is not None else modules[name]
        handles.append(point.register_forward_hook(
            lambda m, i, out, name=name: captured.__setitem__(name, out.detach())))
    try:
        with torch.no_grad():
            model.eval()
            model(x)
    finally:
        for h in handles:
            h.remove()
    return {name: captured[name][:, ~mask] for name, mask in masks.masks.items()}


def assert_masks_bound_and_exact(plugin, strategy) -> int:
    """The plugin's masks are those of the strategy's current model and its masked units output
    exactly 0; returns how many units are masked."""
    assert plugin.masks.model is strategy.model
    x = digits_arrays()[2][:8]
    outputs = masked_outputs(plugin.masks, strategy.model, x)
    assert all(bool((o == 0).all()) for o in outputs.values())
    return sum(o.shape[1] for o in outputs.values())


# --------------------------------------------------------------------------- model replaced


@pytest.mark.parametrize("plugin_name", ["grow", "prune"])
def test_gdumb_new_model_every_experience_gets_the_masks(plugin_name):
    from avalanche.training.supervised import GDumb

    bench = tiny_benchmark()
    plugin = (ap.GrowPlugin(0.75, seed_compactness=0.25, grow_fraction_per_cycle=0.25, track_newborn=True)
              if plugin_name == "grow" else ap.PrunePlugin(0.5, prune_fraction_per_cycle=0.25))
    metrics = [ap.NewbornGradientMetric(plugin)] if plugin_name == "grow" else []
    strategy = GDumb(mem_size=60, **common(mlp(), [plugin], metrics))
    models = []
    for experience in bench.train_stream[:3]:
        strategy.train(experience, num_workers=0)
        models.append(strategy.model)
        masked = assert_masks_bound_and_exact(plugin, strategy)
    assert masked > 0
    assert len({id(m) for m in models}) == 3  # GDumb replaced the model every experience
    assert plugin.rebound == [1, 2]
    assert len(plugin.history) == 2  # an edit at the start of experiences 1 and 2
    if plugin_name == "grow":
        assert len(plugin.newborn_log) == 2
        assert all(r["iterations"] > 0 and r["newborn_act"] == r["newborn_act"] for r in plugin.newborn_log)


def test_from_scratch_training_resets_weights_masks_stay_exact_and_lr_groups_survive():
    from avalanche.core import SupervisedPlugin
    from avalanche.training.supervised import FromScratchTraining

    class Probe(SupervisedPlugin):
        def __init__(self):
            super().__init__()
            self.groups, self.frozen_drift = [], []

        def before_update(self, strategy, **kwargs):
            self.groups.append(len(strategy.optimizer.param_groups))

    grow = ap.GrowPlugin(0.75, seed_compactness=0.25, grow_fraction_per_cycle=0.25)
    lr = ap.LayerAdaptiveLRPlugin("geometric", alpha=0.5)
    probe = Probe()
    strategy = FromScratchTraining(**common(mlp(), [grow, lr, probe]))
    frozen = None
    for experience in tiny_benchmark().train_stream[:3]:
        strategy.train(experience, num_workers=0)
        assert assert_masks_bound_and_exact(grow, strategy) > 0
        off = ~grow.masks.masks["1"]
        rows = strategy.model[1].weight.detach()[off].clone()
        if frozen is not None and frozen.shape == rows.shape:
            assert torch.equal(rows, frozen)  # masked rows kept exactly (reset values, then frozen)
        frozen = rows
        assert len(strategy.optimizer.param_groups) == 1  # merged back between experiences
    assert set(probe.groups) == {3}  # one group per layer during training
    assert len(lr.history) == 3


# --------------------------------------------------------------------------- a loop without callbacks


@pytest.mark.parametrize("make", [
    lambda: ap.LayerAdaptiveEWCPlugin(ewc_lambda=1e6, schedule="uniform"),
    lambda: ap.GrowPlugin(0.5, seed_compactness=0.25),
    lambda: ap.PrunePlugin(0.5),
])
def test_mer_is_refused_before_training_naming_plugin_strategy_and_callback(make):
    from avalanche.training.supervised import MER

    plugin = make()
    model = mlp()
    before = copy.deepcopy(model.state_dict())
    strategy = MER(mem_size=20, batch_size_mem=4, n_inner_steps=1, **common(model, [plugin]))
    callback = "before_backward" if isinstance(plugin, ap.LayerAdaptiveEWCPlugin) else "before_update"
    with pytest.raises(ValueError, match=rf"{type(plugin).__name__} refuses MER before training.*{callback}"):
        strategy.train(tiny_benchmark().train_stream[0], num_workers=0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_mer_runs_the_metrics_and_the_learning_rates():
    from avalanche.training.supervised import MER

    sens = ap.LayerSensitivityMetric(n_samples=16)
    lr = ap.LayerAdaptiveLRPlugin("geometric", alpha=0.5)
    strategy = MER(mem_size=20, batch_size_mem=4, n_inner_steps=1, **common(mlp(), [lr], [sens]))
    for experience in tiny_benchmark().train_stream[:2]:
        strategy.train(experience, num_workers=0)
    assert len(sens.history) == 2 and len(lr.history) == 2


def test_newborn_metric_logs_nothing_for_a_cycle_that_measured_nothing():
    grow = ap.GrowPlugin(0.5, seed_compactness=0.25, track_newborn=True)
    metric = ap.NewbornGradientMetric(grow)
    grow.newborn_log.append({"cycle": 1, "iterations": 0, "newborn_grad": float("nan"),
                             "incumbent_grad": float("nan"), "newborn_act": float("nan"),
                             "incumbent_act": float("nan"), "n_newborn": 4, "grad_ratio": float("nan"),
                             "iteration": 0})
    assert metric.after_training_epoch(strategy=None) == []
    assert len(metric.history) == 1


# --------------------------------------------------------------------------- a growing model


@pytest.mark.parametrize("schedule", ["geometric", "smoothed"])
def test_pnn_new_columns_land_in_per_layer_groups(schedule):
    from avalanche.core import SupervisedPlugin
    from avalanche.models import PNN
    from avalanche.training.supervised import PNNStrategy

    class Probe(SupervisedPlugin):
        def __init__(self):
            super().__init__()
            self.seen = []

        def before_update(self, strategy, **kwargs):
            if strategy.clock.train_exp_iterations == 0:
                grouped = [id(p) for g in strategy.optimizer.param_groups for p in g["params"]]
                trained = [id(p) for p in strategy.model.parameters() if p.requires_grad]
                self.seen.append((len(strategy.optimizer.param_groups), set(trained) <= set(grouped),
                                  len(grouped) == len(set(grouped)),
                                  sorted({g["lr"] for g in strategy.optimizer.param_groups})))

    torch.manual_seed(0)
    model = PNN(num_layers=2, in_features=64, hidden_features_per_column=8)
    lr = ap.LayerAdaptiveLRPlugin(schedule, alpha=0.5, spectrum_samples=16)
    probe = Probe()
    strategy = PNNStrategy(**common(model, [lr, probe]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for experience in tiny_benchmark(task_incremental=True).train_stream[:3]:
            strategy.train(experience, num_workers=0)
    assert len(probe.seen) == 3
    assert all(ok and unique for _, ok, unique, _ in probe.seen)
    assert probe.seen[2][0] > probe.seen[0][0]  # columns added: more layers, more groups
    if schedule == "smoothed":
        assert [h["remeasured"] for h in lr.history] == [False, True, True]
        assert any("re-measuring the profile" in str(w.message) for w in caught)
        assert len(probe.seen[2][3]) > 1  # the layers do not all get one rate
    else:
        assert len(probe.seen[0][3]) > 1


# --------------------------------------------------------------------------- ICaRL


def _icarl(plugins=(), metrics=()):
    from avalanche.models import NCMClassifier  # noqa: F401  (ICaRL builds its own)
    from avalanche.training.supervised import ICaRL

    torch.manual_seed(0)
    features = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
    classifier = nn.Linear(16, 10)
    params = list(features.parameters()) + list(classifier.parameters())
    return ICaRL(feature_extractor=features, classifier=classifier, optimizer=torch.optim.SGD(params, lr=0.05),
                 memory_size=40, buffer_transform=None, fixed_memory=True, train_mb_size=16,
                 plugins=list(plugins), evaluator=evaluator(*metrics))


@pytest.mark.parametrize("component", ["LayerAdaptiveEWCPlugin", "LayerSensitivityMetric", "CycleAccuracyMetric"])
def test_icarl_refusal_names_the_component(component):
    bench = tiny_benchmark()
    made = {"LayerAdaptiveEWCPlugin": lambda: ap.LayerAdaptiveEWCPlugin(1.0),
            "LayerSensitivityMetric": lambda: ap.LayerSensitivityMetric(n_samples=8),
            "CycleAccuracyMetric": lambda: ap.CycleAccuracyMetric(bench.test_stream)}[component]()
    plugins, metrics = ([made], []) if component.endswith("Plugin") else ([], [made])
    strategy = _icarl(plugins, metrics)
    before = copy.deepcopy(strategy.model.state_dict())
    with pytest.raises(RuntimeError, match=rf"^{component} refuses this model before training.*AssertionError"):
        strategy.train(bench.train_stream[0], num_workers=0)
    assert all(torch.equal(v, before[k]) for k, v in strategy.model.state_dict().items())


# --------------------------------------------------------------------------- online streams


def online(n: int = 2, size: int = 30, access: bool = False):
    from avalanche.benchmarks.scenarios.online import split_online_stream

    return split_online_stream(tiny_benchmark().train_stream[:n], size, access_task_boundaries=access, seed=0)


def test_online_metrics_measure_once_per_original_experience_and_leave_the_run_unchanged():
    from avalanche.training.supervised import Naive

    bench = tiny_benchmark()
    metrics = [ap.LayerSensitivityMetric(n_samples=16), ap.OptimizationReadinessMetric(n_samples=32, batch_size=8, n_batches=2),
               ap.ArchitectureDrivenShiftMetric(calibration_size=16), ap.TransportKeyMetric(stages=["2"], n_anchors=20),
               ap.CycleAccuracyMetric(bench.test_stream)]
    runs = {}
    for name, attached in (("plain", []), ("metrics", metrics)):
        strategy = Naive(**common(mlp(), [], attached))
        torch.manual_seed(1)
        subexps = list(online(3))
        for sub in subexps:
            strategy.train(sub, num_workers=0)
        runs[name] = strategy.model.state_dict()
    assert len(subexps) == 6  # 48 samples per experience in sub-experiences of 30: 2 each
    assert all(torch.equal(runs["plain"][k], runs["metrics"][k]) for k in runs["plain"])
    sens, readiness, ads, transport, cycles = metrics
    assert [p.experience for p in sens.history] == [0, 1, 2]
    assert [r["experience"] for r in readiness.history] == [0, 1, 2]
    assert [r["experience"] for r in ads.history] == [1, 2]
    assert sorted(transport.snapshots) == [0, 1, 2]
    assert len(cycles.history) == 3


def test_online_plugins_need_the_boundaries_and_act_once_per_original_experience():
    from avalanche.training.supervised import Naive

    ewc = ap.LayerAdaptiveEWCPlugin(ewc_lambda=10.0, schedule="smoothed", spectrum_samples=16)
    model = mlp()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="LayerAdaptiveEWCPlugin .*access_task_boundaries=True"):
        Naive(**common(model, [ewc])).train(next(iter(online())), num_workers=0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())

    ewc = ap.LayerAdaptiveEWCPlugin(ewc_lambda=10.0, schedule="smoothed", spectrum_samples=16)
    grow = ap.GrowPlugin(0.75, seed_compactness=0.25, grow_fraction_per_cycle=0.25)
    lr = ap.LayerAdaptiveLRPlugin("smoothed", spectrum_samples=16)
    strategy = Naive(**common(mlp(), [ewc, grow, lr]))
    for sub in online(3, access=True):
        strategy.train(sub, num_workers=0)
    assert [p.experience for p in ewc.profiles] == [0, 1, 2]
    assert [h["experience"] for h in grow.history] == [1, 2]  # an edit at each original boundary
    assert len(lr.history) == 6 and lr.last_spectrum is not None
    assert assert_masks_bound_and_exact(grow, strategy) > 0


def test_online_naive_with_fixed_masks_and_geometric_rates_needs_no_boundaries():
    from avalanche.training.supervised.strategy_wrappers_online import OnlineNaive

    fixed = ap.FixedMaskPlugin({"1": torch.arange(16) < 8, "3": torch.arange(16) % 2 == 0})
    lr = ap.LayerAdaptiveLRPlugin("geometric", alpha=0.5)
    sens = ap.LayerSensitivityMetric(n_samples=16)
    kwargs = common(mlp(), [fixed, lr], [sens])
    kwargs.pop("train_epochs")
    strategy = OnlineNaive(train_passes=1, **kwargs)
    for sub in online(2):
        strategy.train(sub, num_workers=0)
    assert assert_masks_bound_and_exact(fixed, strategy) == 16
    assert len(sens.history) == 2 and len(lr.history) == 4
