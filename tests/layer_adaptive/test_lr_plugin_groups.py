"""LayerAdaptiveLRPlugin keeps the user's optimizer groups, and its smoothed rates act on online
streams (issue 38).

Tiny runs on scikit-learn digits: 4 classes, 20 training images each, 2 class-incremental
experiences of 2 classes (40 images), a 64-16-16-4 MLP (layers ``1``, ``3``, ``5``), minibatches of
4. Online: sub-experiences of 10 images (4 per experience) with ``access_task_boundaries=True``.
The rates *in effect* are read from ``optimizer.param_groups`` at ``before_update`` of every
iteration (the step about to be taken uses them), and compared with the schedule's closed form:
a layer of a user group of rate ``r`` at ``r · f_ℓ`` (``f_ℓ`` from ``relative_rates``), every other
setting the group's own.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from avalanche.core import SupervisedPlugin
from torch import nn

from avalanche_plugins import LayerAdaptiveLRPlugin
from avalanche_plugins.core.optim import restore_param_groups, split_param_groups
from tests.fixtures import evaluator, few_digits_benchmark, one_torch_thread

warnings.filterwarnings("ignore", category=DeprecationWarning)

one_thread = pytest.fixture(autouse=True)(one_torch_thread)

LAYERS = ("1", "3", "5")


def benchmark():
    return few_digits_benchmark(4, 20, 8, 2)


def online_stream():
    from avalanche.benchmarks.scenarios.online import split_online_stream

    return list(split_online_stream(benchmark().train_stream, 10, access_task_boundaries=True, seed=0))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def two_groups(model, optimizer=torch.optim.SGD, **settings):
    """The issue's optimizer: the head at lr 0.1 without weight decay, the body at 0.01 with 5e-4."""
    head = list(model[5].parameters())
    body = [p for n, p in model.named_parameters() if not n.startswith("5.")]
    return optimizer([{"params": head, "lr": 0.1, "weight_decay": 0.0},
                      {"params": body, "lr": 0.01, "weight_decay": 5e-4}], **settings)


class GroupsInEffect(SupervisedPlugin):
    """At every ``before_update``: each optimizer group's settings and its parameters' ids."""

    def __init__(self):
        super().__init__()
        self.steps: list[list[dict]] = []

    def before_update(self, strategy, **kwargs):
        self.steps.append([{**{k: v for k, v in g.items() if k != "params"}, "params": [id(p) for p in g["params"]]}
                           for g in strategy.optimizer.param_groups])


def snapshot(optimizer) -> list[dict]:
    return [{**{k: v for k, v in g.items() if k != "params"}, "params": [id(p) for p in g["params"]]}
            for g in optimizer.param_groups]


def strategy_for(plugin, optimizer_of=two_groups, replay: bool = False, **settings):
    from avalanche.training.supervised import Naive, Replay

    model = mlp()
    probe = GroupsInEffect()
    kwargs = dict(model=model, optimizer=optimizer_of(model, **settings), criterion=nn.CrossEntropyLoss(),
                  train_mb_size=4, train_epochs=1, eval_mb_size=64, plugins=[plugin, probe], evaluator=evaluator())
    strategy = Replay(mem_size=20, **kwargs) if replay else Naive(**kwargs)
    return strategy, probe


def expected_groups(model, user_groups: list[dict], factors) -> dict[int, dict]:
    """``id(param) -> settings`` the closed form gives: the user group's, at ``r · f_ℓ``."""
    layer_of = {id(p): LAYERS.index(n.split(".")[0]) for n, p in model.named_parameters()}
    out = {}
    for group in user_groups:
        for pid in group["params"]:
            out[pid] = {**{k: v for k, v in group.items() if k != "params"},
                        "lr": group["lr"] * factors[layer_of[pid]]}
    return out


def assert_in_effect(step: list[dict], expected: dict[int, dict]) -> None:
    seen = {}
    for group in step:
        for pid in group["params"]:
            assert pid not in seen
            seen[pid] = {k: v for k, v in group.items() if k not in ("params", "param_names")}
    assert seen.keys() == expected.keys()
    for pid, settings in expected.items():
        assert seen[pid].keys() == settings.keys()
        for key, value in settings.items():
            if key == "lr":  # r · f_l: one product of doubles each way
                assert seen[pid]["lr"] == pytest.approx(value, rel=1e-12)
            else:
                assert seen[pid][key] == value, key


