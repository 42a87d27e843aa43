"""``avalanche-study``: the comparative-study runner's command line (``python -m avalanche_plugins.study``).

::

    avalanche-study run CONFIG [--quick] [--seeds N] [--workers N] [--threads N] [--out DIR]
                               [--executor local|ray] [--address ADDR] [--wait-limit SECONDS]
                               [--skip NAMES] [--data-root DIR]
    avalanche-study check CONFIG [--quick] [--data-root DIR]   # every error of the config, nothing run
    avalanche-study report RESULTS_JSON                        # re-print a saved study's tables
    avalanche-study recipes                                    # the shipped tuned recipes
    avalanche-study reproduce [SCENARIO ...] [--quick]         # rerun recipes, fail on any drift
    avalanche-study data fashion_mnist --data-root DIR [--source FOLDER]  # prepare + verify a dataset

``run`` writes to ``./out/study/<name>`` under the working directory unless ``--out`` says
otherwise. Dotted ``module:function`` names in the config resolve against the config file's
folder and the working directory, so a study can name the user's own model module.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from avalanche_plugins.study.catalog.registry import ConfigError

__all__ = ["add_executor_arguments", "build_parser", "main", "positive_int", "positive_seconds", "run_command"]

PROG = "avalanche-study"
EXECUTORS = ("local", "ray")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """Where jobs run: ``--workers``, ``--threads``, ``--executor``, ``--address``, ``--no-progress``
    (the study's ``run`` and every benchmark under ``benchmarks/`` take the same flags)."""
    parser.add_argument("--workers", type=positive_int, default=1, metavar="N",
                        help="processes running jobs in parallel (default 1)")
    parser.add_argument("--threads", type=positive_int, default=1, metavar="N",
                        help="torch threads per worker (default 1)")
    parser.add_argument("--executor", choices=EXECUTORS, default="local",
                        help="local: a process pool (--workers); ray: Ray tasks, a private local instance with "
                             "workers x threads CPUs or the cluster at --address (needs the `ray` extra)")
    parser.add_argument("--address", default=None, metavar="ADDR",
                        help="Ray cluster to join (e.g. auto, HOST:6379, ray://HOST:10001); only with "
                             "--executor ray")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_run_flags(run: argparse.ArgumentParser) -> None:
    """``run``'s flags: what to run and where (each becomes a plain keyword of ``run_study``)."""
    run.add_argument("config", help="study config, .yaml/.yml or .toml")
    run.add_argument("--data-root", default=None,
                     help="folder holding the data of scenarios that name no data_root (MNIST/raw, "
                          "cifar-10-batches-py, cifar-100-python; e.g. ../shared/data)")
    run.add_argument("--quick", action="store_true", help="the config's quick: overrides (minutes on a 2-core CPU)")
    run.add_argument("--seeds", type=positive_int, default=None, metavar="N",
                     help="run seeds 0..N-1 (default: the config's seeds; 1 with --quick unless its quick: "
                          "says otherwise)")
    add_executor_arguments(run)
    run.add_argument("--wait-limit", type=positive_seconds, default=None, metavar="SECONDS",
                     help="Ray: stop the study when jobs have waited this long with no node able to run one "
                          "(e.g. a lost node), naming the lost nodes and the jobs not done; finished runs stay "
                          "cached (default: wait, saying so every minute)")
    run.add_argument("--out", default=None,
                     help="output folder: results.json/csv, tables, figures, report.md and the resumable job "
                          "cache jobs.jsonl (default out/study/<name>)")
    run.add_argument("--skip", default="", metavar="NAMES",
                     help="comma-separated parts to leave out: scenario names, strategy names or "
                          "SCENARIO/STRATEGY cells")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (``run``, ``check``, ``report``, ``recipes``, ``reproduce``, ``data``)."""
    parser = argparse.ArgumentParser(prog=PROG, description="Comparative continual-learning studies: "
                                     "one config → every strategy × scenario × seed, tables, figures, a report.")
    commands = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")
    _add_run_flags(commands.add_parser("run", help="run a study (resumable: finished runs are cached)"))
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
    _add_data_flags(commands.add_parser("data", help="prepare and verify a dataset from its system package "
                                        "(Fashion-MNIST from dataset-fashion-mnist)"))
    return parser


def _add_data_flags(data: argparse.ArgumentParser) -> None:
    from avalanche_plugins.study.catalog.prepare import DATASETS

    data.add_argument("dataset", choices=sorted(DATASETS), help="the dataset to prepare")
    data.add_argument("--data-root", required=True, metavar="DIR",
                      help="where to write it in torchvision's layout (DIR/FashionMNIST/raw/*-ubyte); the "
                           "study's --data-root")
    data.add_argument("--source", default=None, metavar="FOLDER",
                      help="a folder holding the four .gz files (default: the Debian package's, from dpkg -L)")


def _run(args, argv: list[str]) -> object:
    from avalanche_plugins.study.api import failure_summary, load_study, run_study
    from avalanche_plugins.study.jobs import NoNodeCanRun
    from avalanche_plugins.study.jobs.protocol import split_list
    from avalanche_plugins.study.report.files import command_line

    try:
        study = load_study(args.config, quick=args.quick, seeds=args.seeds, data_root=args.data_root)
    except ConfigError as error:
        print(f"{PROG} run: {args.config}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(args.out) if args.out is not None else Path("out") / "study" / study.name
    try:
        result = run_study(study, out=out, executor=args.executor, workers=args.workers, threads=args.threads,
                           address=args.address, skip=frozenset(split_list(args.skip)), progress=not args.no_progress,
                           command=command_line(PROG, argv), echo=True, wait_limit=args.wait_limit)
    except NoNodeCanRun as error:  # the finished rows are in the cache: a rerun resumes from them
        print(f"{PROG} run: {error} (finished runs are cached in {out / 'jobs.jsonl'}: a rerun with a node "
              f"back resumes from them; exit status 1)", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    print(f"wrote {result.report} (tables, figures), {result.csv}, {out / 'results.json'} "
          f"({result.wall_seconds:.0f} s)", flush=True)
    failed = failure_summary(result.rows, result.tuning)
    if failed:  # the outputs are written; the status says the study is not a result
        print(f"{PROG} run: {failed} (a rerun retries them; exit status 1)", file=sys.stderr, flush=True)
        raise SystemExit(1)
    return result


def _check(args) -> object:
    from avalanche_plugins.study.api import load_study

    try:
        study = load_study(args.config, quick=args.quick, data_root=args.data_root)
    except ConfigError as error:
        print(f"{PROG} check: {args.config}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    cells = len(study.scenarios) * len(study.strategies)
    print(f"{args.config}: OK — study {study.name!r}: {len(study.scenarios)} scenario(s) × "
          f"{len(study.strategies)} strateg{'y' if len(study.strategies) == 1 else 'ies'} = {cells} cell(s), "
          f"{study.seeds} seed(s), {len(study.metrics)} metric(s)", flush=True)
    return study


def _report(args) -> dict:
    from avalanche_plugins.study.report.files import print_report
    from avalanche_plugins.study.report.markdown import report, terminal_summary

    if not Path(args.results).is_file():
        print(f"{PROG} report: no file {args.results!r}", file=sys.stderr)
        raise SystemExit(2)
    text = print_report(args.results, report, echo=False)
    print(terminal_summary(args.results), flush=True)
    return {"report": text}


def _recipes(args) -> str:
    from avalanche_plugins.study.describe.recipes import recipe_table

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


def _data(args) -> object:
    from avalanche_plugins.study.catalog.prepare import DataUnavailable, prepare

    try:
        done = prepare(args.dataset, args.data_root, source=args.source)
    except (DataUnavailable, ValueError) as error:
        print(f"{PROG} data {args.dataset}: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    print("\n".join(done.lines), flush=True)
    return done


def main(argv=None) -> int:
    """Entry point of ``avalanche-study`` (and ``python -m avalanche_plugins.study``); exit status 0,
    2 for a bad config (its errors on stderr), 1 when ``run`` had runs fail outside the method or no
    test run finish (:func:`~avalanche_plugins.study.api.failure_summary`, on stderr; the outputs
    are written all the same), or stopped at ``--wait-limit`` with no Ray node able to run a job
    (no outputs; the finished runs stay cached)."""
    run_command(argv)
    return 0


def run_command(argv=None):
    """:func:`main` returning what the command made: the ``StudyResult`` of ``run``, the ``Study``
    of ``check``, ``{"report": text}`` of ``report``, the rows of ``recipes`` / ``reproduce``, the
    ``Prepared`` record of ``data``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "address", None) is not None and args.executor != "ray":
        parser.error("run: --address needs --executor ray")
    if getattr(args, "wait_limit", None) is not None and args.executor != "ray":
        parser.error("run: --wait-limit needs --executor ray")
    if getattr(args, "address", None) is not None and any(a == "--workers" or a.startswith("--workers=") for a in argv):
        print(f"{PROG} run: --workers {args.workers} has no effect with --address: the cluster runs as many jobs "
              f"at once as its CPUs allow, each taking --threads {args.threads} CPU(s)", file=sys.stderr, flush=True)
    commands = {"run": lambda: _run(args, argv), "check": lambda: _check(args), "report": lambda: _report(args),
                "recipes": lambda: _recipes(args), "reproduce": lambda: _reproduce(args), "data": lambda: _data(args)}
    return commands[args.command_name]()

if __name__ == "__main__":
    main()
