"""End-to-end smoke of ``benchmarks.layer_adaptive_ewc --quick`` (digits, one worker)."""

import json

import pytest

from benchmarks import layer_adaptive_ewc


@pytest.mark.slow
def test_quick_run_writes_every_variant_and_cost_ratios(tmp_path):
    layer_adaptive_ewc.main(["--quick", "--no-progress", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    methods = {key.split("/")[-1] for key in data["methods"]}
    assert methods == set(layer_adaptive_ewc.METHODS)
    assert all(0.0 <= acc <= 1.0 for acc in data["methods"].values())
    assert 0 < data["penalty_time_ratio"] < 10
    assert set(data["spectrum_vs_epoch_ratio"]) == {"mlp", "cnn"}
    assert data["chosen"]["permuted/mlp/lae_uniform"]["ewc_lambda"] == data["chosen"]["permuted/mlp/ewc"]["ewc_lambda"]
    # uniform is EWCPlugin by construction: identical final accuracy on the same seed
    assert data["methods"]["permuted/mlp/lae_uniform"] == data["methods"]["permuted/mlp/ewc"]
    assert (tmp_path / "accuracy.png").exists() and (tmp_path / "results.csv").exists()
    assert {r["phase"] for r in data["runs"]} == {"tune", "test", "anchor"}
    text = layer_adaptive_ewc.main(["--report", str(tmp_path / "results.json")])["report"]
    assert "### permuted / mlp" in text and text + "\n" == (tmp_path / "report.md").read_text()