# --------------------------------------------------------------------------- the user's groups


def test_two_groups_keep_their_settings_while_training_and_after_each_experience():
    plugin = LayerAdaptiveLRPlugin("geometric", alpha=0.5)
    strategy, probe = strategy_for(plugin, momentum=0.9, nesterov=True)
    user = snapshot(strategy.optimizer)  # before train(): the parameters and settings the user gave
    factors = [0.25, 0.5, 1.0]  # alpha = 0.5 over 3 layers, normalised to the last
    for experience in benchmark().train_stream:
        steps_before = len(probe.steps)
        strategy.train(experience, num_workers=0)
        expected = expected_groups(strategy.model, user, factors)
        # the head's layer at 0.1 without decay, the body's at 0.01 * f with 5e-4; momentum/nesterov kept
        assert len(probe.steps) - steps_before == 10
        for step in probe.steps[steps_before:]:
            assert_in_effect(step, expected)
        assert snapshot(strategy.optimizer) == user  # the same groups, settings and parameters, in order
    assert [g["lr"] for g in probe.steps[0]] == pytest.approx([0.0025, 0.005, 0.1])
    assert plugin.history[-1]["groups"] == [
        {"layer": "1", "user_group": 1, "lr": pytest.approx(0.0025), "n_params": 2},
        {"layer": "3", "user_group": 1, "lr": pytest.approx(0.005), "n_params": 2},
        {"layer": "5", "user_group": 0, "lr": pytest.approx(0.1), "n_params": 2}]


def test_a_layer_split_across_groups_gets_one_group_per_layer_and_user_group():
    def no_decay_on_biases(model):  # the common recipe: every layer's weight in one group, its bias in another
        weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
        biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
        return torch.optim.SGD([{"params": weights, "weight_decay": 5e-4}, {"params": biases, "lr": 0.02}],
                               lr=0.05, momentum=0.9)

    plugin = LayerAdaptiveLRPlugin("geometric", alpha=0.5)
    strategy, probe = strategy_for(plugin, optimizer_of=no_decay_on_biases)
    user = snapshot(strategy.optimizer)
    strategy.train(benchmark().train_stream[0], num_workers=0)
    assert [(h["layer"], h["user_group"]) for h in plugin.history[0]["groups"]] == [
        ("1", 0), ("1", 1), ("3", 0), ("3", 1), ("5", 0), ("5", 1)]
    for step in probe.steps:
        assert_in_effect(step, expected_groups(strategy.model, user, [0.25, 0.5, 1.0]))
    assert snapshot(strategy.optimizer) == user


def test_adam_groups_keep_betas_eps_and_their_moments_across_experiences():
    plugin = LayerAdaptiveLRPlugin("geometric", alpha=0.5)

    def adam(model):
        return torch.optim.Adam([{"params": model[5].parameters(), "lr": 0.1, "betas": (0.8, 0.9), "eps": 1e-6},
                                 {"params": [p for n, p in model.named_parameters() if not n.startswith("5.")],
                                  "lr": 0.01, "weight_decay": 5e-4}])

    strategy, probe = strategy_for(plugin, optimizer_of=adam)
    user = snapshot(strategy.optimizer)
    experiences = benchmark().train_stream
    strategy.train(experiences[0], num_workers=0)
    state = {n: {k: v.clone() for k, v in strategy.optimizer.state[p].items()}
             for n, p in strategy.model.named_parameters()}
    assert all(s["step"] == 10 for s in state.values())

    class MomentsAtStart(SupervisedPlugin):
        def before_update(self, strategy, **kwargs):
            if strategy.clock.train_exp_iterations == 0:
                self.kept = {n: {k: v.clone() for k, v in strategy.optimizer.state[p].items()}
                             for n, p in strategy.model.named_parameters()}

    moments = MomentsAtStart()
    strategy.plugins.insert(0, moments)
    strategy.train(experiences[1], num_workers=0)
    # the first step of experience 1 starts from experience 0's moments, unchanged by the regrouping
    for name, entry in state.items():
        assert all(torch.equal(moments.kept[name][k], v) for k, v in entry.items()), name
    assert_in_effect(probe.steps[-1], expected_groups(strategy.model, user, [0.25, 0.5, 1.0]))
    assert snapshot(strategy.optimizer) == user


