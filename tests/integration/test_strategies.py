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
from avalanche_plugins._avalanche.data import experience_layer_map
from avalanche_plugins.core.calls import model_forward
from tests.fixtures import digits_arrays, evaluator

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One torch thread: these runs are a few dozen 8x8 images through a 64-16-16-10 MLP, where a
    second thread only spins — on a shared 2-core machine it made the matrix 7x slower (6.6 min)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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
            model_forward(model, x, torch.zeros(len(x), dtype=torch.long))
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


def test_the_loop_check_reads_the_training_epoch_a_template_runs():
    from avalanche.training.supervised import MER, Naive

    from avalanche_plugins._avalanche.loop import missing_callbacks

    class Logged(Naive):  # a user's template around Avalanche's loop
        def training_epoch(self, **kwargs):
            super().training_epoch(**kwargs)

    class OwnLoop(Naive):  # a user's loop without the update callbacks
        def training_epoch(self, **kwargs):
            for batch in self.dataloader:
                self.mbatch = batch
                self._unpack_minibatch()
                self._before_backward(**kwargs)
                self.optimizer.step()

    needed = ["before_backward", "before_update", "after_update"]
    assert missing_callbacks(Naive(**common(mlp())), needed) == ("SGDUpdate", [])
    assert missing_callbacks(Logged(**common(mlp())), needed) == ("Logged", [])
    assert missing_callbacks(OwnLoop(**common(mlp())), needed) == ("OwnLoop", ["before_update", "after_update"])
    mer = MER(mem_size=20, **common(mlp()))
    assert missing_callbacks(mer, needed) == ("MetaUpdate", needed)


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


@pytest.mark.parametrize("component", ["LayerAdaptiveEWCPlugin", "GrowPlugin", "LayerSensitivityMetric",
                                       "CycleAccuracyMetric"])
