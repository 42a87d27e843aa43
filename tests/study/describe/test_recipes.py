"""Recipes: shipped tuned settings taken by ``recipe: true``, explicit kwargs overriding them, a
clear error where no recipe exists, and ``avalanche-study reproduce`` passing on the shipped recipes
and failing, by name, on a recipe broken on purpose."""

from __future__ import annotations

import shutil

import pytest
import yaml

from avalanche_plugins.study import ConfigError, load_study, run_study
from avalanche_plugins.study.cli import run_command
from avalanche_plugins.study.describe.recipes import (
    RECIPE_DIR,
    load_recipes,
    merge_recipe,
    tolerance,
)
from tests import REPO_ROOT

FAKE = {
    "scenario": {"benchmark": "split_digits", "n_experiences": 2, "task_incremental": False},
    "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
    "training": {"optimizer": "sgd", "lr": 0.05, "epochs": 1, "batch_size": 64},
    "strategies": {
        "EWC": {"class": "EWC", "kwargs": {"ewc_lambda": 100, "mode": "separate"}, "plugins": [],
                "training": {"lr": 0.01}, "grid": {"ewc_lambda": [10, 100]}, "chosen": "ewc_lambda=100",
                "validation_acc": 0.4, "test": {"seeds": [0], "acc": [0.4]}},
        "LAE": {"class": "Naive", "kwargs": {}, "training": {},
                "plugins": [{"name": "LayerAdaptiveEWCPlugin", "kwargs": {"ewc_lambda": 10, "schedule": "smoothed"}}],
                "grid": {}, "chosen": "default", "validation_acc": 0.3, "test": {"seeds": [0], "acc": [0.3]}},
    },
}
SCENARIO = [{"name": "digits2", "benchmark": "split_digits", "n_experiences": 2}]


@pytest.fixture()
def fake_recipes(tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "split_digits.yaml").write_text(yaml.safe_dump(FAKE))
    return folder


def test_recipe_true_takes_the_scenarios_recipe_and_explicit_kwargs_win(fake_recipes, tmp_path):
    config = {"seeds": 1, "scenarios": SCENARIO, "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
              "training": {"epochs": 1, "batch_size": 64},
              "strategies": [{"name": "EWC", "recipe": True, "kwargs": {"ewc_lambda": 5}},
                             {"name": "LAE", "recipe": True}]}
    study = load_study(config, recipe_folder=fake_recipes)
    ewc = study.strategy("EWC").on("digits2")
    assert ewc.kwargs == {"ewc_lambda": 5, "mode": "separate"} and ewc.training == {"lr": 0.01}
    assert ewc.recipe == "split_digits/EWC" and ewc.overridden == ("kwargs.ewc_lambda",)
    lae = study.strategy("LAE").on("digits2")
    assert lae.cls == "Naive" and lae.plugins[0].kwargs == {"ewc_lambda": 10, "schedule": "smoothed"}
    # one spelling: a recipe strategy's JSON form is its name and one spec per scenario, nothing duplicated
    saved = study.as_dict()["strategies"][0]
    assert saved == {"name": "EWC", "per_scenario": {"digits2": ewc.as_dict()}}
    result = run_study(study, out=tmp_path / "out", progress=False)
    assert {r.setting for r in result.rows} == {"recipe (kwargs.ewc_lambda overridden)", "recipe"}
    report = result.report.read_text()
    assert "## Recipes" in report
    assert "digits2 / EWC: recipe `split_digits/EWC` (ewc_lambda=5, mode=separate, lr=0.01; overridden by the " \
           "config: kwargs.ewc_lambda)" in report


def test_a_scenario_without_a_recipe_lists_where_recipes_exist(fake_recipes):
    config = {"scenarios": [{"benchmark": "permuted_digits", "n_experiences": 2}],
              "strategies": [{"name": "EWC", "recipe": True}, {"name": "GEM", "recipe": True}]}
    with pytest.raises(ConfigError) as error:
        load_study(config, recipe_folder=fake_recipes)
    text = str(error.value)
    assert "strategies[0].recipe: no recipe for scenario 'permuted_digits' (permuted_digits, 2 experiences); " \
           "recipes exist for: split_digits (split_digits, 2 experiences)" in text
    assert "strategies[1].recipe" in text  # every strategy's problem at once
    with pytest.raises(ConfigError, match="the split_digits recipes have no 'GEM'; they have EWC, LAE"):
        load_study({"scenarios": SCENARIO, "strategies": [{"name": "GEM", "recipe": True}]}, recipe_folder=fake_recipes)


