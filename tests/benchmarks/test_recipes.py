"""``benchmarks.recipes``: a further tuning round replaces exactly the strategies it lists."""

from __future__ import annotations

import json

from benchmarks.recipes import _load_rounds, merge_rounds


def _saved(strategies, acc, command):
    return {"config": {"strategies": [{"name": n, "grid": {"x": [acc]}} for n in strategies]},
            "chosen": {"s": {n: {"label": f"x={acc}", "setting": {"x": acc}} for n in strategies}},
            "tuning": [{"strategy": n, "acc": acc} for n in strategies],
            "runs": [{"strategy": n, "seed": seed, "acc": acc} for n in strategies for seed in (0, 1)],
            "command": command, "wall_seconds": 10.0}


def test_a_later_round_replaces_the_strategies_it_lists_and_nothing_else(tmp_path):
    main, later = _saved(["Naive", "EWC", "SI"], 0.1, "main"), _saved(["EWC"], 0.5, "round 2")
    merged = merge_rounds(main, later, "low_lambda")
    assert [s["grid"]["x"] for s in merged["config"]["strategies"]] == [[0.1], [0.5], [0.1]]  # order kept
    assert merged["chosen"]["s"]["EWC"]["label"] == "x=0.5" and merged["chosen"]["s"]["SI"]["label"] == "x=0.1"
    assert sorted((r["strategy"], r["acc"]) for r in merged["runs"]) == [
        ("EWC", 0.5), ("EWC", 0.5), ("Naive", 0.1), ("Naive", 0.1), ("SI", 0.1), ("SI", 0.1)]
    assert [r["acc"] for r in merged["tuning"] if r["strategy"] == "EWC"] == [0.5]
    assert merged["rounds"] == {"low_lambda": {"strategies": ["EWC"], "command": "round 2", "wall_seconds": 10.0}}
    assert merged["wall_seconds"] == 20.0 and main["chosen"]["s"]["EWC"]["label"] == "x=0.1"  # main untouched
    for name, saved in (("key", main), ("key.low_lambda", later)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(saved))
    assert _load_rounds(tmp_path, "key") == merged
    assert _load_rounds(tmp_path, "other") is None


def test_a_recipe_is_made_from_the_typed_rows_and_choices_of_a_saved_study():
    from benchmarks.recipes import recipe_from_results

    def strategy(name, grid):
        return {"name": name, "class": name, "kwargs": {}, "plugins": [], "grid": grid, "training": {}}

    def run(name, seed, error=None):
        row = {"scenario": "split_digits", "strategy": name, "setting": "s", "seed": seed, "split": "test",
               "acc": 0.5 + seed, "acc_til": 0.9, "forgetting": 0.1, "bwt": -0.1, "train_s": 2.0, "status": "ok"}
        return {**row, "status": "error", "error": error} if error else row

    saved = {"config": {"scenarios": [{"name": "split_digits", "benchmark": "split_digits", "n_experiences": 5,
                                       "task_incremental": False}], "model": {"name": "mlp", "kwargs": {}},
                        "training": {"lr": 0.1}, "tune_seed": 0,
                        "strategies": [strategy("EWC", {"ewc_lambda": [1, 10]}), strategy("Naive", {}),
                                       strategy("SI", {"si_lambda": [1]}), strategy("LwF", {})]},
             "chosen": {"split_digits": {"EWC": {"setting": {"ewc_lambda": 10}, "label": "ewc_lambda=10",
                                                 "val_acc": 0.7},
                                         "SI": {"setting": {}, "label": "—", "val_acc": float("nan"),
                                                "failed": "every grid setting failed"}}},
             "tuning": [], "runs": [run("EWC", 0), run("EWC", 1), run("Naive", 0), run("LwF", 0, "boom")]}
    recipe, skipped = recipe_from_results(saved)
    assert recipe["strategies"]["EWC"]["kwargs"] == {"ewc_lambda": 10} and \
        recipe["strategies"]["EWC"]["validation_acc"] == 0.7
    assert recipe["strategies"]["EWC"]["test"]["acc"] == [0.5, 1.5] and recipe["strategies"]["EWC"]["test"]["seeds"] == [0, 1]
    assert recipe["strategies"]["Naive"]["chosen"] == "default" and recipe["strategies"]["Naive"]["validation_acc"] is None
    assert skipped == ["SI: every grid setting failed", "LwF: seed 0: boom"]


def test_a_recipe_strategy_of_the_tuning_study_gives_its_spec_on_the_tuned_scenario():
    # a strategy the tuning study took a recipe for is saved as {"name", "per_scenario": {scenario: spec}}
    from benchmarks.recipes import recipe_from_results

    spec = {"name": "EWC", "class": "EWC", "kwargs": {"ewc_lambda": 1.0}, "plugins": [],
            "grid": {"ewc_lambda": [1, 10]}, "training": {}, "recipe": "split_digits", "overridden": []}
    row = {"scenario": "split_digits", "strategy": "EWC", "setting": "s", "seed": 0, "split": "test", "acc": 0.5,
           "acc_til": 0.9, "forgetting": 0.1, "bwt": -0.1, "train_s": 2.0, "status": "ok"}
    saved = {"config": {"scenarios": [{"name": "split_digits", "benchmark": "split_digits", "n_experiences": 5,
                                       "task_incremental": False}], "model": {"name": "mlp", "kwargs": {}},
                        "training": {"lr": 0.1}, "tune_seed": 0,
                        "strategies": [{"name": "EWC", "per_scenario": {"split_digits": spec}}]},
             "chosen": {"split_digits": {"EWC": {"setting": {"ewc_lambda": 10}, "label": "ewc_lambda=10",
                                                 "val_acc": 0.7}}},
             "tuning": [], "runs": [row]}
    recipe, skipped = recipe_from_results(saved)
    assert skipped == [] and recipe["strategies"]["EWC"]["kwargs"] == {"ewc_lambda": 10}
    assert recipe["strategies"]["EWC"]["grid"] == {"ewc_lambda": [1, 10]}
