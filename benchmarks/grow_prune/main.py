"""The command line of ``python -m benchmarks.grow_prune``: the settings × methods × compactness × seeds it plans, run or merged."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace

import benchmarks.grow_prune as package
from avalanche_plugins.study.jobs.protocol import split_list
from avalanche_plugins.study.report.files import print_report
from benchmarks._cli import benchmark_parser, is_skipped, parse_args, run_cached, subset_of
from benchmarks._results import summarize, write_results
from benchmarks.grow_prune.job import Job, run_job
from benchmarks.grow_prune.report import (
    VALUES,
    compact_row,
    plot_course,
    plot_trajectories,
    report,
    share_run_configs,
)
from benchmarks.grow_prune.settings import METHODS, Setting, settings_for


def _parser():
    parser = benchmark_parser("grow_prune", package.__doc__.splitlines()[0],
                              skip_help="setting names (e.g. 'cnn split digits'); timing (the masked/dense cost)")
    parser.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--cnn-methods", default=None,
                        help="methods on the CNN settings (default: --methods; grow+leaky never runs there)")
    parser.add_argument("--iid-methods", default=None, help="methods on the IID settings (default: --methods)")
    parser.add_argument("--compactness", default=None, help="comma-separated targets (default 0.2,0.3,0.4,0.5)")
    parser.add_argument("--settings", default=None,
                        help="comma-separated subset of the setting names (default: all; see the docstring)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs per experience of the split settings (default: per setting)")
    parser.add_argument("--iid-epochs", type=int, default=None,
                        help="epochs of the IID settings (default: per setting; at least edits + 1)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                        help="sgd: lr 0.01, momentum 0.9; adam: lr 1e-3")
    parser.add_argument("--iid-edits", type=int, default=None,
                        help="edit cycles of the IID settings (default: per setting)")
    parser.add_argument("--cnn-widths", default="8,16,32", help="channels of 'cnn iid mnist'")
    parser.add_argument("--cnn-lr", type=float, default=0.05, help="SGD lr of 'cnn iid mnist'")
    parser.add_argument("--variant-compactness", default=None,
                        help="compactness at which the grow+intervention methods run (default: every target)")
    parser.add_argument("--integration-epochs", default="1,2,4",
                        help="epochs per experience of the 'mlp permuted mnist E*' settings (integration time)")
    parser.add_argument("--fixed-budget-epochs", type=int, default=4, metavar="T",
                        help="epochs per experience of the 'mlp permuted mnist T<T> E*' settings (edit T − E epochs in)")
    parser.add_argument("--permuted-experiences", type=int, default=10, help="experiences of Permuted MNIST")
    parser.add_argument("--permuted-subset", type=int, default=None,
                        help="Permuted MNIST on the first N training (N // 2 test) images of the subset (cost)")
    parser.add_argument("--permuted-methods", default="dense,prune,grow",
                        help="methods on the 'mlp permuted mnist E*' settings")
    parser.add_argument("--fashion-subset", type=int, default=None,
                        help="the 'split fashion_mnist' settings on the first N training (N // 2 test) images of "
                             "Fashion-MNIST's 60,000 / 10,000 (cost; default: all)")
    parser.add_argument("--seed-list", default=None, help="explicit seeds (comma-separated; overrides --seeds)")
    parser.add_argument("--merge", default=None, metavar="JOBS_JSONL",
                        help="comma-separated job caches: write results.json/report from their rows (runs nothing)")
    return parser


def _chosen_settings(args, parser) -> list[Setting]:
    """The settings of ``--settings`` / ``--skip`` with the command line's epochs, edits and optimizer."""
    settings = settings_for(args)
    if args.settings:
        names = subset_of(parser, "--settings", args.settings, [s.name for s in settings])
        settings = [s for s in settings if s.name in names]
    settings = [s for s in settings if not is_skipped(args.skip, s.name)]
    for i, setting in enumerate(settings):
        if setting.n_experiences == 1 and args.iid_edits is not None:
            setting = settings[i] = replace(setting, edits=args.iid_edits)
        epochs = args.iid_epochs if setting.n_experiences == 1 else None if setting.ticket is False else args.epochs
        if epochs is not None:
            if setting.n_experiences == 1 and epochs <= setting.edits:
                parser.error(f"--iid-epochs must exceed the {setting.edits} edits of {setting.name!r}")
            settings[i] = replace(setting, epochs=epochs)
        settings[i] = replace(settings[i], optimizer=args.optimizer)
    return settings


