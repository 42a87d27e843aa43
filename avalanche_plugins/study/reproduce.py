"""``avalanche-study reproduce``: rerun shipped recipes and compare each ACC with the recipe's.

A strategy passes when the mean test ACC of the rerun seeds lies within ``min(3 · SE, 0.02)`` of the
recipe's mean over the same seeds (:func:`~avalanche_plugins.study.describe.recipes.tolerance`, SE of
the recipe's own seeds). ``quick``: four Split digits recipes, seed 0.
"""

from __future__ import annotations

import math
from pathlib import Path

from avalanche_plugins.study.describe.recipes import load_recipes, tolerance

__all__ = ["QUICK", "reproduce", "reproduction_study"]


QUICK = {"split_digits": ("Naive", "EWC", "Replay", "LayerAdaptiveEWC_smoothed")}


def reproduction_study(key: str, recipe: dict, strategies=None, *, seeds: int | None = None,
                       data_root=None) -> dict:
    """The study config that reruns ``recipe``'s strategies (all, or ``strategies``) with its model,
    training and seeds (``seeds``: the first N)."""
    names = list(strategies or recipe["strategies"])
    n = seeds or len(next(iter(recipe["strategies"].values()))["test"]["seeds"])
    scenario = {"name": key, **recipe["scenario"]}
    if data_root is not None and recipe["scenario"]["benchmark"] != "split_digits":
        scenario["data_root"] = data_root
    return {"name": f"reproduce_{key}", "seeds": n, "reference": names[0], "scenarios": [scenario],
            "model": recipe["model"], "training": recipe["training"],
            "strategies": [{"name": name, "recipe": True} for name in names]}


def reproduce(keys=None, *, quick: bool = False, folder=None, out="out/reproduce", data_root=None,
              workers: int = 1, progress: bool = True, seeds: int | None = None) -> list[dict]:
    """Rerun recipes (``quick``: the Split digits recipes of four strategies, seed 0; ``seeds``: the
    first N of each recipe's seeds) and return one row per number: ``{scenario, strategy, metric,
    expected, got, tolerance, ok}``."""
    from avalanche_plugins.study.api import load_study, run_study

    recipes = load_recipes(folder)
    rows = []
    for key in (keys or (QUICK if quick else recipes)):
        recipe = recipes[key]
        names = [n for n in QUICK.get(key, ()) if n in recipe["strategies"]] if quick else None
        config = reproduction_study(key, recipe, names, seeds=1 if quick else seeds, data_root=data_root)
        study = load_study(config, recipe_folder=folder)
        result = run_study(study, out=Path(out) / key, workers=workers, progress=progress)
        for name in config["strategies"]:
            name = name["name"]
            entry = recipe["strategies"][name]
            runs = {r.seed: r for r in result.rows if r.strategy == name}
            expected = entry["test"]["acc"][: len(runs) or 1]
            got = [runs[s].acc if s in runs else float("nan") for s in entry["test"]["seeds"][: len(expected)]]
            tol = tolerance(entry["test"]["acc"])
            exp_mean, got_mean = sum(expected) / len(expected), sum(got) / len(got)
            ok = math.isfinite(got_mean) and abs(got_mean - exp_mean) <= tol
            rows.append({"scenario": key, "strategy": name, "metric": "acc", "seeds": len(expected),
                         "expected": exp_mean, "got": got_mean, "tolerance": tol, "ok": ok,
                         "error": next((r.error for r in runs.values() if r.error), "")})
    return rows
