"""The command line: build the jobs, run them on the shared executor, analyse, write, report."""

from __future__ import annotations

import time
from dataclasses import asdict

import benchmarks.ads_zoo as package
from avalanche_plugins.study.report.files import print_report
from benchmarks._cli import benchmark_parser, is_skipped, parse_args, run_cached, subset_of
from benchmarks._results import write_results
from benchmarks.ads_zoo.job import Job, run_job, warmup
from benchmarks.ads_zoo.report import plot, report
from benchmarks.ads_zoo.scoring import analyse
from benchmarks.ads_zoo.settings import (
    DEFAULT_SCENARIOS,
    SCENARIOS,
    parse_overrides,
    scenario_config,
)
from benchmarks.ads_zoo.zoo import build_zoo, quick_zoo


def main(argv=None) -> dict:
    parser = benchmark_parser("ads_zoo", package.__doc__.splitlines()[0],
                              skip_help="scenarios, SCENARIO/FAMILY (e.g. split_digits/vit) or SCENARIO/FAMILY/ARCH")
    parser.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                        help=f"comma-separated subset of {','.join(SCENARIOS)} (default {','.join(DEFAULT_SCENARIOS)}); the MNIST and Fashion-MNIST ones need --data-root (skipped without it)")
    parser.add_argument("--calibration", type=int, default=256, help="old / new samples given to ADS")
    parser.add_argument("--limit", type=int, default=0, help="first N architectures only (0: all)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="[SCENARIO.]FIELD=VALUE",
                        help="override a training-budget field (old_epochs, old_lr, batch_size, new_epochs, "
                             "new_lr, max_train, max_test) for every scenario or, prefixed, one; repeatable")
    parser.add_argument("--max-width", type=int, default=0,
                        help="drop MLPs with a hidden width above this (0: keep all)")
    args = parse_args(parser, argv)
    if args.report:
        return {"report": print_report(args.report, report)}
    try:
        overrides = parse_overrides(args.overrides)
    except ValueError as err:
        parser.error(str(err))
    scenarios = subset_of(parser, "--scenarios", args.scenarios, SCENARIOS)
    if args.data_root is None:
        skipped = [s for s in scenarios if s != "split_digits"]
        if skipped:
            print(f"no --data-root: skipping {skipped}", flush=True)
        scenarios = [s for s in scenarios if s == "split_digits"]
    archs = quick_zoo() if args.quick else build_zoo()
    if args.quick:
        scenarios = ["split_digits"] if "split_digits" in scenarios or not scenarios else scenarios[:1]
    scenarios = [s for s in scenarios if not is_skipped(args.skip, s)]
    if args.max_width:
        archs = [a for a in archs if a.family != "mlp" or max(a.widths) <= args.max_width]
    archs = archs[:args.limit or None]  # --limit 0: all
    seeds = list(range(args.seeds))
    configs = {s: scenario_config(s, args.quick, args.calibration, overrides) for s in scenarios}
    jobs = [Job(s, a, seed, configs[s], args.data_root) for s in scenarios for seed in seeds for a in archs
            if not is_skipped(args.skip, s, a.family, a.name)]
    start = time.perf_counter()
    rows = run_cached(args, run_job, jobs, "architectures", warmup=warmup)
    per_scenario = analyse(rows, archs, scenarios, seeds)
    wall = time.perf_counter() - start
    summary = [{"scenario": s, **{k: v for k, v in e.items() if k != "per_seed"}} for s, e in per_scenario.items()]
    config = {"args": vars(args), "scenarios": scenarios, "seeds": seeds, "n_archs": len(archs),
              "archs": [asdict(a) | {"name": a.name} for a in archs],
              "train": {s: asdict(c) for s, c in configs.items()}}
    out = write_results(args.out, args, config=config, rows=rows, summary=summary, wall_seconds=wall,
                        extra={"scenarios": per_scenario})
    plot(rows, scenarios, out / "ads_scatter.png")
    text = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, results.csv, report.md, ads_scatter.png ({wall:.0f}s)")
    return {"scenarios": per_scenario, "rows": rows, "report": text}
