"""Reproduction targets: continual-learning-baselines' published numbers next to this runner's.

Commands (``run``, ``write``), outputs, what is compared: docs/benchmarks.md, "benchmarks.targets".
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

import yaml

from avalanche_plugins.study.contracts.rows import RunRow, SavedStudy
from avalanche_plugins.study.report.stats import describe

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies" / "targets"
OUT = ROOT / "out" / "targets"
CSV_PATH = ROOT / "docs" / "targets.csv"
KEPT = ROOT / "docs" / "results" / "targets"
SOURCES = ROOT / "docs" / "targets.yaml"

REPO = "ContinualAI/continual-learning-baselines"
COLUMNS = ("scenario", "strategy", "their_target", "target_source", "their_settings", "our_acc_mean", "our_acc_std",
           "n_seeds", "our_forgetting_mean", "status", "data_difference", "settings_difference", "gap",
           "explanation", "source_file", "config")
TARGETS: list[dict] = yaml.safe_load(SOURCES.read_text(encoding="utf-8"))["targets"]


def _fmt(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return f"{value:.{digits}f}"


def _relative(text: str) -> str:
    return str(text).replace(str(ROOT) + "/", "").replace(str(ROOT), ".")


def _acc_stats(study: SavedStudy | None, strategy: str) -> tuple[list[RunRow], list[RunRow]]:
    """``(finished runs, failed runs)`` of ``strategy``'s test runs in one kept run."""
    runs = [r for r in (study.runs if study is not None else ()) if r.split == "test" and r.strategy == strategy]
    return [r for r in runs if r.ok], [r for r in runs if not r.ok]


def _diagnostics(study: SavedStudy | None, names: list[str]) -> str:
    """``"diagnostic NAME: ACC m ± s (n=k)"`` for each diagnostic strategy that ran."""
    parts = []
    for name in names:
        ok, _ = _acc_stats(study, name)
        acc = describe([r.acc for r in ok])
        if ok:
            spread = f" ± {acc['std']:.3f}" if len(ok) > 1 else ""
            parts.append(f"measured {name}: ACC {acc['mean']:.3f}{spread} (n={len(ok)})")
    return "; ".join(parts)


def load_runs(out: Path = OUT) -> dict[str, dict]:
    """``{config name: results.json}`` of the kept runs under ``out``."""
    return {path.parent.name: json.loads(path.read_text())
            for path in sorted(out.glob("*/results.json"))}


def target_rows(saved: dict[str, dict]) -> list[dict]:
    """The rows of ``docs/targets.csv`` from the kept runs (a target without a run is kept, empty)."""
    rows, studies = [], {name: SavedStudy.from_dict(result) for name, result in saved.items()}  # typed once
    for target in TARGETS:
        study = studies.get(target["config"])
        ok, failed = _acc_stats(study, target["study_strategy"])
        acc, forgetting = describe([r.acc for r in ok]), describe([r.score("forgetting") for r in ok])
        if study is None or not (ok or failed):
            status = "not run"
        elif failed:
            status = "; ".join(f"seed {r.seed} failed: {r.error}" for r in failed)
        else:
            status = "ok"
        gap = acc["mean"] - target["their_target"]
        row = {k: target.get(k, "") for k in COLUMNS}
        row.update(their_target=f"{target['their_target']:.2f}", our_acc_mean=_fmt(acc["mean"]),
                   our_acc_std=_fmt(acc["std"]), n_seeds=str(len(ok)), our_forgetting_mean=_fmt(forgetting["mean"]),
                   status=status, gap=_fmt(gap, 3), config=f"studies/targets/{target['config']}.yaml",
                   source_file=f"{REPO}:{target['source_file']}",
                   explanation=" ".join(x for x in (target.get("explanation", ""),
                                                    _diagnostics(study, target.get("diagnostics", []))) if x))
        rows.append(row)
    return rows


def write_csv(rows: list[dict], path: Path = CSV_PATH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def _markdown_table(rows: list[dict]) -> str:
    head = "| scenario | strategy | their target | ours (mean ± std, n) | gap | status |\n|---|---|---|---|---|---|\n"
    lines = []
    for r in rows:
        ours = f"{r['our_acc_mean']} ± {r['our_acc_std'] or '–'} (n={r['n_seeds']})" if r["our_acc_mean"] else "–"
        lines.append(f"| {r['scenario']} | {r['strategy']} | {r['their_target']} | {ours} | {r['gap'] or '–'} | "
                     f"{r['status']} |")
    return head + "\n".join(lines) + "\n"


def write_kept(saved: dict[str, dict], rows: list[dict], kept: Path = KEPT) -> None:
    """``summary.md`` and each run's ``tables.md`` under ``kept``."""
    kept.mkdir(parents=True, exist_ok=True)
    parts = ["# Reproduction targets: kept summary\n",
             "Generated by `python -m benchmarks.targets write` from `out/targets/*/results.json`; the table "
             "is `docs/targets.csv` in short. Data: the MNIST subset in `../shared/data` (8,000 train / 2,000 "
             "test images), not full MNIST.\n", _markdown_table(rows), "\n## Runs\n"]
    for name, result in saved.items():
        seeds = sorted({r.seed for r in SavedStudy.from_dict(result).runs if r.split == "test"})
        data = result.get("data") or {}
        parts.append(f"### {name}\n\n- config: `studies/targets/{name}.yaml`\n"
                     f"- command: `{_relative(result.get('command', ''))}`\n"
                     f"- code version: `{result.get('code_version')}`\n"
                     f"- seeds: {seeds}; wall time {result.get('wall_seconds', float('nan')):.0f} s\n"
                     f"- data: {data.get('name', '')} "
                     f"{', '.join(f'{k}: sha256 {v[:12]}' for k, v in sorted(data.get('sha256', {}).items()))}\n"
                     f"- tables: `docs/results/targets/{name}/tables.md`\n")
        tables = OUT / name / "tables.md"
        if tables.exists():
            (kept / name).mkdir(exist_ok=True)
            (kept / name / "tables.md").write_text(_relative(tables.read_text()))
    (kept / "summary.md").write_text("\n".join(parts))


def run_commands(first_pass: bool) -> list[str]:
    """The commands that run every target config (``--seeds 1`` for the first pass)."""
    seeds = " --seeds 1" if first_pass else ""
    return [f"nice -n 10 .venv/bin/avalanche-study run studies/targets/{p.stem}.yaml --data-root ../shared/data "
            f"--out out/targets/{p.stem} --workers 1 --no-progress{seeds}" for p in sorted(STUDIES.glob("*.yaml"))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.targets", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write docs/targets.csv and docs/results/targets/ from out/targets/")
    write.add_argument("--out", default=str(OUT), help="folder of the kept runs (default out/targets)")
    run = sub.add_parser("run", help="print the commands that run the target configs")
    run.add_argument("--first-pass", action="store_true", help="one seed each")
    args = parser.parse_args(argv)
    if args.command == "run":
        print("\n".join(run_commands(args.first_pass)))
        return 0
    saved = load_runs(Path(args.out))
    rows = target_rows(saved)
    write_csv(rows)
    write_kept(saved, rows)
    print(_markdown_table(rows))
    print(f"wrote {CSV_PATH.relative_to(ROOT)} and {KEPT.relative_to(ROOT)}/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
