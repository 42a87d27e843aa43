"""The report's Diagnostics table: κ and α̂ logged by ``LayerAdaptiveEWCPlugin(log_profile=True)``
summarised per strategy, checked against the values in ``metrics.csv`` recomputed here."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import yaml

from avalanche_plugins.study import run_study

CONFIG = {
    "name": "diagnostics_table",
    "seeds": 2,
    "reference": "Naive",
    "scenarios": [{"name": "digits", "benchmark": "split_digits", "n_experiences": 2}],
    "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
    "training": {"optimizer": "sgd", "lr": 0.05, "epochs": 1, "batch_size": 64},
    "strategies": ["Naive",
                   {"name": "LAE", "class": "Naive",
                    "plugins": [{"name": "LayerAdaptiveEWCPlugin",
                                 "kwargs": {"ewc_lambda": 1.0, "schedule": "smoothed", "log_profile": True,
                                            "spectrum_samples": 32}}]}],
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    run_study(path, out=out / "run", progress=False)
    return out / "run"


def _expected(out, metric: str) -> tuple[float, float]:
    """Mean and std over seeds of each test run's mean of ``metric`` (read from metrics.csv)."""
    with open(out / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "test" and r["metric"] == metric]
    per_seed = {}
    for r in rows:
        per_seed.setdefault(r["seed"], []).append(float(r["value"]))
    means = [np.mean(v) for v in per_seed.values()]
    assert len(means) == 2 and all(len(v) == 2 for v in per_seed.values())  # 2 seeds x 2 experiences
    return float(np.mean(means)), float(np.std(means, ddof=1))


def test_kappa_and_alpha_hat_per_strategy(study):
    saved = json.loads((study / "results.json").read_text())
    entries = saved["diagnostics"]
    assert [e["strategy"] for e in entries] == ["LAE"]  # Naive logged nothing: no row
    for metric, title in (("LayerSensitivityKappa", "κ"), ("LayerSensitivityAlphaHat", "α̂")):
        mean, std = _expected(study, metric)
        assert entries[0][title]["mean"] == pytest.approx(mean, rel=1e-12)
        assert entries[0][title]["std"] == pytest.approx(std, rel=1e-9)
        assert entries[0][title]["n"] == 2
    kappa_mean, kappa_std = _expected(study, "LayerSensitivityKappa")
    report = (study / "report.md").read_text()
    assert "## Diagnostics" in report
    assert f"| LAE | {kappa_mean:.3f} ± {kappa_std:.3f} |" in report
    assert "## Diagnostics" in (study / "tables.md").read_text()
    assert "diagnostics, mean over each run" in (study / "tables.tex").read_text()


def test_no_diagnostics_section_when_nothing_was_logged(tmp_path):
    config = {**CONFIG, "seeds": 1, "strategies": ["Naive"]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run_study(path, out=tmp_path / "run", progress=False)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["diagnostics"] == []
    assert "## Diagnostics" not in (tmp_path / "run" / "report.md").read_text()