def test_icarl_refusal_names_the_component(component):
    bench = tiny_benchmark()
    made = {"LayerAdaptiveEWCPlugin": lambda: ap.LayerAdaptiveEWCPlugin(1.0),
            "GrowPlugin": lambda: ap.GrowPlugin(0.5, seed_compactness=0.25),
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
    # evaluated on an online split of the test stream: keyed by the original experience
    from avalanche.benchmarks.scenarios.online import split_online_stream

    strategy.eval(list(split_online_stream(bench.test_stream[:1], 8, seed=0)), num_workers=0)
    assert [r["experience"] for r in transport.history] == [0, 0]  # 16 test images: 2 sub-experiences


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


# =========================================================================== the strategy × component matrix
# Every cell either works — and the component verifiably acted (EWC penalised every iteration and
# consolidated once per original experience, masks bound to the current model and exact, per-layer
# rates present in training, a metric measured and left the run bit-identical to the control) — or
# refused before the first iteration naming itself. `python -m tests.integration.test_strategies` prints the table.


class CountingEWC(ap.LayerAdaptiveEWCPlugin):
    """LayerAdaptiveEWC that records, at every iteration it holds a curvature, the penalty it added to
    the loss (the loss after its ``before_backward`` minus before)."""

    def before_backward(self, strategy, **kwargs):
        before = float(strategy.loss.detach().sum()) if self._curvature else None
        super().before_backward(strategy, **kwargs)
        if before is not None:
            self.__dict__.setdefault("added", []).append(float(strategy.loss.detach().sum()) - before)

    @property
    def penalised(self) -> int:
        return len(self.__dict__.get("added", []))


class MatrixProbe:
    """Last user plugin: counts iterations and the iterations a penalty was due, and records the
    optimizer settings in effect at every iteration (per parameter: lr, weight decay)."""

    def __init__(self):
        self.iterations, self.due, self.max_groups = 0, 0, 0
        self.in_effect: list[dict[int, tuple[float, float]]] = []  # per iteration: id(param) -> (lr, wd)
        self.experience_of: list[int] = []  # per iteration: the original experience trained
        # with LayerAdaptiveLR, per iteration: ({layer: factors in effect}, the factors it claims)
        self.layer_rates: list[tuple[dict[int, set[float]], list[float]]] = []
        self._layer_of = None

    def before_training_exp(self, strategy, **kwargs):
        self._layer_of = None  # the model may have grown (PNN) or been replaced (GDumb)
        # the user's rates, before LayerAdaptiveLR splits the groups at the first epoch
        self._base = {id(q): float(g["lr"]) for g in strategy.optimizer.param_groups for q in g["params"]}

    def _layers(self, strategy) -> dict[int, int]:
        if self._layer_of is None:
            index_of, _ = experience_layer_map(strategy).attach_parameters()
            self._layer_of = {id(q): index_of[n] for n, q in strategy.model.named_parameters() if n in index_of}
        return self._layer_of

    def before_training_iteration(self, strategy, **kwargs):  # MER's loop calls it, not before_update
        groups = strategy.optimizer.param_groups
        self.max_groups = max(self.max_groups, len(groups))
        self.due += int(any(isinstance(p, CountingEWC) and p._curvature for p in strategy.plugins))
        self.in_effect.append({id(q): (float(g["lr"]), float(g.get("weight_decay", 0.0))) for g in groups
                               for q in g["params"]})
        lr_plugin = next((q for q in strategy.plugins if isinstance(q, ap.LayerAdaptiveLRPlugin)), None)
        if lr_plugin is not None:  # per layer, the factors in effect: rate / the user group's rate
            per_layer: dict[int, set[float]] = {}
            for key, layer in self._layers(strategy).items():
                if key in self.in_effect[-1] and key in self._base:
                    per_layer.setdefault(layer, set()).add(self.in_effect[-1][key][0] / self._base[key])
            self.layer_rates.append((per_layer, list(lr_plugin.history[-1]["relative"])))
        origin = getattr(strategy.experience, "origin_experience", None)
        self.experience_of.append(getattr(origin if origin is not None else strategy.experience, "current_experience", 0))

    def after_training_iteration(self, strategy, **kwargs):
        self.iterations += 1


def two_group_sgd(model: nn.Module) -> torch.optim.Optimizer:
    """A user's optimizer of two groups: the head at lr 0.1 without weight decay, the body at 0.01 with
    5e-4 (issue 38, case 2: LayerAdaptiveLR copied group 0's settings onto every layer, then merged)."""
    head = list(list(model.children())[-1].parameters())
    body = [q for q in model.parameters() if all(q is not h for h in head)]
    return torch.optim.SGD([{"params": head, "lr": 0.1, "weight_decay": 0.0},
                            {"params": body, "lr": 0.01, "weight_decay": 5e-4}], momentum=0.9)


def user_groups(optimizer) -> list[tuple[float, float, list[int]]]:
    return [(float(g["lr"]), float(g.get("weight_decay", 0.0)), [id(q) for q in g["params"]])
            for g in optimizer.param_groups]


def _feature_mlp():
    """``mlp()`` with ``get_features``, an Avalanche ``BaseModel`` (which LFL needs)."""
    from avalanche.models.base_model import BaseModel

    class FeatureMLP(nn.Module, BaseModel):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(*list(mlp().children())[:-1])
            self.head = nn.Linear(16, 10)

        def get_features(self, x):
            return self.features(x)

        def forward(self, x):
            return self.head(self.features(x))

    return FeatureMLP()


def _matrix_model(kind: str):
    from avalanche.models import PNN

    from tests.cases import build_model

    torch.manual_seed(0)
    if kind == "pnn":
        return PNN(num_layers=2, in_features=64, hidden_features_per_column=16)
    if kind == "multihead":
        return build_model("mlp", multihead=True, hidden=(16, 16))
    return _feature_mlp() if kind == "features" else mlp()


def _strategy_builders():
    from avalanche.training import supervised as S
    from avalanche.training.supervised.strategy_wrappers_online import OnlineNaive

    def icarl(model, **kw):
        features = nn.Sequential(*list(model.children())[:-1])
        kw.pop("criterion")
        return S.ICaRL(feature_extractor=features, classifier=model[-1], memory_size=20, buffer_transform=None,
                       fixed_memory=True, **kw)

    def online_naive(**kw):
        kw["train_passes"] = kw.pop("train_epochs")
        return OnlineNaive(**kw)

    def adam(**kw):
        kw["optimizer"] = torch.optim.Adam(kw["model"].parameters(), lr=1e-3)
        return S.Naive(**kw)

    def two_groups(**kw):
        kw["optimizer"] = two_group_sgd(kw["model"])
        return S.Naive(**kw)

    # name: (builder(**strategy kwargs), model kind, stream kind)
    return {
        "Naive": (S.Naive, "mlp", "class"), "Naive Adam": (adam, "mlp", "class"),
        "Naive two-group SGD": (two_groups, "mlp", "class"),
        "Naive eval_every=1": (lambda **kw: S.Naive(eval_every=1, **kw), "mlp", "class"),
        "Naive multi-head (task-IL)": (S.Naive, "multihead", "task"),
        "Cumulative": (S.Cumulative, "mlp", "class"), "EWC": (lambda **kw: S.EWC(ewc_lambda=10.0, **kw), "mlp", "class"),
        "SI": (lambda **kw: S.SynapticIntelligence(si_lambda=1.0, **kw), "mlp", "class"),
        "MAS": (S.MAS, "mlp", "class"), "LwF": (lambda **kw: S.LwF(alpha=1.0, temperature=2.0, **kw), "mlp", "class"),
        "LFL": (lambda **kw: S.LFL(lambda_e=0.1, **kw), "features", "class"),
        "Replay": (lambda **kw: S.Replay(mem_size=20, **kw), "mlp", "class"),
        "GEM": (lambda **kw: S.GEM(patterns_per_exp=8, **kw), "mlp", "class"),
        "A-GEM": (lambda **kw: S.AGEM(patterns_per_exp=8, sample_size=8, **kw), "mlp", "class"),
        "ER-ACE": (lambda **kw: S.ER_ACE(mem_size=20, **kw), "mlp", "class"),
        "DER": (lambda **kw: S.DER(mem_size=20, **kw), "mlp", "class"),
        "MIR": (lambda **kw: S.MIR(mem_size=20, subsample=8, **kw), "mlp", "class"),
        "CWR*": (lambda **kw: S.CWRStar(cwr_layer_name="5", **kw), "mlp", "class"),
        "GDumb": (lambda **kw: S.GDumb(mem_size=20, **kw), "mlp", "class"),
        "FromScratchTraining": (S.FromScratchTraining, "mlp", "class"),
        "JointTraining": (S.JointTraining, "mlp", "joint"),
        "MER": (lambda **kw: S.MER(mem_size=20, batch_size_mem=4, n_inner_steps=1, **kw), "mlp", "class"),
        "PNN": (S.PNNStrategy, "pnn", "task"), "ICaRL": (icarl, "mlp", "class"),
        "online Naive (hidden boundaries)": (S.Naive, "mlp", "online"),
        "online Naive (access_task_boundaries)": (S.Naive, "mlp", "online access"),
        "OnlineNaive (hidden boundaries)": (online_naive, "mlp", "online"),
        "online Replay (access_task_boundaries)": (lambda **kw: S.Replay(mem_size=20, **kw), "mlp", "online access"),
    }


def assert_rates_in_effect(plugin, strategy, probe, schedule: str) -> None:
    """At every iteration each layer trains at its user group's rate times the factor the plugin
    records for that layer, and the factors differ across layers from the first experience on for
    ``geometric``, from the second original experience on for ``smoothed`` (its first has no profile
    yet). Cases 2 and 3 of issue 38: a second user group's rate lost, smoothed online rates left at
    the base rate."""
    assert len(probe.layer_rates) == probe.iterations > 0
    for (per_layer, claimed), experience in zip(probe.layer_rates, probe.experience_of):
        assert per_layer and all(abs(f - claimed[layer]) <= 1e-6 * claimed[layer]
                                 for layer, factors in per_layer.items() for f in factors), (per_layer, claimed)
        if schedule == "geometric" or experience > 0:
            assert len(set(claimed)) > 1, (schedule, experience, claimed)


def assert_user_groups_kept(given, optimizer, probe) -> None:
    """Every parameter trained with its user group's weight decay at every iteration, and after
    training the optimizer has the user's groups again (same rates, weight decay, parameters)."""
    decay = {key: wd for _, wd, keys in given for key in keys}
    for rates in probe.in_effect:
        assert all(rates[key][1] == wd for key, wd in decay.items() if key in rates), "weight decay changed"
    assert user_groups(optimizer) == given, (user_groups(optimizer), given)


def _expect(condition: bool, what: str) -> None:
    assert condition, what


STAGES = {"mlp": "2", "features": "features.2", "multihead": "trunk.features.2", "pnn": "layers.0"}


def _component_builders(test_stream, tmp, stage="2"):
    """column: () -> (plugins, metrics, loggers, check(strategy, probe, n_experiences) -> None)."""

    def ewc(schedule):
        def make():
            p = CountingEWC(ewc_lambda=10.0, schedule=schedule, spectrum_samples=16)

            def check(strategy, probe, n):
                added = p.__dict__.get("added", [])
                assert len(p.profiles) == n and p.penalised == probe.due > 0
                # the penalty reached the loss: never negative, and positive once the weights moved
                assert min(added) >= 0 and sum(a > 0 for a in added) >= len(added) - 1, added[:5]
            return [p], [], [], check
        return make

    def lr(schedule):
        def make():
            p = ap.LayerAdaptiveLRPlugin(schedule, alpha=0.5, spectrum_samples=16)

            def check(strategy, probe, n):
                assert probe.max_groups > 1 and len(p.history) >= n
                assert_rates_in_effect(p, strategy, probe, schedule)
            return [p], [], [], check
        return make

    def alignment():
        p = ap.ClassifierAlignmentPlugin(n_per_class=8, epochs=1)

        def check(strategy, probe, n):
            assert len(p.history) == n, p.history
            # every original experience measured its own classes and re-trained the head (or, frozen, left it)
            assert all(h["classes"] and (h.get("skipped") == "frozen head" or h["losses"]) for h in p.history)
            assert all(torch.isfinite(torch.tensor(h["losses"])).all() for h in p.history)
            assert len(p.history[-1]["seen"]) >= len(p.history[0]["classes"]) + 1
        return [p], [], [], check

    def masks(kind, newborn=False):
        def make():
            p = (ap.GrowPlugin(0.75, seed_compactness=0.25, grow_fraction_per_cycle=0.25, track_newborn=newborn)
                 if kind == "grow" else ap.PrunePlugin(0.5, prune_fraction_per_cycle=0.25))
            metric = [ap.NewbornGradientMetric(p)] if newborn else []

            def check(strategy, probe, n):
                assert assert_masks_bound_and_exact(p, strategy) > 0 and len(p.history) == n - 1
                if newborn:
                    assert metric[0].history and all(r["iterations"] > 0 for r in metric[0].history)
            return [p], metric, [], check
        return make

    def metric(make_metric, measured):
        def make():
            m = make_metric()
            return [], [m], [], lambda strategy, probe, n: measured(m, n)
        return make

    def tidy():
        logger = ap.TidyCSVLogger(tmp / f"tidy{len(list(tmp.iterdir()))}.csv")
        return [], [], [logger], lambda strategy, probe, n: None

    return {
        "LAE uniform": ewc("uniform"), "LAE smoothed": ewc("smoothed"),
        "LR geometric": lr("geometric"), "LR smoothed": lr("smoothed"), "ClassifierAlignment": alignment,
        "Grow": masks("grow"), "Prune": masks("prune"), "NewbornGradient": masks("grow", newborn=True),
        "LayerSensitivity": metric(lambda: ap.LayerSensitivityMetric(n_samples=16),
                                   lambda m, n: _expect(len(m.history) == n, "measured once per experience")),
        "OR": metric(lambda: ap.OptimizationReadinessMetric(n_samples=16, batch_size=4, n_batches=2),
                     lambda m, n: _expect(len(m.history) == n, "measured once per experience")),
        "ADS": metric(lambda: ap.ArchitectureDrivenShiftMetric(calibration_size=8),
                      lambda m, n: _expect(len(m.history) == n - 1, "measured once per experience after the first")),
        "TransportKey": metric(lambda: ap.TransportKeyMetric(stages=[stage], n_anchors=10),
                               lambda m, n: _expect(len(m.snapshots) == n, "one snapshot per experience")),
        "CycleAccuracy": metric(lambda: ap.CycleAccuracyMetric(test_stream),
                                lambda m, n: _expect(len(m.history) == n, "one cycle per experience")),
        "TidyCSVLogger": tidy,
    }


def _matrix_stream(kind: str):
    from avalanche.benchmarks.scenarios.online import split_online_stream

    bench = tiny_benchmark(task_incremental=kind == "task", per_class=12)
    if kind.startswith("online"):
        return bench, list(split_online_stream(bench.train_stream[:2], 16, access_task_boundaries=kind.endswith("access"),
                                                seed=0))
    if kind == "joint":
        return bench, [bench.train_stream[:2]]
    return bench, list(bench.train_stream[:2])


def _run_cell(strategy_name, make_component, tmp):
    """``(outcome, final state_dict or None)``; outcome "ok", "refused: ..." or "FAIL: ..."."""
    import random

    import numpy as np

    builder, model_kind, stream_kind = _strategy_builders()[strategy_name]
    bench, experiences = _matrix_stream(stream_kind)
    plugins, metrics, loggers, check = make_component() if make_component else ([], [], [], None)
    probe = MatrixProbe()
    model = _matrix_model(model_kind)
    kwargs = common(model, [*plugins, probe], metrics)
    if loggers:
        kwargs["evaluator"] = evaluator(*metrics, loggers=loggers)
    kwargs["train_mb_size"] = 8
    given = None
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)  # noqa: NPY002 - Avalanche's buffers draw from the legacy global RNG
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy = builder(**kwargs)
        if strategy_name == "Naive two-group SGD":
            given = user_groups(strategy.optimizer)
        try:
            for experience in experiences:
                strategy.train(experience, num_workers=0)
        except Exception as error:  # noqa: BLE001 - the cell's outcome
            names = [type(c).__name__ for c in [*plugins, *metrics, *loggers]]
            named = any(n in str(error) or n.replace("Counting", "LayerAdaptive") in str(error) for n in names)
            if probe.iterations == 0 and named:
                return f"refused: {type(error).__name__}", None
            return f"FAIL: {type(error).__name__} after {probe.iterations} iterations: {str(error)[:200]}", None
        n = 2
        try:
            if check is not None:
                check(strategy, probe, n)
            if given is not None:
                assert_user_groups_kept(given, strategy.optimizer, probe)
        except AssertionError as error:
            return f"FAIL: no verified effect ({str(error)[:200]})", None
    return "ok", {k: v.detach().clone() for k, v in strategy.model.state_dict().items()}


