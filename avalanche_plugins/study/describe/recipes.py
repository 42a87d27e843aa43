"""Tuned recipes: shipped settings per (scenario, strategy), and checking that they still reproduce.

A recipe file (``avalanche_plugins/study/recipes/<scenario>.yaml``, one per scenario) holds what
the study protocol chose for every strategy on that scenario — a grid over the one or two
hyper-parameters that matter and the learning rate, tuned on the validation split with one seed
— and what the chosen setting then scored on the test stream with 3 seeds::

    scenario: {benchmark: split_digits, n_experiences: 5, task_incremental: false}
    model: {name: mlp, kwargs: {hidden: [100, 100]}}       # what it was tuned with
    training: {optimizer: sgd, lr: 0.05, epochs: 2, ...}
    strategies:
      EWC:
        class: EWC
        kwargs: {ewc_lambda: 100}
        plugins: []
        training: {lr: 0.01}                                # the chosen grid values of training
        grid: {ewc_lambda: [10, 100, 1000], training.lr: [0.01, 0.05]}
        chosen: ewc_lambda=100, lr=0.01
        validation_acc: 0.378
        test: {seeds: [0, 1, 2], acc: [...], forgetting: [...], train_s: [...]}

In a study config, ``{name: EWC, recipe: true}`` takes the recipe named like the strategy for
each of the study's scenarios (a file tuned for the study's zoo model, ``<scenario>_<model>.yaml``
such as ``split_fashion_mnist_efficientnet_lite0``, before the scenario's own ``<scenario>.yaml``) (``recipe: OnlineEWC`` names another entry); kwargs, plugins and
training the config gives override the recipe's (the report says which). A setting that diverged
on any seed is never shipped (``benchmarks.recipes write`` leaves it out).

:func:`avalanche_plugins.study.reproduce.reproduce` reruns recipes and compares each strategy's test ACC with the recipe's:
tolerance ``min(3 · SE, 0.02)`` of the recipe's own seeds (``0.02`` for one seed).
"""

from __future__ import annotations

import copy
import math
from importlib import resources
from pathlib import Path

__all__ = ["RECIPE_DIR", "find_recipe", "load_recipes", "merge_recipe", "recipe_key", "recipe_table", "tolerance"]

RECIPE_DIR = "recipes"  # folder of avalanche_plugins.study holding the shipped recipe files


def _folder(folder=None) -> Path:
    if folder is not None:
        return Path(folder)
    return Path(str(resources.files("avalanche_plugins.study") / RECIPE_DIR))


def load_recipes(folder=None) -> dict[str, dict]:
    """``{scenario key: recipe file contents}`` of every ``*.yaml`` in ``folder`` (default: the
    shipped recipes)."""
    import yaml

    out = {}
    for path in sorted(_folder(folder).glob("*.yaml")):
        out[path.stem] = yaml.safe_load(path.read_text()) or {}
    return out


def recipe_key(scenario: dict) -> str:
    """The recipe file a built-in scenario reads: ``split_mnist``, ``split_mnist_task``, ...

    Example:
        >>> recipe_key({"benchmark": "split_mnist", "task_incremental": True, "n_experiences": 5})
        'split_mnist_task'
    """
    return (scenario["benchmark"] + ("_task" if scenario.get("task_incremental") else "")
            + ("_online" if scenario.get("online") else ""))  # never an offline recipe for an online stream


def _describe(recipes: dict) -> str:
    return ", ".join(f"{key} ({r['scenario']['benchmark']}, {r['scenario'].get('n_experiences')} experiences"
                     f"{', task-incremental' if r['scenario'].get('task_incremental') else ''})"
                     for key, r in recipes.items()) or "none"


