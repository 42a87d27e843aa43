"""Grow / Prune cycle clocks in epochs, iterations and samples, on online and ordinary streams (issue 31).

With replay (``ReplayPlugin(batch_size=1)``, 1 new + 10 replayed samples per minibatch) the
``"samples"`` clock counts the stream samples only and ``"minibatch_samples"`` every sample (issue 38).

The stream: scikit-learn digits, 20 training images of each of 4 classes, two experiences of 2
classes (40 images each), streamed as sub-experiences of 10 images (``split_online_stream``, 4 per
experience), minibatches of 4. Each sub-experience is then 3 iterations of 4, 4 and 2 samples, so
an original experience is 12 iterations and the stream 24. The edit points below are counted by
hand from that; the plugins' ``history`` records ``strategy.clock.train_iterations`` (iterations
done) when they edit.
"""

from __future__ import annotations

import copy
import types
import warnings

import pytest
import torch
from torch import nn

import avalanche_plugins as ap
from avalanche_plugins.structural.cycles import CycleClock, cycle_settings
from tests.fixtures import evaluator, few_digits_benchmark
from tests.integration.test_strategies import assert_masks_bound_and_exact

warnings.filterwarnings("ignore", category=DeprecationWarning)


def four_class_digits():
    return few_digits_benchmark(4, 20, 8, 2)


def online_stream(access: bool = True):
    from avalanche.benchmarks.scenarios.online import split_online_stream

    return list(split_online_stream(four_class_digits().train_stream, 10, access_task_boundaries=access, seed=0))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def naive(plugins=(), metrics=(), model=None, mb_size: int = 4):
    from avalanche.training.supervised import Naive

    model = model if model is not None else mlp()
    return Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05), criterion=nn.CrossEntropyLoss(),
                 train_mb_size=mb_size, train_epochs=1, eval_mb_size=64, plugins=list(plugins),
                 evaluator=evaluator(*metrics))


def grow(**cycle):
    # 4 of 16 units per layer to start, 2 recruited per edit, up to all 16: room for 6 edits
    return ap.GrowPlugin(1.0, seed_compactness=0.25, grow_fraction_per_cycle=0.125, **cycle)


def run(experiences, plugins=(), metrics=(), **kwargs):
    strategy = naive(plugins, metrics, **kwargs)
    for experience in experiences:
        strategy.train(experience, num_workers=0)
    return strategy


def test_the_stream_is_what_the_hand_counts_assume():
    subexps = online_stream()
    assert [len(s.dataset) for s in subexps] == [10] * 8
    strategy = run(subexps)
    assert strategy.clock.train_iterations == 24


def test_iteration_clock_on_an_online_stream_edits_every_k_iterations_across_sub_experiences():
    plugin = grow(cycle_unit="iterations", cycle_length=5)
    cycles = ap.CycleAccuracyMetric(four_class_digits().test_stream, cycle_unit="iterations", cycle_length=5)
    strategy = run(online_stream(), [plugin], [cycles])
    # cycles end after iterations 5, 10, 15, 20; the edit comes at the start of the next iteration;
    # iterations 0-11 are experience 0, 12-23 experience 1
    assert [h["iteration"] for h in plugin.history] == [5, 10, 15, 20]
    assert [h["experience"] for h in plugin.history] == [0, 0, 1, 1]
    assert [h["cycle"] for h in plugin.history] == [1, 2, 3, 4]
    assert len(cycles.history) == 4  # one evaluation per cycle end, the same clock
    assert plugin.masks.active_counts() == {"1": 12, "3": 12}  # 4 + 4 edits x 2
    assert assert_masks_bound_and_exact(plugin, strategy) == 8


def test_sample_clock_on_an_online_stream_counts_the_stream_samples():
    plugin = grow(cycle_unit="samples", cycle_length=12)
    cycles = ap.CycleAccuracyMetric(four_class_digits().test_stream, cycle_unit="samples", cycle_length=12)
    strategy = run(online_stream(), [plugin], [cycles])
    # samples after iteration 1, 2, ...: 4, 8, 10, 14, 18, 20, 24, 28, 30, 34, 38, 40, 44, 48, 50, 54,
    # 58, 60, 64, 68, 70, 74, 78, 80: multiples of 12 reached at iterations 4 (14), 7 (24), 11 (38),
    # 14 (48), 18 (60) and 22 (74); 80 samples end the stream before 84
    assert [h["iteration"] for h in plugin.history] == [4, 7, 11, 14, 18, 22]
    assert [h["experience"] for h in plugin.history] == [0, 0, 0, 1, 1, 1]
    assert len(cycles.history) == 6
    assert plugin.clock.count == 80 and plugin.clock.cycle == 6
    assert plugin.done and assert_masks_bound_and_exact(plugin, strategy) == 0


