"""``avalanche-study``: the comparative-study runner's command line (``python -m avalanche_plugins.study``).

::

    avalanche-study run CONFIG [--quick] [--seeds N] [--workers N] [--threads N] [--out DIR]
                               [--executor local|ray] [--address ADDR] [--skip NAMES] [--data-root DIR]
    avalanche-study check CONFIG [--quick] [--data-root DIR]   # every error of the config, nothing run
    avalanche-study report RESULTS_JSON                        # re-print a saved study's tables

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
                       address=args.address, skip=args.skip, progress=not args.no_progress, args=args,
                       echo=True)
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
    return _report(args)


if __name__ == "__main__":
    main()