MATRIX_STRATEGIES = sorted(_strategy_builders())


@pytest.mark.slow
@pytest.mark.parametrize("strategy_name", MATRIX_STRATEGIES)
def test_strategy_component_matrix(strategy_name, tmp_path):
    _, model_kind, stream_kind = _strategy_builders()[strategy_name]
    columns = _component_builders(tiny_benchmark(task_incremental=stream_kind == "task", per_class=12).test_stream,
                                  tmp_path, STAGES[model_kind])
    control, weights = _run_cell(strategy_name, None, tmp_path)
    row = {}
    for column, make in columns.items():
        outcome, state = _run_cell(strategy_name, make, tmp_path)
        if outcome == "ok" and weights is not None and column in METRIC_COLUMNS:
            if not all(torch.equal(state[k], weights[k]) for k in weights):
                outcome = "FAIL: the metric changed the run"
        row[column] = outcome
    MATRIX_ROWS[strategy_name] = {"control": control, **row}
    failures = {c: o for c, o in row.items() if o.startswith("FAIL")}
    assert control == "ok", control
    assert not failures, failures


METRIC_COLUMNS = {"LayerSensitivity", "OR", "ADS", "TransportKey", "CycleAccuracy", "TidyCSVLogger"}
MATRIX_ROWS: dict[str, dict[str, str]] = {}


if __name__ == "__main__":  # the table of the closing note
    import pathlib
    import sys
    import tempfile

    names = sys.argv[1:] or MATRIX_STRATEGIES
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            try:
                test_strategy_component_matrix(name, pathlib.Path(folder))
            except Exception as error:  # noqa: BLE001 - print the row and go on
                print(f"# {name}: {type(error).__name__}: {error}", file=sys.stderr)
            cells = MATRIX_ROWS.get(name, {})
            print(f"| {name} | " + " | ".join(cells.values()) + " |", flush=True)
        print("| strategy | " + " | ".join(next(iter(MATRIX_ROWS.values()), {}).keys()) + " |")
