"""Grow / Prune plugins inside Avalanche runs: EWC + Replay, metrics, checkpoints, tickets, errors."""

import math

import pytest
import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import EWCPlugin, ReplayPlugin
from avalanche.training.supervised import Naive
from torch import nn

from avalanche_plugins import (
    CycleAccuracyMetric,
    FixedMaskPlugin,
    GrowPlugin,
    NewbornGradientMetric,
    PrunePlugin,
    fix_checkpoint_pickling,
    retrain_ticket,
)
from tests.cases import build_model
from tests.fixtures import digits_stream, evaluator
from tests.helpers import train_with_checkpoints

torch.set_num_threads(1)
HIDDEN = (32, 32)
LAYERS = ("features.1", "features.3")


def mlp(stream):
    return build_model("mlp", stream.input_shape, stream.n_classes, hidden=HIDDEN)


def run(plugin, *, n_experiences=3, epochs=1, stream=None, metrics=(), extra=(), seed=0, spy=None):
    stream = stream or digits_stream()
    torch.manual_seed(seed)
    model = mlp(stream)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    strategy = Naive(model=model, optimizer=optimizer, criterion=nn.CrossEntropyLoss(), train_mb_size=32,
                     train_epochs=epochs, plugins=[plugin, *([spy] if spy else []), EWCPlugin(10.0),
                                                   ReplayPlugin(mem_size=40), *extra],
                     evaluator=evaluator(*metrics))
    last = {}
    for experience in stream.benchmark.train_stream[:n_experiences]:
        last.update(strategy.train(experience, num_workers=0))
    return strategy, initial, last, stream


def test_grow_in_a_continual_run_with_ewc_and_replay():
    grow = GrowPlugin(0.5, seed_compactness=0.25, grow_fraction_per_cycle=0.125, epochs_per_cycle=1,
                      outgoing="zero", optimizer_state="zero", track_newborn=True)
    stream = digits_stream()
    cycles = CycleAccuracyMetric(stream.benchmark.test_stream, 1)
    newborn = NewbornGradientMetric(grow)
    strategy, initial, last, _ = run(grow, stream=stream, metrics=(cycles, newborn))
    masks = grow.masks
    assert masks.names == list(LAYERS)
    # seed 8 of 32 units, +4 per cycle at the start of experiences 1 and 2 -> 16 = 50 %
    assert [h["active"] for h in grow.history] == [{n: 12 for n in LAYERS}, {n: 16 for n in LAYERS}]
    assert [h["experience"] for h in grow.history] == [1, 2]
    assert masks.compactness() == 0.5
    # never-recruited units: exactly their initial weights (momentum, weight decay, EWC) and zero output
    model = strategy.model
    off = ~masks.masks["features.1"]
    assert torch.equal(model.features[1].weight[off], initial["features.1.weight"][off])
    assert torch.equal(model.features[1].bias[off], initial["features.1.bias"][off])
    x = stream.benchmark.test_stream[0].dataset[0][0].unsqueeze(0)
    assert torch.all(model.features[:3](x)[:, off] == 0)
    # metrics with Avalanche template names
    assert len(cycles.history) == 3  # one cycle per epoch: (iteration, accuracy) at each
    for i, (_, accuracy) in enumerate(cycles.history):
        assert last[f"CycleAccuracy/train_phase/train_stream/Task000/Exp{i:03d}"] == accuracy
    assert last["TAA/train_phase/train_stream/Task000/Exp002"] == pytest.approx(
        sum(a for _, a in cycles.history) / 3)
    assert cycles.result() == cycles.history[-1][1] and cycles.taa == last["TAA/train_phase/train_stream/Task000/Exp002"]
    assert len(grow.newborn_log) == 2 and all(r["n_newborn"] == 8 for r in grow.newborn_log)
    ratio = last["NewbornGradientRatio/train_phase/train_stream/Task000/Exp002"]
    assert ratio == grow.newborn_log[-1]["grad_ratio"] and math.isfinite(ratio) and ratio > 0
    assert newborn.history == grow.newborn_log and newborn.result() == ratio
    assert "NewbornActivation/train_phase/train_stream/Task000/Exp001" in last


class RewindSpy(SupervisedPlugin):
    """Placed after PrunePlugin: records the model right after each edit."""

    def __init__(self, prune):
        super().__init__()
        self.prune, self.seen, self.states = prune, 0, []

    def before_training_epoch(self, strategy, **kwargs):
        if len(self.prune.history) > self.seen:
            self.seen = len(self.prune.history)
            self.states.append({k: v.clone() for k, v in strategy.model.state_dict().items()})


def test_prune_rewinds_survivors_to_init_bit_for_bit():
    prune = PrunePlugin(0.5, prune_fraction_per_cycle=0.3, epochs_per_cycle=1, rewind_to="init")
    spy = RewindSpy(prune)
    strategy, initial, _, _ = run(prune, spy=spy)
    assert [h["active"] for h in prune.history] == [{n: 22 for n in LAYERS}, {n: 16 for n in LAYERS}]
    assert len(spy.states) == 2
    for state in spy.states:
        for key, value in initial.items():
            assert torch.equal(state[key], value), key
    # round(0.3 * 32) = 10 units removed in the first edit (their choice is tested in test_unit_masks)
    removed = prune.history[0]["units"]["features.1"]
    assert len(removed) == 10
    assert prune.masks.compactness() == 0.5


