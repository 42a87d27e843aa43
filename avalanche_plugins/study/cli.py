"""``avalanche-study``: the comparative-study runner's command line (``python -m avalanche_plugins.study``).

::

    avalanche-study run CONFIG [--quick] [--seeds N] [--workers N] [--threads N] [--out DIR]
                               [--executor local|ray] [--address ADDR] [--skip NAMES] [--data-root DIR]
    avalanche-study check CONFIG [--quick] [--data-root DIR]   # every error of the config, nothing run
    avalanche-study report RESULTS_JSON                        # re-print a saved study's tables
    avalanche-study recipes                                    # the shipped tuned recipes
    avalanche-study reproduce [SCENARIO ...] [--quick]         # rerun recipes, fail on any drift

``run`` writes to ``./out/study/<name>`` under the working directory unless ``--out`` says
otherwise. Dotted ``module:function`` names in the config resolve against the config file's
folder and the working directory, so a study can name the user's own model module.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from avalanche_plugins.study.harness.cli import add_run_arguments, parse_args
from avalanche_plugins.study.registry import ConfigError

__all__ = ["build_parser", "main"]

PROG = "avalanche-study"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Comparative continual-learning studies: "
                                     "one config → every strategy × scenario × seed, tables, figures, a report.")
    commands = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a study (resumable: finished runs are cached)")
    run.add_argument("config", help="study config, .yaml/.yml or .toml")
    add_run_arguments(run, default_out="out/study/<name>",
                      skip_help="scenario names, strategy names or SCENARIO/STRATEGY cells")
    check = commands.add_parser("check", help="validate a config and list every error at once (runs nothing)")
    check.add_argument("config", help="study config, .yaml/.yml or .toml")
    check.add_argument("--quick", action="store_true", help="check the config with its quick: overrides")
    check.add_argument("--data-root", default=None, help="fills the data_root of scenarios that name none")
    report = commands.add_parser("report", help="re-print the tables of a saved results.json (runs nothing)")
    report.add_argument("results", metavar="RESULTS_JSON", help="a study's results.json")
    recipes = commands.add_parser("recipes", help="list the shipped tuned recipes (scenario, strategy, values, ACC)")
    recipes.add_argument("--folder", default=None, help="recipe files other than the shipped ones")
    reproduce = commands.add_parser("reproduce", help="rerun recipes; fail naming every ACC that left its tolerance")
    reproduce.add_argument("scenarios", nargs="*", help="recipe scenarios (default: all; --quick: split_digits)")
    reproduce.add_argument("--quick", action="store_true",
                           help="the Split digits recipes of four strategies, seed 0 (about a minute)")
    reproduce.add_argument("--folder", default=None, help="recipe files other than the shipped ones")
    reproduce.add_argument("--data-root", default=None, help="folder holding MNIST/raw (MNIST recipes)")
    reproduce.add_argument("--out", default="out/reproduce", help="output folder (default out/reproduce)")
    reproduce.add_argument("--workers", type=int, default=1, help="processes running jobs in parallel")
    reproduce.add_argument("--seeds", type=int, default=None, help="only the first N of each recipe's seeds")
    reproduce.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.run_parser = run  # parse_args resolves run's shared flags (seeds, skip, command line)
    return parser


def _run(args, parser) -> object:
    from avalanche_plugins.study.api import run_study
    from avalanche_plugins.study.config import load_study

    try:
        study = load_study(args.config, quick=args.quick, seeds=args.seeds if args.seeds_given else None,
                           data_root=args.data_root)
    except ConfigError as error:
        print(f"{PROG} run: {args.config}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(args.out if args.out != "out/study/<name>" else Path("out") / "study" / study.name)
    result = run_study(study, out=out, executor=args.executor, workers=args.workers, threads=args.threads,
                       address=args.address, skip=args.skip, progress=not args.no_progress,
                       command=args.command, echo=True)
    print(f"wrote {result.report} (tables, figures), {result.csv}, {out / 'results.json'} "
          f"({result.wall_seconds:.0f} s)", flush=True)
    return result


def _check(args) -> object:
    from avalanche_plugins.study.config import load_study

    try:
        study = load_study(args.config, quick=args.quick, data_root=args.data_root, deep=True)
    except ConfigError as error:
        print(f"{PROG} check: {args.config}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    cells = len(study.scenarios) * len(study.strategies)
    print(f"{args.config}: OK — study {study.name!r}: {len(study.scenarios)} scenario(s) × "
          f"{len(study.strategies)} strateg{'y' if len(study.strategies) == 1 else 'ies'} = {cells} cell(s), "
          f"{study.seeds} seed(s), {len(study.metrics)} metric(s)", flush=True)
    return study


def _report(args) -> dict:
    from avalanche_plugins.study.api import report, terminal_summary
    from avalanche_plugins.study.harness.results import print_report

    if not Path(args.results).is_file():
        print(f"{PROG} report: no file {args.results!r}", file=sys.stderr)
        raise SystemExit(2)
    text = print_report(args.results, report, echo=False)
    print(terminal_summary(args.results), flush=True)
    return {"report": text}


def _recipes(args) -> str:
    from avalanche_plugins.study.recipe_book import recipe_table

    text = recipe_table(args.folder)
    print(text, flush=True)
    return text


def _reproduce(args) -> list[dict]:
    from avalanche_plugins.study.reproduce import reproduce

    rows = reproduce(args.scenarios or None, quick=args.quick, folder=args.folder, out=args.out,
                     data_root=args.data_root, workers=args.workers, progress=not args.no_progress,
                     seeds=args.seeds)
    lines = ["| scenario | strategy | seeds | recipe ACC | rerun ACC | tolerance | |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['strategy']} | {r['seeds']} | {r['expected']:.4f} | {r['got']:.4f} | "
                     f"±{r['tolerance']:.4f} | {'ok' if r['ok'] else 'LEFT ITS TOLERANCE'} |")
    print("\n".join(lines), flush=True)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        for r in bad:
            cause = f" ({r['error']})" if r["error"] else ""
            print(f"{PROG} reproduce: {r['scenario']}/{r['strategy']}: ACC {r['got']:.4f} is outside "
                  f"{r['expected']:.4f} ± {r['tolerance']:.4f}{cause}", file=sys.stderr)
        raise SystemExit(1)
    return rows


def main(argv=None) -> int:
    """Entry point of ``avalanche-study`` (and ``python -m avalanche_plugins.study``); exit status 0
    (a bad config exits with 2 and its errors on stderr)."""
    run_command(argv)
    return 0


def run_command(argv=None):
    """:func:`main` returning what the command made: the ``StudyResult`` of ``run``, the ``Study``
    of ``check``, ``{"report": text}`` of ``report``."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    name = parser.parse_known_args(argv)[0].command_name
    if name == "run":
        sub = parser.run_parser
        seeds_given = sub.parse_known_args(argv[1:])[0].seeds is not None
        args = parse_args(sub, argv[1:])
        args.seeds_given = seeds_given
        return _run(args, sub)
    args = parser.parse_args(argv)
    if name == "check":
        return _check(args)
    if name == "recipes":
        return _recipes(args)
    if name == "reproduce":
        return _reproduce(args)
    return _report(args)


if __name__ == "__main__":
    main()
