"""``python -m benchmarks.study [CONFIG] [--quick] [--seeds N] [--workers N] [--threads N]
[--executor local|ray] [--address ADDR] [--out DIR] [--skip NAMES] [--report RESULTS_JSON]``

Runs a comparative study (README "Comparative studies"); CONFIG defaults to the demo study,
``studies/demo.yaml``. ``--seeds`` replaces the config's seed count; ``--quick`` applies its
``quick:`` overrides; ``--skip`` leaves out scenarios, strategies or ``SCENARIO/STRATEGY`` cells;
``--data-root`` fills the ``data_root`` of scenarios that name none.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.common.cli import benchmark_parser, parse_args
from benchmarks.common.results import print_report
from benchmarks.study.api import report, run_study, terminal_summary
from benchmarks.study.registry import ConfigError

DEMO = Path(__file__).resolve().parents[2] / "studies" / "demo.yaml"


def build_parser(name: str = "study", default_out: str | None = None):
    parser = benchmark_parser(name, __doc__.splitlines()[2].strip(),
                              skip_help="scenario names, strategy names or SCENARIO/STRATEGY cells")
    parser.add_argument("config", nargs="?", default=str(DEMO),
                        help="study config, .yaml/.yml or .toml (default: the demo study)")
    if default_out is not None:
        parser.set_defaults(out=default_out)
    return parser


def main(argv=None, *, name: str = "study", default_out: str | None = None):
    parser = build_parser(name, default_out)
    explicit_seeds = parser.parse_known_args(argv)[0].seeds
    args = parse_args(parser, argv)
    if args.report:
        text = print_report(args.report, report, echo=False)
        print(terminal_summary(args.report), flush=True)
        return {"report": text}
    out = args.out
    if out == f"out/{name}" and default_out is None:  # one folder per config by default
        out = f"out/{name}/{Path(args.config).stem}"
    try:
        result = run_study(args.config, out=out, quick=args.quick, seeds=explicit_seeds,
                           executor=args.executor, workers=args.workers, threads=args.threads,
                           address=args.address, data_root=args.data_root, skip=args.skip,
                           progress=not args.no_progress, args=args, echo=True)
    except ConfigError as error:
        parser.error(str(error))
    print(f"wrote {result.report} (tables, figures), {result.csv}, {Path(out) / 'results.json'} "
          f"({result.wall_seconds:.0f} s)", flush=True)
    return result


if __name__ == "__main__":
    main()