class NewSampleSpy:
    """Per training iteration: (samples of the current experience, minibatch samples), the first
    found by matching the minibatch's inputs against the experience's own, row by row."""

    def __init__(self):
        self.rows, self._inputs = [], {}

    def after_training_iteration(self, strategy, **kwargs):
        data = strategy.experience.dataset
        if id(data) not in self._inputs:
            self._inputs = {id(data): torch.stack([data[i][0] for i in range(len(data))]).flatten(1)}
        x = strategy.mb_x.flatten(1)
        own = int((torch.cdist(x, self._inputs[id(data)]) == 0).any(1).sum())
        self.rows.append((own, len(x)))


def replay_online_run(unit: str, with_metric: bool = True):
    """Avalanche's online_replay.py setting on the stream above: ReplayPlugin(batch_size=1) and
    train_mb_size=10, so 1 new + 10 replayed samples per minibatch (the first sub-experience, with an
    empty buffer: one minibatch of 10 new); 20 samples per cycle."""
    from avalanche.training.plugins import ReplayPlugin

    plugin, spy = grow(cycle_unit=unit, cycle_length=20), NewSampleSpy()
    metrics = [ap.CycleAccuracyMetric(four_class_digits().test_stream, cycle_unit=unit, cycle_length=20)] \
        if with_metric else []
    run(online_stream(), [ReplayPlugin(mem_size=40, batch_size=1, batch_size_mem=10), spy, plugin], metrics,
        mb_size=10)
    return plugin, metrics, spy


def _cycle_ends(per_iteration, length):
    """The iterations (1-based) after which a running sum of ``per_iteration`` reaches a new multiple."""
    ends, total = [], 0
    for i, n in enumerate(per_iteration, start=1):
        if (total + n) // length > total // length:
            ends.append(i)
        total += n
    return ends


def test_the_sample_clock_counts_stream_samples_under_replay_and_minibatch_samples_counts_all():
    plugin, (cycles,), spy = replay_online_run("samples")
    new = [r[0] for r in spy.rows]
    assert spy.rows[:3] == [(10, 10), (1, 11), (1, 11)] and sum(new) == 80 and len(spy.rows) == 71
    # every 20 stream samples: cycles end after iterations 11, 31, 51 and 71 (the last: no edit after it)
    assert _cycle_ends(new, 20) == [11, 31, 51, 71]
    assert [h["iteration"] for h in plugin.history] == [11, 31, 51]
    assert [sum(new[:h["iteration"]]) for h in plugin.history] == [20, 40, 60]
    assert plugin.clock.count == 80 and plugin.clock.cycle == 4
    # the metric evaluates in after_training_iteration, before Avalanche's clock counts that iteration
    assert [i + 1 for i, _ in cycles.history] == [11, 31, 51, 71]

    plugin, _, spy = replay_online_run("minibatch_samples", with_metric=False)
    total = [r[1] for r in spy.rows]
    assert sum(total) == plugin.clock.count == 10 + 70 * 11  # 9.75 times the 80 stream samples
    ends = _cycle_ends(total, 20)
    assert [h["iteration"] for h in plugin.history] == ends[:6]  # 6 edits reach the full width
    assert ends[:3] == [2, 4, 6]  # 21, 43, 65 minibatch samples: only 11, 13, 15 stream samples


