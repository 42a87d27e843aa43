"""The one command-line contract of every benchmark (here, not in the wheel); its flags and the
job cache they drive: docs/benchmarks.md. Add options to :func:`benchmark_parser`, then parse.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from avalanche_plugins.study import jobs
from avalanche_plugins.study.cli import add_executor_arguments, positive_int
from avalanche_plugins.study.jobs.protocol import is_skipped, split_list
from avalanche_plugins.study.report.files import command_line

__all__ = ["DEFAULT_SEEDS", "QUICK_SEEDS", "benchmark_parser", "is_skipped", "make_executor", "parse_args",
           "run_cached", "split_list", "subset_of"]

DEFAULT_SEEDS = 3
QUICK_SEEDS = 1


def benchmark_parser(name: str, description: str, *, skip_help: str = "") -> argparse.ArgumentParser:
    """Parser with the shared flags (``skip_help``: what ``--skip`` can leave out here)."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=description)
    default_out = f"out/{name}"
    parser.add_argument("--data-root", default=None,
                        help="folder holding MNIST/raw/*-ubyte (e.g. ../shared/data); scikit-learn digits "
                             "when absent")
    parser.add_argument("--quick", action="store_true",
                        help="small configuration (minutes on a 2-core CPU)")
    parser.add_argument("--seeds", type=positive_int, default=None, metavar="N",
                        help=f"run seeds 0..N-1 (default {DEFAULT_SEEDS}; {QUICK_SEEDS} with --quick "
                             "unless --seeds is given)")
    add_executor_arguments(parser)
    parser.add_argument("--out", default=default_out,
                        help="output folder: results.json/csv, plots and the resumable job cache "
                             f"jobs.jsonl (default {default_out})")
    parser.add_argument("--skip", default="", metavar="NAMES",
                        help="comma-separated parts to leave out" + (f": {skip_help}" if skip_help else ""))
    parser.add_argument("--report", default=None, metavar="RESULTS_JSON",
                        help="re-print the tables of a saved results.json and exit (runs nothing)")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, *,
               unused: Sequence[str] = ()) -> argparse.Namespace:
    """Parse and resolve the shared flags: ``args.seeds`` becomes the seed count (:data:`DEFAULT_SEEDS`,
    :data:`QUICK_SEEDS` with ``--quick``; an explicit ``--seeds`` wins), ``args.skip`` a frozenset of
    names, ``args.command`` the command line with relative paths (for ``results.json``). ``unused``
    names the shared flags the benchmark has no use for (``quick``, ``seeds``, ``skip``, ``workers``,
    ``executor``): left out of ``--help`` and refused when given, never ignored. Examples:
    tests/benchmarks/test_cli.py."""
    argv = list(sys.argv[1:] if argv is None else argv)
    hidden = {*unused, *(["address"] if "executor" in unused else [])}  # --address only joins a Ray cluster
    for action in parser._actions:
        action.help = argparse.SUPPRESS if action.dest in hidden else action.help
    args = parser.parse_args(argv)
    given = [f"--{name}" for name in unused if getattr(args, name) != parser.get_default(name)]
    if given:
        parser.error(f"this benchmark does not take {', '.join(given)}")
    if getattr(args, "address", None) is not None and getattr(args, "executor", "local") != "ray":
        parser.error("--address needs --executor ray")
    args.command = command_line(parser.prog, argv)
    if args.seeds is None:
        args.seeds = QUICK_SEEDS if args.quick else DEFAULT_SEEDS
    args.skip = frozenset(split_list(args.skip))
    return args


def run_cached(args, fn, job_list, desc: str, *, executor=None, **executor_options) -> list:
    """:func:`avalanche_plugins.study.jobs.run_jobs` the command's way: resumable from ``OUT/jobs.jsonl``,
    on ``executor`` or the one the flags ask for (:func:`make_executor` with ``executor_options``),
    with a progress bar unless ``--no-progress``."""
    executor = make_executor(args, **executor_options) if executor is None else executor
    return jobs.run_jobs(fn, job_list, cache=f"{args.out}/jobs.jsonl", executor=executor, desc=desc,
                         progress=not getattr(args, "no_progress", False))


def subset_of(parser: argparse.ArgumentParser, flag: str, value: str | None, allowed: Sequence[str],
              default: Sequence[str] = ()) -> list[str]:
    """The comma-separated names of ``value`` (``default`` when it names none), refusing before
    anything runs, through ``parser`` and naming ``flag``, every name not in ``allowed``."""
    names = split_list(value) or list(default)
    unknown = [name for name in names if name not in allowed]
    if unknown:
        parser.error(f"{flag} must be a subset of {', '.join(allowed)}; got {', '.join(unknown)}")
    return names


def make_executor(args, *, warmup=None, isolate: bool = False):
    """The executor the flags ask for (:func:`avalanche_plugins.study.jobs.make_executor`
    with ``args.executor``, ``args.workers``, ``args.threads`` and ``args.address``; missing
    attributes take the parser's defaults, so any namespace works; tests/benchmarks/test_cli.py)."""
    return jobs.make_executor(getattr(args, "executor", "local") or "local", workers=getattr(args, "workers", 1),
                              threads=getattr(args, "threads", 1), address=getattr(args, "address", None),
                              warmup=warmup, isolate=isolate)
