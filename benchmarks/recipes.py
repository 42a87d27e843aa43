"""Writing the shipped recipes from the kept tuning runs (``avalanche-study run studies/recipes/SCENARIO.yaml``).

Command (``write``) and outputs: docs/benchmarks.md, "benchmarks.recipes".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from avalanche_plugins.study.report.stats import describe

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("split_digits", "split_mnist", "split_mnist_task", "permuted_mnist", "split_digits_online",
             "split_fashion_mnist", "split_fashion_mnist_efficientnet_lite0")
RECIPES = ROOT / "avalanche_plugins" / "study" / "recipes"
KEPT = ROOT / "docs" / "results" / "recipes"
DOC_HEAD = Path(__file__).with_name("recipes_head.md")  # docs/recipes.md above its tables


def recipe_from_results(saved: dict) -> tuple[dict, list[str]]:
    """``(recipe file contents, strategies not shipped with the reason)`` of a tuning run."""
    from avalanche_plugins.study.contracts.rows import SavedStudy, TuningFailed
    from avalanche_plugins.study.contracts.specs import StrategySpec

    config = saved["config"]
    scenario = dict(config["scenarios"][0])
    key = scenario["name"]
    recipe = {"scenario": {k: scenario[k] for k in ("benchmark", "n_experiences", "task_incremental", "online",
                                                    "train_per_class", "test_per_class")
                           if k in ("benchmark", "n_experiences", "task_incremental") or scenario.get(k)},
              "model": config["model"], "training": config["training"],
              "tuned_by": {"config": f"studies/recipes/{key}.yaml", "command": saved.get("command"),
                           "code_version": saved.get("code_version"),
                           "data": ("scikit-learn's bundled 8x8 digits" if scenario["benchmark"].endswith("_digits")
                                    else _scenario_data(saved, key)),
                           "machine": saved.get("machine"), "tune_seed": config["tune_seed"]},
              "strategies": {}}
    skipped = []
    study = SavedStudy.from_dict(saved)
    tuning = {(r.strategy, r.setting): r.acc for r in study.tuning}
    for entry in config["strategies"]:
        name = entry["name"]
        strategy = entry.get("per_scenario", {}).get(key, entry)  # a recipe strategy: one spec per scenario
        choice = study.chosen.get(key, {}).get(name)  # None: the strategy had no grid to tune
        runs = sorted((r for r in study.runs if r.strategy == name), key=lambda r: r.seed)
        failed = [r for r in runs if r.error]
        if isinstance(choice, TuningFailed) or failed or not runs:
            reason = (choice.failed if isinstance(choice, TuningFailed) else None) or \
                "; ".join(f"seed {r.seed}: {r.error}" for r in failed) or "no runs"
            skipped.append(f"{name}: {reason}")
            continue
        label = choice.label if choice is not None else "default"
        spec, training = StrategySpec.from_dict(strategy).with_setting(choice.setting if choice is not None else {})
        recipe["strategies"][name] = {
            "class": spec.cls, "kwargs": spec.kwargs, "plugins": [p.as_dict() for p in spec.plugins],
            "training": training, "grid": strategy["grid"], "chosen": label,
            "validation_acc": choice.val_acc if choice is not None else tuning.get((name, label)),
            "test": {"seeds": [r.seed for r in runs],
                     **{m: [r.score(m) for r in runs] for m in ("acc", "acc_til", "forgetting", "bwt", "train_s")}},
        }
    return recipe, skipped


def _scenario_data(saved: dict, key: str):
    """The data checksums of scenario ``key`` (per scenario since issue 30; one entry before)."""
    data = saved.get("data") or {}
    entry = data.get(key)
    return entry.get("data", entry) if isinstance(entry, dict) else data


def _table(key: str, recipe: dict, skipped: list[str]) -> str:
    def grid_text(grid):
        return "; ".join(f"{k.rpartition('.')[2] if not k.startswith('training.') else k}: "
                         f"{', '.join(map(str, v))}" for k, v in grid.items()) or "—"

    lines = [f"## {key}", "", "| strategy | grid | chosen | validation ACC | test ACC ± std | Forgetting ± std | time (s) |",
             "|---|---|---|---|---|---|---|"]
    for name, entry in recipe["strategies"].items():
        acc, forgetting, time = (describe(entry["test"][m]) for m in ("acc", "forgetting", "train_s"))
        lines.append(f"| {name} | {grid_text(entry['grid'])} | {entry['chosen']} | {entry['validation_acc']:.3f} | "
                     f"{acc['mean']:.3f} ± {acc['std']:.3f} | {forgetting['mean']:.3f} ± {forgetting['std']:.3f} | "
                     f"{time['mean']:.1f} |")
    tuned = recipe["tuned_by"]
    lines += ["", f"Model `{recipe['model']['name']}` {recipe['model'].get('kwargs', {})}, training {recipe['training']}; "
              f"{len(next(iter(recipe['strategies'].values()))['test']['seeds']) if recipe['strategies'] else 0} test "
              f"seeds; tuned with seed {tuned['tune_seed']} on the validation split. Command: `{tuned['command']}` "
              f"(code {tuned['code_version']})."]
    if skipped:
        lines += ["", "Not shipped (a setting that failed on any seed is never shipped):", "",
                  *(f"- {s}" for s in skipped)]
    return "\n".join(lines)


def merge_rounds(saved: dict, later: dict, part: str) -> dict:
    """``saved`` with the strategies of the tuning round ``later`` (``part``) taken from it."""
    replaced = {s["name"]: s for s in later["config"]["strategies"]}
    names = set(replaced)
    config = dict(saved["config"])
    config["strategies"] = [replaced.get(s["name"], s) for s in saved["config"]["strategies"]]
    chosen = {key: {**strategies, **{n: c for n, c in later["chosen"].get(key, {}).items() if n in names}}
              for key, strategies in saved["chosen"].items()}
    return {**saved, "config": config, "chosen": chosen,
            "tuning": [r for r in saved["tuning"] if r["strategy"] not in names] + list(later["tuning"]),
            "runs": [r for r in saved["runs"] if r["strategy"] not in names] + list(later["runs"]),
            "rounds": {**saved.get("rounds", {}), part: {"strategies": sorted(names), "command": later.get("command"),
                                                          "wall_seconds": later.get("wall_seconds")}},
            "wall_seconds": (saved.get("wall_seconds") or 0) + (later.get("wall_seconds") or 0)}


def _load_rounds(out_root: Path, key: str) -> dict | None:
    """The main run of ``key`` with its further rounds (``out_root/key.NAME``) merged in."""
    results = out_root / key / "results.json"
    if not results.is_file():
        return None
    saved = json.loads(results.read_text())
    for part in sorted(out_root.glob(f"{key}.*/results.json")):
        saved = merge_rounds(saved, json.loads(part.read_text()), part.parent.name.split(".", 1)[1])
    return saved


def _kept_tables(saved: dict, folder: Path) -> str:
    """The run's ``tables.md``, made again from the merged runs when it had further rounds."""
    if not saved.get("rounds"):
        return (folder / "tables.md").read_text()
    from avalanche_plugins.study.report.stats import summarize_study
    from avalanche_plugins.study.report.tables import failed_runs_table, markdown_tables

    reference = saved["config"].get("reference") or saved["config"]["strategies"][0]["name"]
    names = [s["name"] for s in saved["config"]["strategies"]]
    summary = summarize_study(saved["runs"], reference, names)
    rounds = "; ".join(f"{', '.join(r['strategies'])} from the round `{part}` (`{r['command']}`)"
                       for part, r in saved["rounds"].items())
    return (f"Merged tuning rounds: {rounds}; every other strategy from `{saved.get('command')}`.\n\n"
            + markdown_tables(summary, reference) + "\n\n## Failed runs\n\n" + failed_runs_table(summary) + "\n")