def test_the_stream_sample_count_follows_the_loader_of_the_experiences_own_data():
    from avalanche_plugins.structural.cycles import own_batch_size

    loader = types.SimpleNamespace(datasets=[range(10), range(40)], batch_sizes=[1, 10])  # ReplayDataLoader
    strategy = types.SimpleNamespace(dataloader=loader, adapted_dataset=range(10))
    assert own_batch_size(strategy) == 1
    strategy.adapted_dataset = range(50)  # a task-balanced loader over the experience split by task
    assert own_batch_size(strategy) == 11
    strategy.dataloader = torch.utils.data.DataLoader(range(10), batch_size=4)
    assert own_batch_size(strategy) == 4
    # an epoch of 10 stream samples in minibatches of 1 + 10 replayed, then a new epoch
    clock = CycleClock(unit="samples", length=3)
    strategy = types.SimpleNamespace(dataloader=loader, adapted_dataset=range(10), experience=types.SimpleNamespace(
        dataset=range(10)), clock=types.SimpleNamespace(train_exp_counter=0, train_exp_epochs=0), mb_y=range(11))
    assert [clock.iteration_amount(strategy) for _ in range(11)] == [1] * 10 + [0]
    strategy.clock.train_exp_epochs = 1
    assert clock.iteration_amount(strategy) == 1
    assert CycleClock(unit="minibatch_samples", length=3).iteration_amount(strategy) == 11
    old = CycleClock(unit="samples", length=3)
    del old.__dict__["_excludes_replay"]  # a "samples" clock pickled before replay was excluded
    assert old.iteration_amount(strategy) == 11


def test_epoch_clock_on_an_online_stream_counts_one_pass_over_an_original_experience_as_one_epoch():
    """The documented conversion: an epoch clock counts original experiences; the edit comes at the
    first sub-experience of the next one, and a newborn record covers the whole original experience."""
    plugin = grow(epochs_per_cycle=1, track_newborn=True)
    cycles = ap.CycleAccuracyMetric(four_class_digits().test_stream)
    strategy = run(online_stream(), [plugin], [cycles])
    assert [h["iteration"] for h in plugin.history] == [12]
    assert [h["experience"] for h in plugin.history] == [1]
    assert len(cycles.history) == 2 and plugin.clock.epoch == 2
    assert [r["iterations"] for r in plugin.newborn_log] == [12]  # iterations 12-23, all of experience 1
    assert assert_masks_bound_and_exact(plugin, strategy) == 20


def test_newborn_records_close_at_the_end_of_an_iteration_cycle():
    plugin = grow(cycle_unit="iterations", cycle_length=5, track_newborn=True)
    metric = ap.NewbornGradientMetric(plugin)
    run(online_stream(), [plugin], [metric])
    # growth at 5, 10, 15, 20: the first three cycles close after 5 iterations each; the fourth
    # (iterations 21-24) never reaches its end and logs nothing
    assert [r["iterations"] for r in plugin.newborn_log] == [5, 5, 5]
    assert [r["iteration"] for r in metric.history] == [r["iteration"] for r in plugin.newborn_log]


def test_experience_scope_restarts_an_iteration_clock_at_each_original_experience():
    plugin = grow(cycle_unit="iterations", cycle_length=5, cycle_scope="experience")
    run(online_stream(), [plugin])
    # per experience: cycles end after its iterations 5 and 10 (edits at 5 and 10 of 12); the
    # count restarts at iteration 12
    assert [h["iteration"] for h in plugin.history] == [5, 10, 17, 22]


def test_iteration_clock_on_an_ordinary_stream_edits_within_epochs():
    plugin = ap.PrunePlugin(0.5, prune_fraction_per_cycle=0.2, cycle_unit="iterations", cycle_length=7)
    strategy = run(four_class_digits().train_stream, [plugin])
    # 40 images per experience in minibatches of 4: 10 iterations each, 20 in all; prunes at 7 and
    # 14, within epochs (16 units: 16 -> 13 -> 10; the third cycle would end after iteration 21)
    assert [h["iteration"] for h in plugin.history] == [7, 14]
    assert [h["active"] for h in plugin.history] == [{"1": 13, "3": 13}, {"1": 10, "3": 10}]
    assert assert_masks_bound_and_exact(plugin, strategy) == 12


def test_an_epoch_clock_keeps_its_numbers_on_an_ordinary_stream():
    """The default clock is the epoch clock of before: same edits, same weights as epochs_per_cycle=1."""
    states = []
    for cycle in ({}, {"epochs_per_cycle": 1}, {"cycle_unit": "epochs", "cycle_length": 1}):
        plugin = grow(**cycle)
        strategy = run(four_class_digits().train_stream, [plugin])
        assert [h["iteration"] for h in plugin.history] == [10]  # the start of experience 1
        states.append(strategy.model.state_dict())
    assert all(torch.equal(states[0][k], s[k]) for s in states[1:] for k in states[0])