def test_sgd_momentum_buffers_are_kept_through_the_regrouping():
    plugin = LayerAdaptiveLRPlugin("geometric", alpha=0.5)
    strategy, _ = strategy_for(plugin, momentum=0.9)
    experiences = benchmark().train_stream
    strategy.train(experiences[0], num_workers=0)
    # experience 1's first step, by hand from experience 0's buffers at the rate and decay in effect:
    # the regrouping must keep the buffers
    kept = {n: strategy.optimizer.state[p]["momentum_buffer"].clone() for n, p in strategy.model.named_parameters()}

    class FirstStep(SupervisedPlugin):
        def before_update(self, strategy, **kwargs):
            if strategy.clock.train_exp_iterations == 0:
                self.before = {n: (p.detach().clone(), p.grad.detach().clone(), g["lr"], g["weight_decay"])
                               for g in strategy.optimizer.param_groups for p in g["params"]
                               for n, q in strategy.model.named_parameters() if q is p}

        def after_update(self, strategy, **kwargs):
            if strategy.clock.train_exp_iterations == 0:
                self.after = {n: p.detach().clone() for n, p in strategy.model.named_parameters()}

    first = FirstStep()
    strategy.plugins.insert(1, first)
    strategy.train(experiences[1], num_workers=0)
    for name, (w, grad, lr, decay) in first.before.items():
        # torch's SGD in float32: d = g + wd w, buf = 0.9 buf + d, w - lr buf; the reference in float64
        w64, g64, buf64 = w.double(), grad.double(), kept[name].double()
        buf = 0.9 * buf64 + g64 + decay * w64
        expected = w64 - lr * buf
        scale = w64.abs() + lr * (0.9 * buf64.abs() + g64.abs() + decay * w64.abs())
        tolerance = 8 * torch.finfo(torch.float32).eps * scale  # a few float32 roundings of these terms
        assert ((first.after[name].double() - expected).abs() <= tolerance).all(), name
    assert {round(v[2], 12) for v in first.before.values()} == {0.0025, 0.005, 0.1}


def test_an_explicit_base_lr_over_groups_of_different_rates_is_refused_before_training():
    plugin = LayerAdaptiveLRPlugin("geometric", alpha=0.5, base_lr=0.05)
    strategy, probe = strategy_for(plugin)
    before = copy.deepcopy(strategy.model.state_dict())
    with pytest.raises(ValueError, match=r"LayerAdaptiveLRPlugin: base_lr=0.05 .* different learning rates "
                                         r"\[0.1, 0.01\]; leave base_lr=None"):
        strategy.train(benchmark().train_stream[0], num_workers=0)
    assert probe.steps == []
    assert all(torch.equal(v, before[k]) for k, v in strategy.model.state_dict().items())


def test_an_explicit_base_lr_over_groups_of_one_rate_sets_the_rates_and_keeps_the_other_settings():
    def same_rate(model):
        return torch.optim.SGD([{"params": model[5].parameters(), "weight_decay": 0.0},
                                {"params": [p for n, p in model.named_parameters() if not n.startswith("5.")],
                                 "weight_decay": 5e-4}], lr=0.3)

    plugin = LayerAdaptiveLRPlugin("geometric", alpha=0.5, base_lr=0.05)
    strategy, probe = strategy_for(plugin, optimizer_of=same_rate)
    user = snapshot(strategy.optimizer)
    strategy.train(benchmark().train_stream[0], num_workers=0)
    assert_in_effect(probe.steps[0], expected_groups(strategy.model, [{**g, "lr": 0.05} for g in user],
                                                     [0.25, 0.5, 1.0]))
    assert snapshot(strategy.optimizer) == user  # back at lr 0.3