def test_grow_within_one_experience():
    stream = digits_stream(1)
    grow = GrowPlugin(0.5, 0.25, 0.125, epochs_per_cycle=1, score="gradient", cycle_scope="experience",
                      incoming="reinit", newborn_lr=2.0)
    run(grow, stream=stream, n_experiences=1, epochs=3)
    assert [(h["experience"], h["cycle"]) for h in grow.history] == [(0, 1), (0, 2)]
    assert grow.masks.compactness() == 0.5


def test_checkpoint_resume_matches_uninterrupted(tmp_path):
    from avalanche.training.determinism.rng_manager import RNGManager

    fix_checkpoint_pickling()

    def go(resume: bool):
        RNGManager.set_random_seeds(0)
        stream = digits_stream()
        RNGManager.set_random_seeds(0)

        def fresh():
            model = mlp(stream)
            grow = GrowPlugin(0.5, 0.25, 0.125, 1, optimizer_state="fresh", outgoing="zero", newborn_lr=3.0,
                              track_newborn=True)
            metrics = (CycleAccuracyMetric(stream.benchmark.test_stream, 1), NewbornGradientMetric(grow))
            return Naive(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4),
                         criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1,
                         plugins=[grow, EWCPlugin(10.0), ReplayPlugin(mem_size=40)],
                         evaluator=evaluator(*metrics))

        return train_with_checkpoints(fresh, stream.benchmark.train_stream[:3], tmp_path / f"ckpt_{resume}.pkl",
                                      resume_at=2 if resume else None, num_workers=0)

    straight, resumed = go(False), go(True)
    for p, q in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)
    a, b = straight.plugins[0], resumed.plugins[0]
    assert a.history == b.history and a.newborn_log == b.newborn_log
    assert {k: v.tolist() for k, v in a.masks.masks.items()} == {k: v.tolist() for k, v in b.masks.masks.items()}
    # the resumed plugin still controls the resumed model (hooks and parameters are the same objects)
    assert b.masks.model is resumed.model
    metric_a, metric_b = (next(m for m in s.evaluator.metrics if isinstance(m, CycleAccuracyMetric))
                          for s in (straight, resumed))
    assert metric_a.history == metric_b.history and len(metric_a.history) == 3


def test_retrain_ticket_reports_acc_and_taa():
    stream = digits_stream(2)
    mask = {"features.1": torch.arange(32) % 2 == 0, "features.3": torch.arange(32) < 8}
    result = retrain_ticket(mask, lambda: mlp(stream), stream, train_epochs=2,
                            plugins_factory=lambda: [ReplayPlugin(mem_size=40)],
                            optimizer_factory=lambda p: torch.optim.SGD(p, lr=0.05))
    assert result.compactness == pytest.approx(24 / 64)
    assert len(result.trajectory) == 4  # 2 experiences x 2 epochs, one cycle per epoch
    assert result.taa == pytest.approx(sum(a for _, a in result.trajectory) / 4)
    assert 0 <= result.acc <= 1 and result.acc == pytest.approx(result.trajectory[-1][1])
    again = retrain_ticket(mask, lambda: mlp(stream), stream, train_epochs=2,
                           plugins_factory=lambda: [ReplayPlugin(mem_size=40)],
                           optimizer_factory=lambda p: torch.optim.SGD(p, lr=0.05))
    assert again.trajectory == result.trajectory


@pytest.mark.parametrize(("make", "argument"), [
    (lambda: PrunePlugin(0.0), "target_compactness"),
    (lambda: PrunePlugin(1.5), "target_compactness"),
    (lambda: GrowPlugin(-0.1, 0.05), "target_compactness"),
    (lambda: GrowPlugin(0.3, 0.5), "seed_compactness"),
    (lambda: GrowPlugin(0.3, 0.0), "seed_compactness"),
    (lambda: GrowPlugin(0.3, 0.1, grow_fraction_per_cycle=2.0), "grow_fraction_per_cycle"),
    (lambda: PrunePlugin(0.3, prune_fraction_per_cycle=0.0), "prune_fraction_per_cycle"),
    (lambda: PrunePlugin(0.3, score="gradient"), "score"),
    (lambda: GrowPlugin(0.3, 0.1, score="weight_norm"), "score"),
    (lambda: PrunePlugin(0.3, epochs_per_cycle=0), "epochs_per_cycle"),
    (lambda: PrunePlugin(0.3, rewind_to="early"), "rewind_to"),
    (lambda: GrowPlugin(0.3, 0.1, cycle_scope="task"), "cycle_scope"),
    (lambda: GrowPlugin(0.3, 0.1, optimizer_state="warm"), "optimizer_state"),
    (lambda: FixedMaskPlugin({}), "mask"),
])
def test_bad_arguments_name_the_argument(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


def test_newborn_metric_needs_a_tracking_grow_plugin():
    with pytest.raises(ValueError, match="track_newborn=True"):
        NewbornGradientMetric(GrowPlugin(0.5, 0.25))
    with pytest.raises(ValueError, match="GrowPlugin"):
        NewbornGradientMetric(PrunePlugin(0.5))
    grow = GrowPlugin(0.5, 0.25, track_newborn=True)
    assert NewbornGradientMetric(grow).result() is None and grow.track_newborn


def test_model_without_maskable_hidden_layer_fails_clearly():
    stream = digits_stream()
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, plugins=[GrowPlugin(0.5, 0.25)],
                     evaluator=evaluator())
    with pytest.raises(ValueError, match="model Sequential has no maskable hidden layer"):
        strategy.train(stream.benchmark.train_stream[0], num_workers=0)
