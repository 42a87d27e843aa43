"""docs/targets.csv (the continual-learning-baselines reproduction targets) and the configs that
produce it: the table parses and is complete, and every config under studies/targets/ validates."""

from __future__ import annotations

import csv
import math
import re

import pytest

from avalanche_plugins.study import load_study
from benchmarks.targets import COLUMNS, TARGETS
from tests import REPO_ROOT

ROOT = REPO_ROOT
CSV_PATH = ROOT / "docs" / "targets.csv"
CONFIGS = sorted((ROOT / "studies" / "targets").glob("*.yaml"))

EXPECTED = {
    ("permuted_mnist", "EWC"), ("permuted_mnist", "SynapticIntelligence"), ("permuted_mnist", "GEM"),
    ("permuted_mnist", "AGEM"), ("permuted_mnist", "LwF"), ("permuted_mnist", "LFL"),
    ("split_mnist_task", "SynapticIntelligence"), ("split_mnist_task", "RWalk"), ("split_mnist", "LwF"),
    ("split_mnist", "GDumb"), ("split_mnist", "GenerativeReplay"), ("split_mnist_1000", "GSS_greedy"),
}


def _rows() -> list[dict]:
    with open(CSV_PATH, newline="") as f:
        return list(csv.DictReader(f))


def test_targets_csv_has_every_target_and_column():
    rows = _rows()
    assert set(COLUMNS) <= set(rows[0])
    assert {(r["scenario"], r["strategy"]) for r in rows} == EXPECTED
    assert len(rows) == len(EXPECTED) == len(TARGETS)
    for r in rows:
        target = float(r["their_target"])
        assert 0.0 <= target <= 1.0, r
        assert r["source_file"].startswith("ContinualAI/continual-learning-baselines:experiments/"), r
        assert r["config"].startswith("studies/targets/") and (ROOT / r["config"]).exists(), r
        assert not any(re.search(r"(^|[\s\"'(])/[\w.-]+/", v) for v in r.values()), r  # no absolute path
        if r["our_acc_mean"]:
            ours = float(r["our_acc_mean"])
            assert 0.0 <= ours <= 1.0, r
            assert int(r["n_seeds"]) >= 1
            assert math.isclose(float(r["gap"]), ours - target, abs_tol=1e-3), r
        else:
            assert r["status"] != "ok", r  # a missing number says why


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_target_configs_validate(path):
    study = load_study(path, data_root="fake/data/root")
    assert study.strategies and study.scenarios


def test_every_target_names_an_existing_config_and_strategy():
    names = {p.stem: p for p in CONFIGS}
    for target in TARGETS:
        study = load_study(names[target["config"]], data_root="fake/data/root", deep=False)
        assert target["study_strategy"] in {s.name for s in study.strategies}, target