def test_split_and_restore_follow_parameters_swapped_or_added_and_a_common_lr_scale():
    a, b, c, d = (nn.Parameter(torch.zeros(2)) for _ in range(4))
    opt = torch.optim.SGD([{"params": [a, b], "lr": 0.1, "momentum": 0.9},
                           {"params": [c, d], "lr": 0.01, "weight_decay": 1e-3}])
    user = snapshot(opt)
    split = split_param_groups(opt, {id(a): 1, id(b): 0, id(c): 0}, [0.5, 1.0])  # d: in no slot
    assert [(g["lr"], g["momentum"], g["weight_decay"], len(g["params"])) for g in opt.param_groups] == [
        (0.05, 0.9, 0, 1), (0.005, 0, 1e-3, 1), (0.1, 0.9, 0, 1), (0.01, 0, 1e-3, 1)]
    assert restore_param_groups(opt, split) == [] and snapshot(opt) == user
    # what Avalanche's update_optimizer does mid-experience: swap c for c2 in its slot, append e
    split = split_param_groups(opt, {id(a): 1, id(b): 0, id(c): 0, id(d): 0}, [0.5, 1.0])
    c2, e = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    opt.param_groups[1]["params"][0] = c2
    opt.param_groups[2]["params"].append(e)
    for g in opt.param_groups:  # a scheduler's step: every lr times 0.5
        g["lr"] *= 0.5
    assert restore_param_groups(opt, split) == []
    assert [[id(p) for p in g["params"]] for g in opt.param_groups] == [[id(a), id(b), id(e)], [id(d), id(c2)]]
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05, 0.005], rel=1e-15)
    # a change that is not one factor per user group cannot be mapped back: named, the saved lr kept
    split = split_param_groups(opt, {id(a): 1, id(b): 0}, [0.5, 1.0])
    opt.param_groups[0]["lr"] = 1.0
    assert restore_param_groups(opt, split) == [(0, "lr")]
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


def test_a_named_parameter_optimizer_keeps_its_names():
    model = mlp()
    opt = torch.optim.SGD(model.named_parameters(), lr=0.1)
    user = [dict(g) for g in opt.param_groups]
    index = {id(p): LAYERS.index(n.split(".")[0]) for n, p in model.named_parameters()}
    split = split_param_groups(opt, index, [0.25, 0.5, 1.0])
    assert [g["param_names"] for g in opt.param_groups] == [["1.weight", "1.bias"], ["3.weight", "3.bias"],
                                                            ["5.weight", "5.bias"]]
    opt.state_dict()  # torch checks the names line up
    restore_param_groups(opt, split)
    assert opt.param_groups[0]["param_names"] == user[0]["param_names"]
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in user[0]["params"]]


# --------------------------------------------------------------------------- online streams


@pytest.mark.parametrize("replay", [False, True], ids=["Naive", "Replay"])
def test_smoothed_rates_are_in_effect_online_from_the_second_original_experience(replay):
    plugin = LayerAdaptiveLRPlugin("smoothed", spectrum_samples=16)
    strategy, probe = strategy_for(plugin, optimizer_of=lambda m: torch.optim.SGD(m.parameters(), lr=0.01),
                                   replay=replay)
    counts, rates = [], None
    for i, sub in enumerate(online_stream()):
        before = len(probe.steps)
        strategy.train(sub, num_workers=0)
        counts.append(len(probe.steps) - before)
        if i == 3:  # experience 0's last sub-experience: its profile is measured; the rates it gives
            rates = plugin.layer_rates(3)
    assert counts == [3] * 8  # 10 images in minibatches of 4
    assert [h["experience"] for h in plugin.history] == [0] * 4 + [1] * 4
    first, second = probe.steps[:12], probe.steps[12:]
    # experience 0: no profile yet, every layer at the optimizer's rate
    assert all(sorted(g["lr"] for g in step) == pytest.approx([0.01] * 3, rel=1e-15) for step in first)
    # experience 1: the profile measured at experience 0's last sub-experience, in effect at every step
    assert rates.max() == pytest.approx(0.01, rel=1e-15) and rates.min() < 0.9 * 0.01
    assert len(set(rates.tolist())) == 3
    ids = {LAYERS[i]: {id(p) for p in strategy.model[int(LAYERS[i])].parameters()} for i in range(3)}
    for step in second:
        for name, rate in zip(LAYERS, rates):
            in_effect = {g["lr"] for g in step if set(g["params"]) & ids[name]}
            assert len(in_effect) == 1 and in_effect.pop() == pytest.approx(rate, rel=1e-12), name
    assert all(h["lr"] == pytest.approx(rates.tolist(), rel=1e-12) for h in plugin.history[4:])
    assert [g["lr"] for g in strategy.optimizer.param_groups] == [0.01]  # back to the user's one group


