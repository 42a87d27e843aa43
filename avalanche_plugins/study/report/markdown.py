"""The study's Markdown, from what it saved: ``tables.md``, ``report.md`` and the terminal summary.

Everything here reads the saved ``results.json`` (a dict, as :func:`~avalanche_plugins.study.report.files.print_report`
passes it; its rows and chosen settings read through :mod:`~avalanche_plugins.study.contracts.rows`), so
``avalanche-study report`` re-renders an old study with today's code and renders it exactly as the
run did.
"""

from __future__ import annotations

from pathlib import Path

from avalanche_plugins.study.contracts.rows import RunRow, TuningFailed, choices_from_dict
from avalanche_plugins.study.report.provenance import provenance_lines, setting_lines

__all__ = ["DIAGNOSTICS_NOTE", "report", "tables_markdown", "terminal_summary"]


def tables_markdown(tables: dict) -> str:
    """tables.md: the main tables, the failed runs (if any) and the accuracy matrices."""
    parts = [tables["markdown"]]
    if tables.get("failed"):
        parts += ["## Failed runs", "Not scored: left out of every mean, interval and test.", tables["failed"]]
    if tables.get("diagnostics"):
        parts += ["## Diagnostics", DIAGNOSTICS_NOTE, tables["diagnostics"]]
    if tables.get("matrices"):
        parts += ["## Final accuracy matrices", tables["matrices"]]
    return "\n\n".join(parts)


DIAGNOSTICS_NOTE = ("Mean ± std over seeds of each test run's mean over its measurements (every experience a value "
                     "was logged at).")


def _recipe_lines(config: dict) -> list[str]:
    lines = []
    for strategy in config["strategies"]:
        for scenario, spec in strategy.get("per_scenario", {}).items():
            over = f"; overridden by the config: {', '.join(spec['overridden'])}" if spec.get("overridden") else ""
            values = ", ".join(f"{k}={v}" for k, v in {**spec["kwargs"], **spec["training"]}.items())
            lines.append(f"- {scenario} / {strategy['name']}: recipe `{spec['recipe']}` ({values or 'defaults'}{over})")
    return lines


def _chosen_lines(saved: dict) -> list[str]:
    """A line per tuned cell of a saved study: its chosen setting, or why there is none."""
    lines = []
    for scenario, strategies in choices_from_dict(saved.get("chosen", {})).items():
        for strategy, choice in strategies.items():
            if isinstance(choice, TuningFailed):
                lines.append(f"- {scenario} / {strategy}: none — {choice.failed}")
                continue
            lines.append(f"- {scenario} / {strategy}: **{choice.label}** (validation ACC {choice.val_acc:.3f})")
    return lines


def _failed_tuning_lines(saved: dict) -> list[str]:
    """A line per failed tuning run of a saved study."""
    rows = [RunRow.from_dict(r) for r in saved.get("tuning", [])]
    return [f"- {r.scenario} / {r.strategy} / {r.setting}: {r.status or 'error'}: {r.error}" for r in rows if r.error]


def terminal_summary(results) -> str:
    """The paper-style tables and chosen settings of a saved study (what the CLI prints)."""
    from avalanche_plugins.study.report.files import load_results

    saved = load_results(results)
    chosen = _chosen_lines(saved)
    text = saved["tables"]["markdown"]
    if chosen:
        text += f"\n\nChosen on the validation split (seed {saved['config']['tune_seed']}):\n" + "\n".join(chosen)
    failed = saved["tables"].get("failed")
    if failed:
        text += "\n\nFailed runs (not scored):\n\n" + failed
    return text


def _scenario_label(name: str, saved: dict) -> str:
    """``split_digits (class-incremental)``: a scenario with the setting its runs saw."""
    setting = ((saved.get("data") or {}).get(name) or {}).get("setting") if isinstance(saved.get("data"), dict) else None
    return f"{name} ({setting})" if setting else name


def report(saved: dict) -> str:
    """``report.md``: what ran, the chosen settings, the tables and every figure."""
    config = saved["config"]
    lines = [f"# Study: {saved['study']}", ""]
    if config.get("description"):
        lines += [config["description"], ""]
    scenarios = ", ".join(_scenario_label(s["name"], saved) for s in config["scenarios"])
    lines += [f"Scenarios: {scenarios}. Model: `{config['model']['name']}`. Strategies: "
              + ", ".join(s["name"] for s in config["strategies"]) + f". Seeds: {config['seeds']} "
              f"(test stream); grids tuned on a validation split with seed {config['tune_seed']}. "
              f"Metrics attached: accuracy, forgetting, BWT"
              + "".join(f", {m['name']}" for m in config["metrics"]) + ".", ""]
    if saved.get("command"):
        lines += [f"Command: `{saved['command']}` ({saved['wall_seconds']:.0f} s, code {saved['code_version']}).", ""]
    chosen = _chosen_lines(saved)
    if chosen:
        lines += ["## Chosen hyper-parameters", "", *chosen, ""]
    recipes = _recipe_lines(config)
    if recipes:
        lines += ["## Recipes", "", "Tuned settings shipped with the package (`avalanche-study recipes`):", "",
                  *recipes, ""]
    lines += ["## Results", ""]
    settings = setting_lines(saved)
    if settings:
        lines += [*settings, ""]
    lines += [saved["tables"]["markdown"], ""]
    if saved["tables"].get("failed"):
        lines += ["## Failed runs", "", "Not scored: left out of every mean, interval, test and figure.", "",
                  saved["tables"]["failed"], ""]
    tuning_failed = _failed_tuning_lines(saved)
    if tuning_failed:
        lines += ["Failed tuning runs (the grid setting was not chosen):", "", *tuning_failed, ""]
    if saved["tables"].get("diagnostics"):
        lines += ["## Diagnostics", "", DIAGNOSTICS_NOTE, "", saved["tables"]["diagnostics"], ""]
    figures = saved.get("figures", [])
    if figures:
        lines += ["## Figures", ""]
        for path in figures:
            title = Path(path).stem.replace("_", " ")
            lines += [f"### {title}", "", f"![{title}]({path})", ""]
    if saved["tables"].get("matrices"):
        lines += ["## Final accuracy matrices", "", saved["tables"]["matrices"], ""]
    lines += provenance_lines(saved)
    lines += ["Files: `metrics.csv` (every logged value, tidy long format), `results.json`, `tables.md`, "
              "`tables.tex`, `figures/`, `runs/` (per-run CSVs and images)."]
    return "\n".join(lines)