def write(keys, out_root: Path = ROOT / "out" / "recipes") -> list[Path]:
    import yaml

    written, tables = [], {}
    for key in keys:
        saved = _load_rounds(out_root, key)
        if saved is None:
            print(f"no kept run for {key} ({out_root / key / 'results.json'}); skipped", file=sys.stderr)
            continue
        recipe, skipped = recipe_from_results(saved)
        RECIPES.mkdir(parents=True, exist_ok=True)
        path = RECIPES / f"{key}.yaml"
        header = (f"# Tuned recipes for {key}, written by `python -m benchmarks.recipes write {key}` from the run of\n"
                  f"# studies/recipes/{key}.yaml (docs/recipes.md). Values are what the study protocol chose.\n")
        path.write_text(header + yaml.safe_dump(recipe, sort_keys=False, width=110))
        kept = KEPT / key
        kept.mkdir(parents=True, exist_ok=True)
        (kept / "tables.md").write_text(_kept_tables(saved, out_root / key))
        summary = {k: saved.get(k) for k in ("command", "code_version", "versions", "data", "machine")}
        (kept / "summary.json").write_text(json.dumps({**summary, "chosen": saved["chosen"], "not_shipped": skipped,
                                                       "rounds": saved.get("rounds", {}),
                                                       "wall_seconds": saved.get("wall_seconds")}, indent=1))
        tables[key] = _table(key, recipe, skipped)
        written.append(path)
    if tables:
        doc = ROOT / "docs" / "recipes.md"
        blocks = doc.read_text().split("\n## ")[1:] if doc.is_file() else []
        existing = {block.split("\n", 1)[0].strip(): "## " + block.rstrip() for block in blocks} | tables
        ordered = [existing[k] for k in SCENARIOS if k in existing] + [v for k, v in existing.items() if k not in SCENARIOS]
        doc.write_text(DOC_HEAD.read_text(encoding="utf-8") + "\n\n".join(ordered) + "\n")
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recipes", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writer = commands.add_parser("write", help="write recipes and docs/recipes.md from the kept runs")
    writer.add_argument("scenarios", nargs="*", help=f"default: all of {', '.join(SCENARIOS)}")
    args = parser.parse_args(argv)
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; expected {', '.join(SCENARIOS)}")
    for path in write(args.scenarios or SCENARIOS):
        print(f"wrote {path.relative_to(ROOT)}")

if __name__ == "__main__":
    main()