# --------------------------------------------------------------------------- a replaced model


def test_online_gdumb_with_the_replaced_model_fix_keeps_two_groups_on_each_new_model():
    """``fix_replaced_model_optimizer`` points the optimizer at GDumb's new model of every
    sub-experience through Avalanche's ``make_optimizer``, which swaps each parameter in its own
    group's slot: the user's two groups (and the per-layer rates over them) hold the new model."""
    from avalanche.training.supervised import GDumb

    from avalanche_plugins import fix_replaced_model_optimizer

    fix_replaced_model_optimizer()
    plugin = LayerAdaptiveLRPlugin("geometric", alpha=0.5)
    model = mlp()
    probe = GroupsInEffect()
    strategy = GDumb(model=model, optimizer=two_groups(model, momentum=0.9), criterion=nn.CrossEntropyLoss(),
                     mem_size=20, train_mb_size=4, train_epochs=1, eval_mb_size=64, plugins=[plugin, probe],
                     evaluator=evaluator())
    settings = [{k: v for k, v in g.items() if k != "params"} for g in strategy.optimizer.param_groups]
    models = []
    for sub in online_stream():
        before = len(probe.steps)
        strategy.train(sub, num_workers=0)
        assert len(probe.steps) > before
        models.append(strategy.model)
        current = {"head": [id(p) for p in strategy.model[5].parameters()],
                   "body": [id(p) for n, p in strategy.model.named_parameters() if not n.startswith("5.")]}
        assert [{k: v for k, v in g.items() if k != "params"} for g in strategy.optimizer.param_groups] == settings
        assert [[id(p) for p in g["params"]] for g in strategy.optimizer.param_groups] == [current["head"], current["body"]]
        user = [{**settings[0], "params": current["head"]}, {**settings[1], "params": current["body"]}]
        for step in probe.steps[before:]:
            assert_in_effect(step, expected_groups(strategy.model, user, [0.25, 0.5, 1.0]))
    assert len({id(m) for m in models}) == 8  # a new model at every sub-experience


# --------------------------------------------------------------------------- SLCA's two rates


def test_slca_schedule_trains_as_plain_sgd_with_a_slow_backbone_group_and_a_head_group():
    """``schedule="slca"`` against SLCA's optimizer written by hand (no plugin): the backbone's
    layers at lr * 0.01, the head at lr, momentum kept; the same minibatches give the same weights
    (the same arithmetic in the same order: equal up to the float rounding of lr * factor)."""
    from avalanche.training.supervised import Naive

    def run(plugins, optimizer_of):
        model = mlp()
        strategy = Naive(model=model, optimizer=optimizer_of(model), criterion=nn.CrossEntropyLoss(),
                         train_mb_size=4, train_epochs=1, eval_mb_size=64, plugins=plugins, evaluator=evaluator())
        for experience in benchmark().train_stream:
            torch.manual_seed(1)  # the same minibatch order in both runs
            strategy.train(experience, num_workers=0)
        return model

    def by_hand(model):
        head = list(model[5].parameters())
        body = [p for n, p in model.named_parameters() if not n.startswith("5.")]
        return torch.optim.SGD([{"params": body, "lr": 0.05 * 0.01}, {"params": head, "lr": 0.05}], momentum=0.9)

    plugin = LayerAdaptiveLRPlugin("slca")
    with_plugin = run([plugin], lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9))
    reference = run([], by_hand)
    assert plugin.history[0]["lr"] == pytest.approx([0.0005, 0.0005, 0.05], rel=1e-12)
    for (name, p), q in zip(with_plugin.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)
    assert not torch.equal(mlp()[1].weight, with_plugin[1].weight)  # the backbone did move


def test_slca_backbone_factor_outside_its_range_is_refused():
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="backbone_factor"):
            LayerAdaptiveLRPlugin("slca", backbone_factor=bad)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        LayerAdaptiveLRPlugin("slca", backbone_factor=1e-4)
