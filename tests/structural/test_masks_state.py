"""Unit masks in the model's state (issue 38, point 4): ``state_dict`` / ``load_state_dict`` carry the
masks, reloads re-snapshot the masked entries, Avalanche's ``EarlyStoppingPlugin`` returns to its best
epoch's model *and* mask under Grow and Prune, and ``UnitMasks.export`` gives a plain model the masked
model's function.

Exactness: a reloaded model runs the same floating-point operations on the same values as at the
moment it was saved, and a plain model loading the export computes every active unit with the same
operations while the masked ones are exactly 0 (a zero row and bias give ``x · 0 + 0 = 0``), so
outputs are compared with ``torch.equal``.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import dill
import pytest
import torch
from torch import nn

from avalanche_plugins.structural import Interventions, UnitMasks, remove_mask_hooks
from tests.cases import build_model, small_bn_cnn, small_mlp
from tests.fixtures import digits_stream
from tests.structural.test_masks import MASKED_UNITS, make_masks, masked_entries, mlp_and_data

torch.set_num_threads(1)


def train(model, masks, x, y, optimizer, steps=4):
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        masks.step(optimizer)


def outputs(model, x):
    was = model.training
    model.eval()
    with torch.no_grad():
        out = model(x)
    model.train(was)
    return out


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def live_unit(kind, name):
    """The first unit of layer ``name`` that make_masks(kind) leaves active."""
    return min(set(range(100)) - set(MASKED_UNITS[kind][name]))


def edited(masks, kind):
    """Every unit masked in make_masks(kind) recruited, and live_unit of every layer pruned."""
    masks.grow({n: torch.rand(s) for n, s in masks.sizes().items()}, masks.sizes())
    scores = {n: (torch.arange(s) != live_unit(kind, n)).float() for n, s in masks.sizes().items()}
    masks.prune(scores, {n: s - 1 for n, s in masks.sizes().items()})
    assert all((~masks.masks[n]).nonzero().reshape(-1).tolist() == [live_unit(kind, n)] for n in masks.sizes())


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_a_saved_state_dict_restores_its_masks_outputs_and_frozen_units(kind):
    model, masks, x, y = make_masks(kind)
    assert masks.mask_keys() == [f"{name}.unit_mask" for name in MASKED_UNITS[kind]]
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    train(model, masks, x, y, sgd)
    saved, saved_masks, saved_out = state(model), masks.masks, outputs(model, x)
    for name, units in MASKED_UNITS[kind].items():
        assert (~saved[f"{name}.unit_mask"]).nonzero().reshape(-1).tolist() == units
    edited(masks, kind)  # units masked at the save are live now (and train), a live one is masked
    train(model, masks, x, y, sgd)
    assert not torch.equal(outputs(model, x), saved_out)

    model.load_state_dict(saved)
    assert {n: m.tolist() for n, m in masks.masks.items()} == {n: m.tolist() for n, m in saved_masks.items()}
    assert torch.equal(outputs(model, x), saved_out)
    # a step that moves nothing leaves the loaded state as it is: no stale snapshot is re-imposed
    masks.step(torch.optim.SGD(model.parameters(), lr=0.0))
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items()), "a stale snapshot was restored"
    # training on: the units masked at the save keep their saved values (momentum, weight decay),
    # the unit pruned after the save, live in the saved state, trains again
    train(model, masks, x, y, sgd)
    for tensor, index in masked_entries(model, kind):
        assert torch.equal(tensor[index], saved[_key(model, tensor)][index]), _key(model, tensor)
    for name in MASKED_UNITS[kind]:
        u = live_unit(kind, name)
        assert not torch.equal(model.state_dict()[f"{name}.weight"][u], saved[f"{name}.weight"][u])


def test_loading_a_layer_alone_re_snapshots_its_entries():
    model, masks, x, y = make_masks("mlp")
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    saved_layer = copy.deepcopy(model[0].state_dict())
    edited(masks, "mlp")
    train(model, masks, x, y, sgd)
    model[0].load_state_dict(saved_layer)  # the submodule alone: its own post-hook re-snapshots
    assert (~masks.masks["0"]).nonzero().reshape(-1).tolist() == MASKED_UNITS["mlp"]["0"]
    train(model, masks, x, y, sgd)
    off = MASKED_UNITS["mlp"]["0"]
    assert torch.equal(model[0].weight[off], saved_layer["weight"][off])
    assert torch.equal(model[0].bias[off], saved_layer["bias"][off])


def test_a_plain_state_dict_loads_strictly_keeping_the_masks_with_a_warning():
    model, masks, x, y = make_masks("mlp")
    before = masks.masks
    other = small_mlp(seed=3)
    with pytest.warns(UserWarning) as record:
        model.load_state_dict(other.state_dict())  # strict=True
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert "layer '0' has no '0.unit_mask' entry" in messages[0] and "current mask is kept (7 of 10" in messages[0]
    assert "layer '2' has no '2.unit_mask' entry" in messages[1] and "(6 of 8 units active)" in messages[1]
    assert all(torch.equal(masks.masks[n], before[n]) for n in before)
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in model.state_dict().items() if "unit_mask" not in k)
    train(model, masks, x, y, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2))
    loaded = other.state_dict()
    for tensor, index in masked_entries(model, "mlp"):  # frozen at the loaded values
        assert torch.equal(tensor[index], loaded[_key(model, tensor)][index])


def _key(model, tensor):
    return next(k for k, v in model.state_dict(keep_vars=True).items() if v is tensor)


def test_a_plain_model_refuses_a_masked_state_dict_and_bad_mask_entries_are_refused():
    model, masks, _, _ = make_masks("mlp")
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "0.unit_mask", "2.unit_mask"'):
        small_mlp().load_state_dict(model.state_dict())
    bad = model.state_dict()
    bad["0.unit_mask"] = torch.full((10,), 0.5)
    with pytest.raises(RuntimeError, match=r"'0.unit_mask' must be boolean or hold only 0/1"):
        model.load_state_dict(bad)
    float_mask = model.state_dict()
    float_mask["2.unit_mask"] = torch.tensor([0.0, 1.0] * 4)
    model.load_state_dict(float_mask)
    assert masks.masks["2"].tolist() == [False, True] * 4


def _sigmoid_mlp():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 10), nn.Sigmoid(), nn.Linear(10, 8), nn.Sigmoid(), nn.Linear(8, 3))


@pytest.mark.parametrize("kind", ["mlp", "cnn", "sigmoid"])
def test_the_export_loads_into_a_plain_model_that_computes_the_masked_function(kind):
    if kind == "sigmoid":  # phi(0) = 1/2: the masked units send sigma(0) through their kept outgoing weights
        model, x = _sigmoid_mlp(), torch.randn(64, 6)
        masks = UnitMasks(model, x[:2], activation=torch.sigmoid)
        masks.set_masks({"0": torch.arange(10) % 3 != 0, "2": torch.arange(8) >= 3})
        plain = _sigmoid_mlp()
    else:
        model, masks, x, _ = make_masks(kind)
        plain = small_mlp(7) if kind == "mlp" else small_bn_cnn(7)
    before = state(model)
    exported = masks.export()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the model is not changed
    assert set(exported) == set(plain.state_dict())
    plain.load_state_dict(exported)  # strict
    assert sum(len(m._forward_hooks) for m in plain.modules()) == 0
    for training in (False, True):  # BatchNorm on batch statistics too
        model.train(training)
        plain.train(training)
        with torch.no_grad():
            assert torch.equal(plain(x), model(x)), training
    for name, mask in masks.masks.items():
        assert exported[f"{name}.weight"][~mask].abs().sum() == 0 and exported[f"{name}.bias"][~mask].abs().sum() == 0
    if kind == "sigmoid":
        with pytest.raises(ValueError, match=r"zero_outgoing=True\) needs activation\(0\) == 0"):
            masks.export(zero_outgoing=True)


def test_export_with_zero_outgoing_zeroes_the_consumer_columns_and_keeps_the_function():
    model, masks, x, _ = make_masks("mlp")
    exported = masks.export(zero_outgoing=True)
    assert exported["2.weight"][:, MASKED_UNITS["mlp"]["0"]].abs().sum() == 0
    assert exported["4.weight"][:, MASKED_UNITS["mlp"]["2"]].abs().sum() == 0
    plain = small_mlp(7)
    plain.load_state_dict(exported)
    assert torch.equal(outputs(plain, x), outputs(model, x))


def test_copies_and_pickles_carry_their_masks_and_follow_loads():
    model, masks, x, y = make_masks("cnn")
    saved, saved_out = state(model), outputs(model, x)
    masks.set_masks({name: torch.ones(n, dtype=torch.bool) for name, n in masks.sizes().items()})
    dense_out = outputs(model, x)
    copied = copy.deepcopy(model)  # the model alone: its mask travels, no UnitMasks follows it
    assert torch.equal(outputs(copied, x), dense_out)
    copied.load_state_dict(saved)
    assert torch.equal(outputs(copied, x), saved_out) and torch.equal(outputs(model, x), dense_out)
    for dump, load in ((pickle.dumps, pickle.loads), (dill.dumps, dill.loads)):
        clone = load(dump(masks))  # masks and model together, as in an Avalanche checkpoint
        clone.model.load_state_dict(saved)
        assert clone.masks["0"].tolist() == [True, False, True, True]
        assert torch.equal(outputs(clone.model, x), saved_out)
        clone.step(torch.optim.SGD(clone.model.parameters(), lr=0.0))  # re-snapshotted after the load
        assert all(torch.equal(v, saved[k]) for k, v in clone.model.state_dict().items())
    assert masks.masks["0"].all()  # the original is untouched by its copies' loads


def test_detach_and_remove_mask_hooks_make_a_plain_model():
    model, masks, x, _ = make_masks("mlp")
    masked_out = outputs(model, x)
    masks.detach()
    assert not any(k.endswith("unit_mask") for k in model.state_dict())
    small_mlp().load_state_dict(model.state_dict())
    assert not torch.equal(outputs(model, x), masked_out)
    masks.attach()
    assert masks.mask_keys() == ["0.unit_mask", "2.unit_mask"] and torch.equal(outputs(model, x), masked_out)
    dense = copy.deepcopy(model)
    assert remove_mask_hooks(dense) == 2
    small_mlp().load_state_dict(dense.state_dict())
    assert not any(dense._load_state_dict_post_hooks for dense in dense.modules())


def test_a_refused_construction_leaves_no_buffer_and_an_attribute_clash_is_named():
    net = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    net[0].unit_mask = "mine"
    with pytest.raises(ValueError, match=r"layer '0' \(Linear\) has an attribute 'unit_mask'"):
        UnitMasks(net, torch.randn(2, 6))
    assert list(net.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


# ------------------------------------------------------------------ Avalanche's EarlyStoppingPlugin


def _scripted_metric(values):
    from avalanche.evaluation import PluginMetric
    from avalanche.evaluation.metric_results import MetricValue

    class Scripted(PluginMetric):
        """Emits ``values[i]`` under ``Scripted/eval_phase/test_stream`` at the i-th evaluation: the
        best epoch is chosen here, not by chance."""

        def __init__(self):
            super().__init__()
            self.calls = 0

        def reset(self):
            pass

        def result(self):
            return None

        def after_eval(self, strategy):
            value = values[min(self.calls, len(values) - 1)]
            self.calls += 1
            return [MetricValue(self, "Scripted/eval_phase/test_stream", value, strategy.clock.train_iterations)]

    return Scripted()


def _recorder(x, plugin):
    from avalanche.core import SupervisedPlugin

    class Recorder(SupervisedPlugin):
        """At the start of every epoch (before EarlyStopping and the editing plugin): the model's
        outputs on ``x``, its active unit counts and its state."""

        def __init__(self):
            super().__init__()
            self.seen = {}

        def before_training_epoch(self, strategy, **kwargs):
            self.seen[strategy.clock.train_exp_epochs] = (
                outputs(strategy.model, x), plugin.masks.active_counts(), state(strategy.model))

    return Recorder()


@pytest.mark.parametrize("editing", ["grow", "prune"])
def test_early_stopping_keeps_the_best_epochs_model_and_mask(editing):
    from avalanche.training.plugins import EarlyStoppingPlugin, EvaluationPlugin
    from avalanche.training.supervised import Naive

    import avalanche_plugins as ap

    stream = digits_stream(1)
    torch.manual_seed(0)
    model = build_model("mlp", stream.input_shape, 10, hidden=(32, 32))
    plugin = (ap.GrowPlugin(1.0, seed_compactness=0.25, grow_fraction_per_cycle=0.25, cycle_scope="experience")
              if editing == "grow" else
              ap.PrunePlugin(0.25, prune_fraction_per_cycle=0.3, cycle_scope="experience"))
    x = torch.stack([stream.benchmark.test_stream[0].dataset[i][0] for i in range(64)])
    recorder = _recorder(x, plugin)
    # evaluations: before training, then after every epoch; the best is the one after epoch 1,
    # saved by EarlyStopping at the start of epoch 2; patience 2 reloads it at the start of epoch 4
    stop = EarlyStoppingPlugin(patience=2, val_stream_name="test_stream", metric_name="Scripted")
    evaluator = EvaluationPlugin(_scripted_metric([0.1, 0.2, 0.9, 0.3, 0.3, 0.3]), loggers=[])
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=64, train_epochs=6, eval_every=1,
                     plugins=[recorder, stop, plugin], evaluator=evaluator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy.train(stream.benchmark.train_stream[0], eval_streams=[stream.benchmark.test_stream], num_workers=0)
    assert stop.best_step == 2 and sorted(recorder.seen) == [0, 1, 2, 3, 4]
    best_out, best_counts, best_state = recorder.seen[2]
    assert plugin.masks.active_counts() == best_counts
    assert recorder.seen[4][1] != best_counts  # the edits of epochs 2 and 3 were undone
    assert torch.equal(outputs(model, x), best_out)
    assert all(torch.equal(v, best_state[k]) for k, v in model.state_dict().items())
    # one edit per cycle started before the reload; none at the epoch EarlyStopping stopped
    assert [h["cycle"] for h in plugin.history] == [1, 2, 3]


def test_grow_fresh_refuses_a_dampened_sgd_before_training():
    from avalanche.training.supervised import Naive

    import avalanche_plugins as ap
    from tests.fixtures import evaluator

    stream = digits_stream(2)
    model = build_model("mlp", stream.input_shape, 10, hidden=(16,))
    before = state(model)
    optimizer = torch.optim.SGD([{"params": model.features.parameters()},
                                 {"params": model.head.parameters(), "dampening": 0.5}], lr=0.1, momentum=0.9)
    strategy = Naive(model=model, optimizer=optimizer, criterion=nn.CrossEntropyLoss(), train_mb_size=32,
                     plugins=[ap.GrowPlugin(0.5, 0.25, optimizer_state="fresh")], evaluator=evaluator())
    with pytest.raises(ValueError, match=r"GrowPlugin refuses the optimizer before training: .*dampening=0.5 "
                                         r"\(parameter group 1\)"):
        strategy.train(stream.benchmark.train_stream[0], num_workers=0)
    assert strategy.clock.train_iterations == 0 and list(model.state_dict()) == list(before)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="dampening"):
        masks = UnitMasks(*mlp_and_data()[:2])
        masks.grow({"0": torch.ones(10), "2": torch.ones(8)}, masks.sizes(),
                   interventions=Interventions(optimizer_state="fresh"),
                   optimizer=torch.optim.SGD(masks.model.parameters(), lr=0.1, momentum=0.9, dampening=0.1))


def test_masks_built_on_a_copied_masked_model_start_full_and_own_its_state():
    model, masks, x, _ = make_masks("mlp")
    copied = copy.deepcopy(model)
    fresh = UnitMasks(copied, x[:2])
    assert all(m.all() for m in fresh.masks.values())  # all masks start full, as documented
    assert sum(len(m._forward_hooks) for m in copied.modules()) == 2  # the copy's hooks were replaced
    saved = state(copied)
    fresh.set_masks({"0": torch.arange(10) < 3})
    copied.load_state_dict(saved)
    assert fresh.masks["0"].all() and not masks.masks["0"].all()