def find_recipe(scenario: dict, name: str, where: str, folder=None, model: str | None = None) -> tuple[str, dict]:
    """``(label, entry)``: the recipe ``name`` for ``scenario`` — from ``<scenario>_<model>.yaml``
    when one was tuned for ``model`` (the study's zoo model name), else ``<scenario>.yaml``;
    ``ConfigError`` naming ``where`` and listing the recipes that exist otherwise."""
    from avalanche_plugins.study.catalog.registry import ConfigError

    recipes = load_recipes(folder)
    key = recipe_key(scenario)
    if model is not None and f"{key}_{model}" in recipes:
        key = f"{key}_{model}"
    recipe = recipes.get(key)
    n_experiences = scenario.get("n_experiences") or 5
    if (recipe is None or recipe["scenario"].get("n_experiences", 5) != n_experiences
            or recipe["scenario"].get("online") != scenario.get("online")):
        raise ConfigError(f"{where}: no recipe for scenario {scenario['name']!r} ({scenario['benchmark']}, "
                          f"{n_experiences} experiences{', task-incremental' if scenario.get('task_incremental') else ''}"
                          f"{', online ' + str(scenario['online']) if scenario.get('online') else ''})"
                          f"; recipes exist for: {_describe(recipes)}")
    if name not in recipe["strategies"]:
        raise ConfigError(f"{where}: the {key} recipes have no {name!r}; they have "
                          f"{', '.join(recipe['strategies'])}")
    return f"{key}/{name}", recipe["strategies"][name]


def merge_recipe(entry: dict, recipe: dict) -> tuple[dict, list[str]]:
    """The strategy config ``entry`` with the recipe's class, kwargs, plugins and training under
    it (what ``entry`` gives wins); returns ``(merged entry, overridden keys)``.

    Example:
        >>> merged, over = merge_recipe({"name": "EWC", "kwargs": {"ewc_lambda": 5}},
        ...                             {"class": "EWC", "kwargs": {"ewc_lambda": 100, "mode": "separate"},
        ...                              "plugins": [], "training": {"lr": 0.01}})
        >>> merged["kwargs"], merged["training"], over
        ({'ewc_lambda': 5, 'mode': 'separate'}, {'lr': 0.01}, ['kwargs.ewc_lambda'])
    """
    merged = {k: copy.deepcopy(v) for k, v in entry.items() if k != "recipe"}
    overridden = [f"kwargs.{k}" for k in entry.get("kwargs", {}) if k in recipe.get("kwargs", {})
                  and entry["kwargs"][k] != recipe["kwargs"][k]]
    overridden += [f"training.{k}" for k in entry.get("training", {}) if k in recipe.get("training", {})
                   and entry["training"][k] != recipe["training"][k]]
    merged["kwargs"] = {**recipe.get("kwargs", {}), **entry.get("kwargs", {})}
    merged["training"] = {**recipe.get("training", {}), **entry.get("training", {})}
    if "class" not in entry and recipe.get("class"):
        merged["class"] = recipe["class"]
    plugins = copy.deepcopy(recipe.get("plugins", []))
    for given in entry.get("plugins", []):
        given = {"name": given} if isinstance(given, str) else given
        same = next((p for p in plugins if p["name"] == given["name"]), None)
        if same is None:
            plugins.append(copy.deepcopy(given))
            continue
        overridden += [f"plugins.{given['name']}.{k}" for k, v in given.get("kwargs", {}).items()
                       if same.get("kwargs", {}).get(k, v) != v]
        same["kwargs"] = {**same.get("kwargs", {}), **given.get("kwargs", {})}
    merged["plugins"] = plugins
    return merged, overridden


def tolerance(values) -> float:
    """``min(3 · SE, 0.02)`` of a recipe's per-seed values (``0.02`` with one seed).

    Example:
        >>> round(tolerance([0.80, 0.81, 0.82]), 4)
        0.0173
        >>> tolerance([0.5])
        0.02
    """
    values = [float(v) for v in values]
    if len(values) < 2:
        return 0.02
    mean = sum(values) / len(values)
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
    return min(3 * se, 0.02)


def recipe_table(folder=None) -> str:
    """Markdown: every shipped recipe (scenario, strategy, chosen values, test ACC)."""
    lines = ["| scenario | strategy | chosen | validation ACC | test ACC (mean ± std) |", "|---|---|---|---|---|"]
    for key, recipe in load_recipes(folder).items():
        for name, entry in recipe["strategies"].items():
            acc = entry["test"]["acc"]
            mean = sum(acc) / len(acc)
            std = math.sqrt(sum((a - mean) ** 2 for a in acc) / (len(acc) - 1)) if len(acc) > 1 else float("nan")
            lines.append(f"| {key} | {name} | {entry.get('chosen', '')} | {entry.get('validation_acc', float('nan')):.3f} "
                         f"| {mean:.3f} ± {std:.3f} |")
    return "\n".join(lines)
