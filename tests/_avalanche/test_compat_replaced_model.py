"""``fix_replaced_model_optimizer``: online GDumb trains with it and does not without it; strategies
that keep their model are bit-identical with and without it; GDumb's fresh model of a 1-sample
sub-experience passes a diagnostic's pre-flight (checked on its buffer) (issue 31).

Tiny runs on scikit-learn digits: 2 class-incremental experiences of 2 classes (24 training images
per class), streamed as sub-experiences of 12 with ``access_task_boundaries=True``, a 64-16-16-10
MLP. "Trained" is checked against the model's own initial weights and by accuracy measured here
with plain torch on the test images of the classes seen.
"""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
from avalanche.training.templates.observation_type.batch_observation import BatchObservation
from torch import nn

from avalanche_plugins import fix_replaced_model_optimizer
from avalanche_plugins._avalanche import compat
from tests.fixtures import evaluator, few_digits_benchmark, one_torch_thread

warnings.filterwarnings("ignore", category=DeprecationWarning)


one_thread = pytest.fixture(autouse=True)(one_torch_thread)


@pytest.fixture
def without_fix(monkeypatch):
    """Avalanche's own ``check_model_and_optimizer`` for this test (the fix is process-wide)."""
    fix_replaced_model_optimizer()
    monkeypatch.setattr(BatchObservation, "check_model_and_optimizer",
                        compat._check_model_and_optimizer_following.original)


def tiny_benchmark():
    return few_digits_benchmark(10, 24, 20, 5, class_order=False)


def subexperiences(access: bool = True):
    from avalanche.benchmarks.scenarios.online import split_online_stream

    return list(split_online_stream(tiny_benchmark().train_stream[:2], 12, access_task_boundaries=access, seed=0))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 10))


def run(strategy_cls, access: bool = True, **kwargs):
    """Train on the sub-experiences (seeded after the stream is built: it reseeds); returns the strategy."""
    subs = subexperiences(access)
    model = mlp()
    strategy = strategy_cls(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                            criterion=nn.CrossEntropyLoss(), train_mb_size=12, train_epochs=6, eval_mb_size=64,
                            evaluator=evaluator(), **kwargs)
    torch.manual_seed(1)
    for sub in subs:
        strategy.train(sub, num_workers=0)
    return strategy


def accuracy_on_seen_classes(model: nn.Module) -> float:
    bench = tiny_benchmark()
    seen = set().union(*(set(exp.classes_in_this_experience) for exp in bench.train_stream[:2]))
    xs, ys = zip(*[(x, int(y)) for exp in bench.test_stream[:2] for x, y, *_ in exp.dataset])
    x, y = torch.stack(xs), torch.tensor(ys)
    assert set(y.tolist()) == seen
    with torch.no_grad():
        return float((model.eval()(x).argmax(1) == y).float().mean())


def gdumb(**kwargs):
    from avalanche.training.supervised import GDumb

    return GDumb(mem_size=40, **kwargs)


def weights_changed(strategy) -> bool:
    """Whether the evaluated model's weights differ from GDumb's initial model's."""
    init = next(p.init_model for p in strategy.plugins if hasattr(p, "init_model"))
    return any(not torch.equal(a, b) for a, b in zip(strategy.model.state_dict().values(),
                                                     init.state_dict().values()))


def optimizer_holds_model(strategy) -> bool:
    in_optimizer = {id(p) for group in strategy.optimizer.param_groups for p in group["params"]}
    return all(id(p) in in_optimizer for p in strategy.model.parameters())


def test_online_gdumb_without_the_fix_evaluates_an_untrained_model(without_fix):
    strategy = run(gdumb)
    assert not weights_changed(strategy)  # Avalanche 0.6: the optimizer stepped the discarded model
    assert not optimizer_holds_model(strategy)
    assert accuracy_on_seen_classes(strategy.model) < 0.4


def test_online_gdumb_with_the_fix_trains_its_last_model():
    fix_replaced_model_optimizer()
    strategy = run(gdumb)
    assert weights_changed(strategy)
    assert optimizer_holds_model(strategy)
    # the optimizer is the one given, with its type and hyper-parameters
    assert type(strategy.optimizer) is torch.optim.SGD and len(strategy.optimizer.param_groups) == 1
    assert strategy.optimizer.param_groups[0]["lr"] == 0.1 and strategy.optimizer.param_groups[0]["momentum"] == 0.9
    assert accuracy_on_seen_classes(strategy.model) > 0.6  # 4 classes, 80 images: chance 0.25; measured 0.86 (0.09 without the fix)


def test_fix_is_idempotent():
    fix_replaced_model_optimizer()
    patched = BatchObservation.check_model_and_optimizer
    original = compat._check_model_and_optimizer_following.original
    fix_replaced_model_optimizer()
    assert BatchObservation.check_model_and_optimizer is patched
    assert compat._check_model_and_optimizer_following.original is original is not patched


@pytest.mark.parametrize("case", ["Naive online", "Replay online", "GDumb online, hidden boundaries"])
def test_bit_identical_when_the_model_is_not_replaced_off_a_boundary(case, monkeypatch):
    from avalanche.training.supervised import Naive, Replay

    strategy_cls, access = {"Naive online": (Naive, True),
                            "Replay online": (functools.partial(Replay, mem_size=20), True),
                            "GDumb online, hidden boundaries": (gdumb, False)}[case]
    calls = []
    original_make = BatchObservation.make_optimizer
    monkeypatch.setattr(BatchObservation, "make_optimizer",
                        lambda self, **kw: (calls.append(1), original_make(self, **kw))[1])
    fix_replaced_model_optimizer()
    fixed = run(strategy_cls, access)
    fixed_calls = len(calls)
    calls.clear()
    monkeypatch.setattr(BatchObservation, "check_model_and_optimizer",
                        compat._check_model_and_optimizer_following.original)
    plain = run(strategy_cls, access)
    assert fixed_calls == len(calls)  # the fix never called make_optimizer itself
    assert all(torch.equal(a, b) for a, b in zip(fixed.model.state_dict().values(),
                                                 plain.model.state_dict().values()))
    assert copy.deepcopy(fixed.optimizer.state_dict()["param_groups"]) == plain.optimizer.state_dict()["param_groups"]


def test_online_gdumb_with_a_diagnostic_and_a_one_sample_sub_experience():
    """A sub-experience of 1 sample (48 images streamed 47 + 1): GDumb's fresh model there is
    pre-flight checked on GDumb's buffer (what it trains on), not refused for having 1 sample."""
    from avalanche.benchmarks.scenarios.online import split_online_stream

    import avalanche_plugins as ap

    fix_replaced_model_optimizer()
    subs = list(split_online_stream(tiny_benchmark().train_stream[:2], 47, access_task_boundaries=True, seed=0))
    assert sorted(len(sub.dataset) for sub in subs) == [1, 1, 47, 47]
    metric = ap.LayerSensitivityMetric(n_samples=16)
    model = mlp()
    strategy = gdumb(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=12, train_epochs=1, eval_mb_size=64,
                     evaluator=evaluator(metric))
    for sub in subs:
        strategy.train(sub, num_workers=0)
    assert weights_changed(strategy)
    assert len(metric.history) == 2  # measured once per original experience
