"""Every script in ``examples/`` runs in its quick form, in-process, and returns/prints/writes what
its docstring promises (the examples are what users copy; a broken one is a broken front door)."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from tests import REPO_ROOT
from tests.fixtures import one_torch_thread

EXAMPLES = REPO_ROOT / "examples"


def load(name: str):
    """Import ``examples/<name>.py`` by path (the folder is not a package)."""
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"examples_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


one_thread = pytest.fixture(autouse=True)(one_torch_thread)  # what each example's ``__main__`` does


def test_every_example_has_main_quick_and_a_docstring():
    scripts = sorted(EXAMPLES.glob("[0-9][0-9]_*.py"))
    assert [p.name[:2] for p in scripts] == [f"{i:02d}" for i in range(1, len(scripts) + 1)]
    readme = (EXAMPLES / "README.md").read_text()
    for path in scripts:
        text = path.read_text()
        assert text.startswith('"""') and "--quick" in text and "def main(quick: bool = False" in text, path.name
        assert "_avalanche" not in text.replace("quiet_evaluator", ""), f"{path.name} imports a private module"
        assert path.name in readme, f"{path.name} missing from examples/README.md"


def test_01_layer_adaptive_ewc(tmp_path, capsys):
    results = load("01_layer_adaptive_ewc").main(quick=True, out_dir=tmp_path)
    printed = capsys.readouterr().out
    assert set(results) == {"naive", "geometric"}
    for run in results.values():
        assert 0.5 < run["accuracy"] <= 1.0  # 2-way tasks: above chance
    geometric = results["geometric"]
    assert geometric["lambdas"] == pytest.approx([100.0, 50.0, 25.0])  # λ·2^-(ℓ-1) on 3 layers
    assert len(geometric["layer_names"]) == 3
    assert "geometric" in printed and "λ_ℓ" in printed
    assert json.loads((tmp_path / "results.json").read_text())["geometric"]["lambdas"] == geometric["lambdas"]


def test_02_grow_prune_with_replay(tmp_path, capsys):
    results = load("02_grow_prune_with_replay").main(quick=True, out_dir=tmp_path)
    assert set(results) == {"dense", "prune", "grow"}
    assert results["dense"]["units_in_use"] == 1.0
    for name in ("prune", "grow"):  # both reach their target compactness within the 5 one-epoch cycles
        assert results[name]["units_in_use"] == pytest.approx(0.5, abs=0.01)
    for r in results.values():
        assert r["cycles"] == 5 and 0.0 <= r["accuracy"] <= 1.0 and 0.0 <= r["taa"] <= 1.0
    assert results["dense"]["accuracy"] > 0.3  # replay keeps old classes above 1/10 chance
    assert "units in use" in capsys.readouterr().out


def test_03_monitor_plasticity_with_or(tmp_path, capsys):
    result = load("03_monitor_plasticity_with_or").main(quick=True, out_dir=tmp_path)
    rows = result["rows"]
    assert [r["experience"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert r["OR"] == pytest.approx(r["S"] * r["R"], rel=1e-6) and r["OR"] > 0
        assert math.isfinite(r["gain"]) and 0.0 <= r["accuracy"] <= 1.0
    assert -1.0 <= result["spearman"] <= 1.0
    assert "Spearman(OR, G^(10))" in capsys.readouterr().out


def test_04_choose_architecture_with_ads(tmp_path, capsys):
    result = load("04_choose_architecture_with_ads").main(quick=True, out_dir=tmp_path)
    ranking, predicted = result["ranking"], result["predicted"]
    assert sorted(ranking) == sorted(predicted) == sorted(result["realised"]) and len(ranking) == 4
    assert [predicted[n] for n in ranking] == sorted(predicted.values())  # least predicted shift first
    assert all(v > 0 and math.isfinite(v) for v in [*predicted.values(), *result["realised"].values()])
    assert -1.0 <= result["spearman"] <= 1.0
    printed = capsys.readouterr().out
    assert f"choice: {ranking[0]}" in printed
    assert json.loads((tmp_path / "results.json").read_text())["ranking"] == ranking


def test_05_transport_keys_after_forgetting(tmp_path, capsys):
    result = load("05_transport_keys_after_forgetting").main(quick=True, out_dir=tmp_path)
    assert result["after"] == 2 and result["acc_checkpoint"] > 0.9  # θ_A knew task A
    assert result["acc_updated"] < 0.2  # class-incremental Naive: forgotten
    stitched = result["acc"]
    assert {"stage=block1/family=identity", "stage=block2/family=cross_channel",
            "stage=block1/family=channel/control=global_shuffle"} <= set(stitched)
    # the point of the example: an early-stage key reads task A back out of the current model
    assert stitched["stage=block1/family=cross_channel"] > result["acc_updated"] + 0.5
    assert "control" in capsys.readouterr().out


def test_06_all_metrics_to_tensorboard(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = load("06_all_metrics_to_tensorboard").main(quick=True, out_dir=tmp_path)
    ours = {"LayerSensitivityKappa", "OptimizationReadiness", "ADS", "ADSRealisedShift", "TransportKeyAcc",
            "TransportKeyRecovery", "CycleAccuracy", "TAA", "NewbornGradientRatio"}
    # read the event file independently of the example
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "images": 0}).Reload()
    tags = events.Tags()
    assert ours | {"Top1_Acc_Stream"} <= {t.split("/")[0] for t in tags["scalars"]}
    assert any(t.startswith("LayerSensitivityProfile/") for t in tags["images"])
    assert any(t.startswith("LayerSensitivity/") and t.endswith("/block1.0") for t in tags["scalars"])  # dict key
    # the tidy CSV holds the same values as TensorBoard, metric by metric
    assert result["csv_rows"] == result["tensorboard_values"]
    assert ours <= set(result["csv_rows"])
    assert (tmp_path / "metrics.csv").stat().st_size > 0 and "TransportKeyRecovery" in capsys.readouterr().out


def test_07_comparative_study(tmp_path, capsys):
    pytest.importorskip("yaml")  # avalanche_plugins.study's config reader; installed with the [bench] extra
    result = load("07_comparative_study").main(quick=True, out_dir=tmp_path)
    assert [r.strategy for r in result.rows] == ["Naive", "EWC", "LwF", "LayerAdaptiveEWC"]
    assert all(0.0 <= r.acc <= 1.0 and r.seed == 0 for r in result.rows)
    assert set(result.chosen["split_digits_task"]) == {"EWC", "LayerAdaptiveEWC"}
    assert "| LayerAdaptiveEWC |" in result.tables["markdown"] and "\\begin{tabular}" in result.tables["latex"]
    assert result.report.is_file() and result.csv.is_file()
    assert "| strategy |" in capsys.readouterr().out
