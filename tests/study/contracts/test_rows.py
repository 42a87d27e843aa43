"""``avalanche_plugins.study.contracts.rows``: typed run rows, chosen settings and saved studies, whose JSON
form is exactly the dicts a study has always written (keys, values and order)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from avalanche_plugins.study.contracts.rows import (
    Choice,
    RunRow,
    SavedStudy,
    TuningFailed,
    choices_as_dict,
    choices_from_dict,
)
from avalanche_plugins.study.contracts.specs import (
    GridKey,
    ModelSpec,
    PluginSpec,
    RunSpec,
    ScenarioSpec,
    StrategySpec,
    TrainingSpec,
)
from avalanche_plugins.study.run.job import (
    StudyJob,
    _failed_row,
    failed_outside_the_method,
    lost_row,
)
from tests import REPO_ROOT

ROOT = REPO_ROOT
NAN = float("nan")

# a finished run's row as runner.run_job wrote it before the rows were typed (keys in that order)
FINISHED = {"scenario": "digits", "strategy": "EWC", "setting": "ewc_lambda=10", "seed": 1, "split": "test",
            "acc": 0.8, "acc_til": 0.9, "forgetting": 0.1, "bwt": -0.1, "fwt": 0.0, "wall_s": 2.0, "train_s": 1.5,
            "diagnostics_s": 0.5, "figures_s": 0.1, "callback_s": {"EWCPlugin.after_training_exp": 0.2},
            "peak_memory_mb": 300.0, "accuracy_matrix": [[0.9, 0.0], [0.7, 0.9]], "til_matrix": [],
            "baseline_accuracy": [0.1, 0.1], "metrics": [{"metric": "Top1_Acc_Exp", "value": "0.9"}],
            "stream": {"setting": "class-incremental"}, "status": "ok"}
FAILED_KEYS = ["scenario", "strategy", "setting", "seed", "split", "acc", "acc_til", "forgetting", "bwt", "fwt",
               "wall_s", "train_s", "diagnostics_s", "figures_s", "peak_memory_mb", "callback_s", "accuracy_matrix",
               "til_matrix", "baseline_accuracy", "metrics", "stream", "status", "error"]


def _job() -> StudyJob:
    return StudyJob("s", ScenarioSpec("digits", "split_digits"), ModelSpec("mlp"), TrainingSpec(),
                    RunSpec("Naive", "Naive"), "default", (), (), 0, "test")


def _same(a, b) -> bool:
    """Equal JSON (NaN equal to NaN), keys in the same order."""
    return json.dumps(a) == json.dumps(b)


def test_a_finished_row_round_trips_exactly():
    row = RunRow.from_dict(FINISHED)
    assert row.as_dict() == FINISHED and list(row.as_dict()) == list(FINISHED)
    assert RunRow.from_dict(row.as_dict()) == row
    assert (row.cell, row.ok, row.acc, row.score("train_s"), row.score("nope")) == (("digits", "EWC"), True, 0.8, 1.5,
                                                                                   pytest.approx(NAN, nan_ok=True))
    assert row.scores["bwt"] == -0.1 and row.costs["peak_memory_mb"] == 300.0


def test_a_failed_and_a_lost_row_keep_the_keys_and_order_they_had():
    failed = _failed_row(_job(), "diverged", "loss = inf").as_dict()
    assert list(failed) == FAILED_KEYS and failed["callback_s"] == {} and math.isnan(failed["acc"])
    lost = lost_row(_job(), "NodeDiedError: gone")
    assert list(lost) == FAILED_KEYS and failed_outside_the_method(lost)
    assert _same(RunRow.from_dict(lost).as_dict(), lost) and not RunRow.from_dict(lost).ok


def test_keys_the_type_does_not_know_are_kept_in_extra():
    ray_row = {**FINISHED, "node_ip": "10.0.0.2", "setting_values": {"ewc_lambda": 10}}
    row = RunRow.from_dict(ray_row)
    assert row.extra == {"node_ip": "10.0.0.2"} and row.setting_values == {"ewc_lambda": 10}
    assert list(row.as_dict()) == list(ray_row) and row.as_dict() == ray_row
    assert "metrics" not in row.without_metrics().as_dict()


def test_a_partial_row_round_trips():
    # what a tuning failure, a test's hand-made row, or a failure_summary caller passes
    for partial in ({"status": "error", "error": "ConfigError: no module 'm'"},
                    {"scenario": "d", "strategy": "EWC", "setting": "—", "seed": 0, "split": "test",
                     "status": "tuning", "error": "every grid setting failed", "accuracy_matrix": []}):
        assert _same(RunRow.from_dict(partial).as_dict(), partial)


def test_choices_round_trip_through_their_json_form():
    chosen = {"digits": {"EWC": {"setting": {"ewc_lambda": 10}, "label": "ewc_lambda=10", "val_acc": 0.8},
                         "SI": {"setting": {}, "label": "—", "val_acc": NAN, "failed": "every grid setting failed"}}}
    typed = choices_from_dict(chosen)
    assert typed["digits"]["EWC"] == Choice({"ewc_lambda": 10}, "ewc_lambda=10", 0.8)
    assert typed["digits"]["SI"] == TuningFailed("every grid setting failed")
    assert typed["digits"]["EWC"].failed is None and typed["digits"]["SI"].setting == {}
    assert _same(choices_as_dict(typed), chosen) and _same(choices_as_dict(chosen), chosen)


def test_strategy_spec_from_dict_inverts_as_dict_and_applies_a_setting():
    spec = StrategySpec("EWC+LR", "Naive", {"mb": 1}, (PluginSpec("EWCPlugin", {"ewc_lambda": 1.0}),),
                        (GridKey("EWCPlugin.ewc_lambda", "plugin", 0, "ewc_lambda", (1.0, 10.0)),
                         GridKey("training.lr", "training", None, "lr", (0.1,))), {"epochs": 2}, "recipe_x", ("lr",))
    assert StrategySpec.from_dict(spec.as_dict()) == spec
    run, training = StrategySpec.from_dict(spec.as_dict()).with_setting({"EWCPlugin.ewc_lambda": 10.0,
                                                                         "training.lr": 0.1})
    # what the dict twin of apply_setting (grid.apply_setting, gone) gave benchmarks/recipes.py
    assert (run.cls, run.kwargs, [p.as_dict() for p in run.plugins], training) == \
        ("Naive", {"mb": 1}, [{"name": "EWCPlugin", "kwargs": {"ewc_lambda": 10.0}}], {"epochs": 2, "lr": 0.1})
    assert spec.plugins[0].kwargs == {"ewc_lambda": 1.0}  # the spec itself is unchanged


def _kept_studies() -> list[Path]:
    """The kept study outputs under docs/results (a study's results.json, or its kept summary.json)."""
    paths = sorted((ROOT / "docs" / "results").glob("*/*.json"))
    return [p for p in paths if p.name in ("results.json", "summary.json")
            and {"study", "runs", "chosen"} <= set(json.loads(p.read_text()))]


@pytest.mark.parametrize("path", _kept_studies(), ids=lambda p: p.parent.name)
def test_kept_study_results_load_and_their_rows_round_trip(path):
    saved = json.loads(path.read_text())
    study = SavedStudy.from_dict(saved)
    assert study.name == saved["study"] and len(study.runs) == len(saved["runs"])
    for typed, row in zip([*study.runs, *study.tuning], [*saved["runs"], *saved.get("tuning", [])]):
        assert json.dumps(typed.as_dict(), sort_keys=True) == json.dumps(row, sort_keys=True)
    assert _same(choices_as_dict(study.chosen), saved["chosen"])


def test_there_are_kept_studies_to_read():
    assert _kept_studies()


def test_saved_study_load_names_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results.json"):
        SavedStudy.load(tmp_path)