def test_a_recipe_tuned_for_the_studys_model_comes_before_the_scenarios(fake_recipes):
    cnn = {**FAKE, "model": {"name": "cnn"},
           "strategies": {"EWC": {**FAKE["strategies"]["EWC"], "kwargs": {"ewc_lambda": 7, "mode": "separate"}}}}
    (fake_recipes / "split_digits_cnn.yaml").write_text(yaml.safe_dump(cnn))
    config = {"seeds": 1, "scenarios": SCENARIO, "strategies": [{"name": "EWC", "recipe": True}]}
    on_cnn = load_study({**config, "model": "cnn"}, recipe_folder=fake_recipes).strategy("EWC").on("digits2")
    assert on_cnn.recipe == "split_digits_cnn/EWC" and on_cnn.kwargs["ewc_lambda"] == 7
    on_mlp = load_study({**config, "model": "mlp"}, recipe_folder=fake_recipes).strategy("EWC").on("digits2")
    assert on_mlp.recipe == "split_digits/EWC" and on_mlp.kwargs["ewc_lambda"] == 100
    with pytest.raises(ConfigError, match="the split_digits_cnn recipes have no 'LAE'"):
        load_study({**config, "model": "cnn", "strategies": [{"name": "LAE", "recipe": True}]},
                   recipe_folder=fake_recipes)


def test_merge_and_tolerance_by_hand():
    merged, over = merge_recipe({"name": "X", "plugins": [{"name": "P", "kwargs": {"a": 2}}]},
                                {"class": "Naive", "kwargs": {}, "training": {"lr": 0.1},
                                 "plugins": [{"name": "P", "kwargs": {"a": 1, "b": 3}}]})
    assert merged["plugins"] == [{"name": "P", "kwargs": {"a": 2, "b": 3}}] and over == ["plugins.P.a"]
    values = [0.80, 0.82, 0.90]
    mean = sum(values) / 3
    se = (sum((v - mean) ** 2 for v in values) / 2 / 3) ** 0.5
    assert tolerance(values) == pytest.approx(min(3 * se, 0.02)) == 0.02


def test_recipes_command_lists_the_shipped_recipes(capsys):
    text = run_command(["recipes"])
    assert "| split_digits | EWC |" in text and "| split_digits | Replay |" in text


def test_every_listed_strategy_has_a_shipped_split_digits_recipe():
    recipes = load_recipes()
    assert "split_digits" in recipes
    expected = {"Naive", "Cumulative", "EWC", "OnlineEWC", "SynapticIntelligence", "MAS", "RWalk", "LwF", "GEM",
                "AGEM", "Replay", "GDumb", "DER", "ER_ACE", "LayerAdaptiveEWC_geometric", "LayerAdaptiveEWC_smoothed",
                "LayerAdaptiveLR", "Grow", "Prune"}
    assert expected <= set(recipes["split_digits"]["strategies"])


def test_reproduce_quick_passes_and_a_broken_recipe_fails_by_name(tmp_path, capsys):
    rows = run_command(["reproduce", "--quick", "--out", str(tmp_path / "good"), "--no-progress"])
    assert len(rows) == 4 and all(r["ok"] for r in rows), rows
    broken = tmp_path / "broken"
    shutil.copytree(load_recipes.__globals__["_folder"](None), broken)
    recipe = yaml.safe_load((broken / "split_digits.yaml").read_text())
    recipe["strategies"] = {"Naive": recipe["strategies"]["Naive"]}
    recipe["strategies"]["Naive"]["training"]["lr"] = 1e-5  # broken on purpose: barely trains
    (broken / "split_digits.yaml").write_text(yaml.safe_dump(recipe))
    for other in broken.glob("*.yaml"):
        if other.name != "split_digits.yaml":
            other.unlink()
    with pytest.raises(SystemExit) as exit_info:
        run_command(["reproduce", "--quick", "--folder", str(broken), "--out", str(tmp_path / "bad"), "--no-progress"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "avalanche-study reproduce: split_digits/Naive: ACC" in err and "is outside" in err


def test_recipe_folder_ships_in_the_package():
    from importlib import resources

    import avalanche_plugins.study as study

    assert (resources.files(study) / RECIPE_DIR / "split_digits.yaml").is_file()


def test_documented_recipe_example_is_valid():
    text = (REPO_ROOT / "docs" / "study.md").read_text()
    block = text.split("## Recipes", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    study = load_study(yaml.safe_load(block))
    replay = study.strategy("Replay").on("split_digits")
    assert replay.kwargs["mem_size"] == 500 and replay.overridden == ("kwargs.mem_size",)
    assert study.strategy("LAE").on("split_digits").recipe == "split_digits/LayerAdaptiveEWC_smoothed"


@pytest.mark.slow  # every Split digits recipe with seed 0 (all seeds: `avalanche-study reproduce split_digits`)
def test_reproduce_every_split_digits_recipe(tmp_path):
    rows = run_command(["reproduce", "split_digits", "--seeds", "1", "--out", str(tmp_path), "--no-progress",
                        "--workers", "2"])
    assert len(rows) == len(load_recipes()["split_digits"]["strategies"]) and all(r["ok"] for r in rows)
