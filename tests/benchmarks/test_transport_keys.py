"""End-to-end smoke of ``benchmarks.transport_keys --quick`` (digits, small CNN, one seed)."""

import json
import math

import pytest

from benchmarks import transport_keys


@pytest.mark.slow
def test_quick_run_writes_recovery_per_stage_family_control_and_time_ratio(tmp_path):
    transport_keys.main(["--quick", "--no-progress", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    rows = data["runs"]
    main = [r for r in rows if r["n_anchors"] == 100]
    variants = {r["variant"] for r in main}
    for family in ("channel", "cross_channel"):
        assert {family, f"{family}/channel_permutation", f"{family}/global_shuffle",
                f"{family}/within_class_shuffle"} <= variants
    assert {"identity", "cross_channel+refine", "cross_channel+gauss_newton", "trained_stitch"} <= variants
    assert {r["stage"] for r in main} == set(transport_keys.STAGES["cnn"])
    assert all(0.0 <= r["acc"] <= 1.0 and r["bn_mode"] == "eval" for r in rows)
    for r in rows:  # recovery is the formula of the row's accuracies
        expected = (r["acc"] - r["acc_ab"]) / (r["acc_a"] - r["acc_ab"])
        assert math.isclose(r["recovery"], expected, rel_tol=1e-9)
    assert data["time_ratios"]["trained_over_cross_channel"] > 1
    assert math.isfinite(data["time_ratios"]["trained_over_gauss_newton"])
    assert (tmp_path / "recovery.png").exists() and (tmp_path / "jobs.jsonl").exists()
    # --report re-prints the docs tables from the saved run; a cell matches the rows
    run_report = (tmp_path / "report.md").read_text()
    text = transport_keys.main(["--report", str(tmp_path / "results.json")])["report"]
    assert text + "\n" == run_report
    stage = transport_keys.STAGES["cnn"][0]
    row = next(r for r in main if r["stage"] == stage and r["variant"] == "cross_channel+gauss_newton")
    line = next(t for t in text.splitlines() if f"| {stage} |" in t and "(" in t)
    assert f"{row['acc']:.3f} ({100 * row['recovery']:.0f}%)" in line
