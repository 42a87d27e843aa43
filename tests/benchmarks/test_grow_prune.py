"""End-to-end smoke of ``benchmarks.grow_prune --quick`` (digits, one seed, c = 30 %)."""

import json

import pytest
import torch

from benchmarks import grow_prune
from benchmarks.grow_prune import job as grow_prune_job
from benchmarks.grow_prune import settings as grow_prune_settings


@pytest.mark.slow
def test_quick_run_writes_acc_taa_tickets_ratio_and_cost(tmp_path):
    grow_prune.main(["--quick", "--no-progress", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    rows = data["runs"]
    methods = {r["method"] for r in rows}
    assert {"dense", "prune", "grow"} <= methods
    for r in rows:
        assert 0.0 <= r["acc"] <= 1.0 and 0.0 <= r["taa"] <= 1.0
        if r["method"] != "dense":
            assert r["compactness"] == 0.3 and 0.0 <= r["ticket_acc"] <= 1.0
        if r["method"].startswith("grow"):
            assert r["newborn_grad_ratio"] > 0
    assert 0 < data["masked_over_dense_time_per_epoch"] < 10
    assert (tmp_path / "trajectory.png").exists() and (tmp_path / "jobs.jsonl").exists()
    # --report re-prints the paired analysis from the saved file, matching the rows
    grow = next(r for r in rows if r["method"] == "grow")
    prune = next(r for r in rows if r["method"] == "prune")
    report = grow_prune.main(["--report", str(tmp_path / "results.json")])["report"]
    assert report + "\n" == (tmp_path / "report.md").read_text()
    assert f"| {grow['setting']} | 30% | {grow['acc'] - prune['acc']:+.3f} (" in report


def test_fixed_budget_setting_edits_late_in_each_experience_and_dense_has_no_clock():
    """``mlp permuted mnist T4 E1``: every method trains 4 epochs per experience; Grow and Prune edit
    3 epochs into each experience after the first (1 epoch before the next task)."""
    from types import SimpleNamespace

    args = SimpleNamespace(quick=False, data_root="unused", cnn_widths=[8], cnn_lr=0.05, integration_epochs=[1, 4],
                           permuted_experiences=3, permuted_subset=100, fixed_budget_epochs=4)
    settings = {s.name: s for s in grow_prune.settings_for(args)}
    late, early = settings["mlp permuted mnist T4 E1"], settings["mlp permuted mnist T4 E4"]
    assert (late.epochs, late.edit_epoch, early.edit_epoch) == (4, 3, 0)
    for method in ("grow", "prune+norewind"):
        clock = grow_prune.make_plugin(method, late, 0.3, seed=0).clock
        due = [epoch for epoch in range(12) if (clock.edit_due(), clock.end_epoch())[0]]
        assert due == [7, 11]  # experiences 1 and 2, epoch 3 of 4
    assert type(grow_prune.make_plugin("grow", early, 0.3, seed=0).clock) is not grow_prune.DelayedEditClock
    assert grow_prune.make_plugin("dense", late, 0.3, seed=0) is None
    leaky = settings["mlp leaky permuted mnist T4 E1"]
    assert leaky.leaky and leaky.edit_epoch == 3 and not late.leaky
    for method in ("grow", "prune+norewind"):  # masks and model share the activation
        assert grow_prune.make_plugin(method, leaky, 0.3, seed=0).activation is grow_prune_settings._LEAKY
    model = grow_prune.make_model(leaky, 10, (1, 28, 28), grow_prune.uses_leaky(leaky, "dense"))
    assert any(isinstance(m, torch.nn.LeakyReLU) for m in model.modules())
    with pytest.raises(ValueError, match="edit_epoch must be in"):
        grow_prune.DelayedEditClock(4, 4)


def test_random_label_stream_relabels_the_same_images_and_tests_on_them():
    x = torch.randn(64, 1, 4, 4)
    bench = grow_prune_job._random_label_benchmark(x, n_experiences=3)
    labels = []
    for train, test in zip(bench.train_stream, bench.test_stream):
        xs, ys = zip(*[(train.dataset[i][0], int(train.dataset[i][1])) for i in range(len(x))])
        assert torch.equal(torch.stack(xs), x)  # the same images every experience
        assert [int(test.dataset[i][1]) for i in range(len(x))] == list(ys)  # evaluated on its own labels
        labels.append(ys)
    assert labels[0] != labels[1] and len(set(labels[0])) > 5  # a fresh, spread labelling each time
