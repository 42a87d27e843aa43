"""The command line: one job per (learner, seed) on the shared executor, then the tables."""

from __future__ import annotations

import json
import sys
import time
import types
from dataclasses import asdict
from pathlib import Path

from avalanche_plugins.study.jobs import run_jobs
from avalanche_plugins.study.report.files import load_results, print_report
from benchmarks._cli import benchmark_parser, is_skipped, make_executor, parse_args, subset_of
from benchmarks._results import summarize, write_results
from benchmarks.plasticity_ranking.ranking import pra_rows
from benchmarks.plasticity_ranking.report import analysis, keep, plot_decline, plot_runs, report
from benchmarks.plasticity_ranking.run import Job, run_job
from benchmarks.plasticity_ranking.settings import Setting, declining_settings, default_settings


def run_benchmark(settings: list[Setting], seeds: list[int], out_dir, *, data_root=None, progress: bool = True,
                  save_checkpoints: bool = False, config_extra: dict | None = None, echo: bool = True,
                  workers: int = 1, threads: int = 1, args=None) -> dict:
    """Run every setting × seed (one job each, cached in ``out_dir/jobs.jsonl``), write
    results.json/csv and the plot, print the tables (``threads``: per worker, docs "Threads")."""
    out = Path(out_dir)
    ckpt_dir = out / "checkpoints" if save_checkpoints else None
    (ckpt_dir or out).mkdir(parents=True, exist_ok=True)
    by_name = {s.name: s for s in settings}
    jobs = [Job(s, seed, data_root, None if ckpt_dir is None else str(ckpt_dir)) for s in settings for seed in seeds]
    start = time.perf_counter()
    runs = run_jobs(run_job, jobs, cache=out / "jobs.jsonl", workers=workers, threads=threads,
                    executor=None if args is None else make_executor(args), desc="plasticity ranking",
                    progress=progress)
    wall = time.perf_counter() - start
    rows = [row for run in runs for row in pra_rows(run, by_name[run["setting"]])]
    checkpoints = [{"setting": r["setting"], "seed": r["seed"], "checkpoints": r["checkpoints"]} for r in runs]
    a = analysis(rows, checkpoints, by_name)
    summary = summarize([r for r in rows if r["pra"] is not None], ["benchmark", "stratum", "gain", "k", "metric"],
                        ["pra"])
    extra = {"pra": a["values"]["all"], "pra_by_stratum": a["values"], "ablation": a["ablation_values"],
             "ablation_sizes": a["ablation_sizes"], "cost_ratios": a["cost_ratios"], "headline": a["headline"],
             "regimes": a["regimes"], "noise_ceiling_and_pooled": a["pooled"], "checkpoints": checkpoints,
             "training": [{k: r[k] for k in ("setting", "seed", "train_seconds", "score_seconds", "steps_per_second")}
                          for r in runs]}
    config = {"settings": [asdict(s) for s in settings], "seeds": seeds, **(config_extra or {})}
    args = args or types.SimpleNamespace(command=None, data_root=data_root)
    write_results(out, args, config=config, rows=rows, summary=summary, wall_seconds=wall, extra=extra)
    plot_runs(runs, by_name, out / "or_vs_gain.png")
    if any(s.stream != "permuted" or s.benchmark == "scr" for s in settings):
        plot_decline(json.loads((out / "results.json").read_text()), out / "decline.png")
    text = print_report(out / "results.json", report, out_dir=out, echo=echo)
    if echo:
        print(f"wrote {out}/results.json, results.csv, report.md, or_vs_gain.png ({wall:.0f}s)")
    return {"pra": a["values"]["all"], "pra_by_stratum": a["values"], "ablation": a["ablation_values"],
            "cost_ratios": a["cost_ratios"], "regimes": a["regimes"], "out": str(out), "report": text}


def main(argv=None) -> dict:
    package = sys.modules["benchmarks.plasticity_ranking"]
    parser = benchmark_parser("plasticity_ranking", package.__doc__.splitlines()[0],
                              skip_help="benchmarks (scr, pmnist) or learners (e.g. scr/bit_flip/h2)")
    parser.add_argument("--benchmarks", default="scr,pmnist",
                        help="comma-separated subset of scr,pmnist and the declining streams randlabel,binary")
    parser.add_argument("--tasks", type=int, default=None,
                        help="declining streams: tasks (= checkpoints, one after every task; default 20, quick 6)")
    parser.add_argument("--epochs-per-task", type=int, default=None, help="declining streams: epochs per task (10)")
    parser.add_argument("--n-runs", type=int, default=None,
                        help="declining streams: runs per ground-truth G^(k) (default 128, quick 32)")
    parser.add_argument("--only", default=None,
                        help="comma-separated setting names to run (e.g. scr/bit_flip/h2,pmnist/mnist); default all")
    parser.add_argument("--pmnist-examples", type=int, default=None,
                        help="training images per P-MNIST task (default 10,000 full / 1,000 quick; digits: all)")
    parser.add_argument("--pmnist-val", type=int, default=None, help="validation images per P-MNIST task")
    parser.add_argument("--save-checkpoints", action="store_true", help="also write every checkpoint to OUT/checkpoints")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="with --report: write the run's kept form to DIR (NAME.json without raw rows, "
                             "NAME_tables.md, NAME_decline.png; NAME from --keep-name)")
    parser.add_argument("--keep-name", default="results", help="file stem of --keep's files")
    args = parse_args(parser, argv)
    if args.report:
        if args.keep:
            files = keep(load_results(args.report), args.keep, args.keep_name)
            print(f"kept {', '.join(files)} in {args.keep}")
        return {"report": print_report(args.report, report)}
    candidates = default_settings(args.quick, args.data_root, pmnist_examples=args.pmnist_examples,
                                  pmnist_val=args.pmnist_val)
    candidates += declining_settings(args.quick, args.data_root, tasks=args.tasks, n_runs=args.n_runs,
                                     epochs=args.epochs_per_task)
    wanted = subset_of(parser, "--benchmarks", args.benchmarks, list(dict.fromkeys(s.benchmark for s in candidates)))
    settings = [s for s in candidates if s.benchmark in wanted and not is_skipped(args.skip, *s.name.split("/"))]
    if not settings:
        parser.error(f"--benchmarks {args.benchmarks!r} less --skip {','.join(sorted(args.skip))!r} selects nothing")
    names = subset_of(parser, "--only", args.only, [s.name for s in settings], [s.name for s in settings])
    settings = [s for s in settings if s.name in names]
    return run_benchmark(settings, list(range(args.seeds)), args.out, data_root=args.data_root,
                         progress=not args.no_progress, save_checkpoints=args.save_checkpoints,
                         config_extra={"args": vars(args)}, workers=args.workers, threads=args.threads, args=args)
