"""End-to-end smoke of ``benchmarks.grow_prune --quick`` (digits, one seed, c = 30 %)."""

import json

import pytest

from benchmarks import grow_prune


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