# --------------------------------------------------------------------------- checks up front


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cycle_unit": "iterations"}, "cycle_unit='iterations' needs cycle_length"),
    ({"cycle_unit": "samples", "cycle_length": 0}, "cycle_length must be an int >= 1"),
    ({"cycle_unit": "samples", "cycle_length": 100, "epochs_per_cycle": 2}, "epochs_per_cycle=2 counts epochs"),
    ({"cycle_unit": "steps", "cycle_length": 100}, "cycle_unit must be one of"),
    ({"epochs_per_cycle": 2, "cycle_length": 3}, "disagree"),
    ({"epochs_per_cycle": 0}, "epochs_per_cycle must be an int >= 1"),
])
def test_cycle_settings_are_checked_when_built(kwargs, message):
    for build in (lambda: grow(**kwargs), lambda: ap.PrunePlugin(0.5, **kwargs),
                  lambda: ap.CycleAccuracyMetric(four_class_digits().test_stream, **kwargs)):
        with pytest.raises(ValueError, match=message):
            build()


def test_a_sample_cycle_shorter_than_a_minibatch_is_refused_before_training():
    for component in (grow(cycle_unit="samples", cycle_length=3),
                      ap.CycleAccuracyMetric(four_class_digits().test_stream, cycle_unit="samples", cycle_length=3)):
        model = mlp()
        before = copy.deepcopy(model.state_dict())
        plugins, metrics = ([component], []) if isinstance(component, ap.GrowPlugin) else ([], [component])
        strategy = naive(plugins, metrics, model=model)
        with pytest.raises(ValueError, match=rf"{type(component).__name__}: cycle_length=3 samples .*train_mb_size=4"):
            strategy.train(online_stream()[0], num_workers=0)
        assert strategy.clock.train_iterations == 0
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_rewind_point_after_the_first_iteration_cycle_is_refused_before_training():
    prune = ap.PrunePlugin(0.5, cycle_unit="iterations", cycle_length=5, rewind_to=6)
    strategy = naive([prune])
    with pytest.raises(ValueError, match=r"rewind_to=6 iterations, but the first prune comes after 5 \(iterations\)"):
        strategy.train(online_stream()[0], num_workers=0)
    assert strategy.clock.train_iterations == 0


def test_iteration_clocks_on_a_hidden_boundary_stream_are_refused_naming_the_option():
    with pytest.raises(ValueError, match="GrowPlugin .*access_task_boundaries=True"):
        run(online_stream(access=False)[:1], [grow(cycle_unit="samples", cycle_length=20)])


def test_the_study_gives_cycle_accuracy_the_plugins_clock():
    from avalanche_plugins.study.catalog.diagnostics import _cycle_accuracy

    stream = types.SimpleNamespace(benchmark=four_class_digits())
    for plugin, expected in ((grow(cycle_unit="samples", cycle_length=50), {"cycle_unit": "samples", "cycle_length": 50}),
                             (grow(epochs_per_cycle=2), {"cycle_unit": "epochs", "epochs_per_cycle": 2})):
        context = types.SimpleNamespace(stream=stream, editing=lambda plugin=plugin: [plugin])
        kwargs = _cycle_accuracy({}, context)
        assert {k: kwargs[k] for k in expected} == expected and kwargs["cycle_scope"] == "stream"
        metric = ap.CycleAccuracyMetric(**kwargs)
        assert (metric.clock.unit, metric.clock.length) == (plugin.clock.unit, plugin.clock.length)


def test_clock_doctest_counts_match_a_plain_count():
    """The sample clock against an independent count: cycles end where floor(total / length) grows."""
    sizes = [4, 4, 2] * 8
    clock = CycleClock(unit="samples", length=12)
    ended, total = [], 0
    for i, n in enumerate(sizes, start=1):
        if clock.end_iteration(n):
            ended.append(i)
        total += n
    expected = [i for i in range(1, len(sizes) + 1) if sum(sizes[:i]) // 12 > sum(sizes[:i - 1]) // 12]
    assert ended == expected == [4, 7, 11, 14, 18, 22]
    assert cycle_settings(None, "iterations", 7) == ("iterations", 7)
