"""``benchmarks.lae_costs`` (digits, quick) and the layer-adaptive EWC studies' matched tuning budget."""

import json

import pytest

from avalanche_plugins.study import load_study
from benchmarks import lae_costs
from tests import REPO_ROOT

ROOT = REPO_ROOT
GRID_STUDIES = ("split_mlp", "split_cnn", "permuted_mlp", "permuted_mlp_capped")


def test_quick_run_writes_both_cost_ratios(tmp_path):
    results = lae_costs.main(["--quick", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    penalty = saved["penalty"]
    assert penalty["anchors"] == 3 and penalty["penalty_ms_ewc"] > 0 and penalty["penalty_ms_lae"] > 0
    assert penalty["penalty_time_ratio"] == pytest.approx(penalty["penalty_ms_lae"] / penalty["penalty_ms_ewc"], rel=1e-5)
    assert set(saved["spectrum"]) == {"mlp", "cnn"}
    for cost in saved["spectrum"].values():
        assert cost["spectrum_vs_epoch"] == pytest.approx(cost["spectrum_s"] / cost["epoch_s"], rel=1e-5)
        assert cost["epoch_samples"] > 0
    again = lae_costs.main(["--report", str(tmp_path / "results.json")])["report"]
    assert again == results["report"] and again + "\n" == (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("name", GRID_STUDIES)
def test_every_ewc_variant_gets_the_same_lambda_grid(name):
    study = load_study(ROOT / "studies" / f"layer_adaptive_ewc_{name}.yaml")
    grids = {s.name: {g.key.rpartition(".")[2]: g.values for g in s.spec.grid} for s in study.strategies}
    assert grids.pop("Naive") == {}
    lambdas = {grid.pop("ewc_lambda") for grid in grids.values()}
    assert len(lambdas) == 1  # one λ grid for every variant
    assert grids.pop("LAE_geometric") == {"alpha": (0.5, 2.0)}  # geometric also tunes α
    assert all(grid == {} for grid in grids.values())