def _plan(args, parser, settings: list[Setting]) -> tuple[list[Job], dict]:
    """Every timing and run job of the command, and the method lists and targets it chose."""
    default_methods = ("dense", "prune", "grow", "grow+zero_out", "grow+fresh_state") if args.quick else METHODS
    methods = subset_of(parser, "--methods", args.methods, METHODS, default_methods)
    chosen = {"methods": methods, "cnn_methods": subset_of(parser, "--cnn-methods", args.cnn_methods, METHODS, methods),
              "iid_methods": subset_of(parser, "--iid-methods", args.iid_methods, METHODS, methods),
              "compactness": [float(v) for v in split_list(args.compactness or
                                                          ("0.3" if args.quick else "0.2,0.3,0.4,0.5"))]}
    permuted_methods = subset_of(parser, "--permuted-methods", args.permuted_methods, METHODS)
    variant_c = [float(v) for v in split_list(args.variant_compactness)] or None
    targets = chosen["compactness"]
    seeds = [int(v) for v in split_list(args.seed_list)] if args.seed_list else range(args.seeds)
    jobs = [] if is_skipped(args.skip, "timing") else [Job("timing", s, c=targets[0]) for s in settings]
    for setting in settings:
        for seed in seeds:
            for method in (chosen["cnn_methods"] if setting.model == "cnn" else
                           chosen["iid_methods"] if setting.n_experiences == 1 else
                           permuted_methods if setting.scenario == "permuted" else methods):
                if method == "grow+leaky" and setting.model != "mlp":
                    continue
                cs = [1.0] if method == "dense" else \
                    [c for c in targets if variant_c is None or method in ("prune", "grow") or c in variant_c]
                jobs += [Job("run", setting, method, c, seed) for c in cs]
    return jobs, chosen


def _merged_rows(caches: str) -> list[dict]:
    """The rows of earlier runs' caches (e.g. runs split over processes), the last row per job, compacted."""
    merged = {}
    for cache in split_list(caches):
        for line in open(cache).read().splitlines():
            row = json.loads(line)["row"]
            merged[(row.get("kind"), row["setting"], row.get("method"), row.get("compactness"), row.get("seed"))] = row
    return [compact_row(r) for r in merged.values()]


def main(argv=None) -> dict:
    parser = _parser()
    args = parse_args(parser, argv)
    args.cnn_widths = [int(v) for v in split_list(args.cnn_widths)]
    args.integration_epochs = [int(v) for v in split_list(args.integration_epochs)]
    if args.fixed_budget_epochs < 1 or min(args.integration_epochs, default=1) < 1:
        parser.error("--fixed-budget-epochs and --integration-epochs must be positive integers")
    if args.report:
        return {"report": print_report(args.report, report)}
    settings = _chosen_settings(args, parser)
    jobs, chosen = _plan(args, parser, settings)
    start = time.perf_counter()
    done = _merged_rows(args.merge) if args.merge else run_cached(args, run_job, jobs, "grow/prune")
    wall = time.perf_counter() - start
    timing = [r for r in done if r.get("kind") == "timing"]
    rows = [r for r in done if r.get("kind") != "timing"]
    summary = summarize(rows, ["setting", "method", "compactness"], VALUES)
    out = write_results(args.out, args, config={"args": vars(args), **chosen,
                                                "settings": [asdict(s) for s in settings],
                                                "optimizer": args.optimizer},
                        rows=rows, summary=summary, wall_seconds=wall,
                        extra={"timing": timing, "masked_over_dense_time_per_epoch":
                               max((t["masked_over_dense"] for t in timing), default=None)})
    if args.merge:  # a kept run: one line of JSON, not indent=2 (a third of the size), configs once
        (out / "results.json").write_text(json.dumps(share_run_configs(json.loads((out / "results.json").read_text())),
                                                     separators=(",", ":")))
    plot_trajectories(rows, out / "trajectory.png")
    plot_course(rows, out / "newborn_course.png")
    text = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, results.csv, report.md, trajectory.png, jobs.jsonl ({wall:.0f}s)")
    return {"rows": rows, "summary": summary, "timing": timing, "out": out, "report": text}
