"""The command line: the reference epochs, then every measurement in its own process, the results and the report."""

from __future__ import annotations

import importlib
import math
import os
import time
from dataclasses import asdict, replace

import benchmarks.scale as package
from avalanche_plugins.study.cli import positive_int, positive_seconds
from avalanche_plugins.study.report.files import print_report
from benchmarks._cli import benchmark_parser, is_skipped, parse_args, run_cached, subset_of
from benchmarks._results import write_results
from benchmarks.scale.measure import EPOCH_IMAGES, INFO, MODELS, Config, Job, data_for, setting_for
from benchmarks.scale.report import plot, report, slopes
from benchmarks.scale.runner import START_METHODS, ProcessExecutor, failure_row

FULL_MODELS = ("mlp-256", "mlp-512", "mlp-1024", "mlp-2048", "mlp-4096", "resnet8", "resnet18", "resnet34",
               "vit-d1-w128", "vit-d2-w64", "vit-d2-w128", "vit-d2-w256", "vit-d4-w128")
QUICK_MODELS = ("mlp-256", "mlp-512", "mlp-1024", "resnet8", "vit-d1-w64")
CHECK_EPOCH_MODEL = "resnet18"
PRELOAD = ("torch", "torchvision", "avalanche.training", "benchmarks.scale.measure")
DEFAULT_TIMEOUT_EPOCHS = 2.0  # 5,000-image epochs a measurement may run (estimators.yaml)
PROCESS_OVERHEAD_S = 2.0


def config_for(args) -> Config:
    cfg = Config(quick=args.quick, threads=args.threads,
                 hessian_max_params=int(getattr(args, "hessian_max_params", Config.hessian_max_params)))
    if args.quick:
        cfg = replace(cfg, ref_images=64, hessian_samples=8, hessian_max_iter=3, fisher_samples=8,
                      readiness_samples=64, ads_samples=32, anchors=50, gn_anchors=10, ewc_samples=16,
                      penalty_reps=10)
    return replace(cfg, fisher_samples=args.fisher_samples) if args.fisher_samples else cfg


def timeout_for(estimator: str, epoch5000_s: float | None, cap: float, floor: float) -> float:
    """Seconds ``estimator`` may run: its ``timeout_epochs`` × the model's 5,000-image epoch, within
    ``[floor, cap]`` (``cap`` when the epoch is unknown).

    Example:
        >>> timeout_for("ads", 100.0, 600, 60), timeout_for("ads", 1.0, 600, 60), timeout_for("ads", None, 600, 60)
        (200.0, 60, 600)
    """
    if epoch5000_s is None or not math.isfinite(epoch5000_s):
        return cap
    return min(cap, max(floor, INFO[estimator].get("timeout_epochs", DEFAULT_TIMEOUT_EPOCHS) * epoch5000_s))


def expected_seconds(job: Job, epoch5000_s: float | None, timeout: float) -> float:
    """Printed estimate for one job: its cost at issue 15's targets plus the process's own
    reference epoch, at most its timeout."""
    if epoch5000_s is None:
        return timeout
    ref = epoch5000_s * job.config.ref_images / EPOCH_IMAGES
    return min(timeout, PROCESS_OVERHEAD_S + ref + INFO[job.estimator]["expected_epochs"] * epoch5000_s)


def _parser():
    names, families = ", ".join(INFO), ", ".join(dict.fromkeys(family for family, _ in MODELS.values()))
    parser = benchmark_parser("scale", package.__doc__.splitlines()[0],
                              skip_help=f"estimators ({names}), models, families ({families}) or MODEL/ESTIMATOR")
    parser.set_defaults(seeds=1)  # a cost benchmark: one measurement per cell unless asked
    parser._option_string_actions["--seeds"].help = "repeat every measurement with seeds 0..N-1 (default 1)"
    parser.add_argument("--models", default=None,
                        help=f"comma-separated subset of {', '.join(MODELS)} (default: {', '.join(FULL_MODELS)}; "
                             f"--quick: {', '.join(QUICK_MODELS)})")
    parser.add_argument("--estimators", default=None, help="comma-separated subset of the estimators")
    parser.add_argument("--timeout", type=positive_seconds, default=None,
                        help="most seconds one measurement may run (default 600; 30 with --quick)")
    parser.add_argument("--fisher-samples", type=positive_int, default=None,
                        help="samples of fisher_expected / fisher_empirical (default 32; 8 with --quick)")
    parser.add_argument("--hessian-max-params", type=float, default=3e6,
                        help="run the exact Hessian (curvature_hessian) only on models with at most this many "
                             "parameters (default 3e6; it takes hours on a ResNet-18 and is stopped at its "
                             "timeout, which still records its peak memory)")
    parser.add_argument("--max-rss-gb", type=float, default=6.0,
                        help="memory cap per measurement process, GB (default 6): past it the measurement "
                             "is recorded as out_of_memory")
    parser.add_argument("--start-method", default="forkserver", choices=START_METHODS,
                        help="how measurement processes start (default forkserver: forked from a server that "
                             "imported torch, torchvision and Avalanche once)")
    return parser


def _load_average() -> float | None:
    """The 1-minute load average (other processes on the machine slow every timing down)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _wanted_pairs(args, models: list[str], estimators: list[str]) -> list[tuple[str, str]]:
    """Phase 2's ``(model, estimator)`` pairs: not the reference epoch, not skipped (by model, estimator or
    family), and the 5,000-sample epoch check only on its model unless ``--estimators`` names it."""
    def skipped(model, estimator):
        return (is_skipped(args.skip, model, estimator) or estimator in args.skip
                or MODELS[model][0] in args.skip)

    def wanted(model, estimator):
        if estimator == "epoch_5000" and model != CHECK_EPOCH_MODEL and args.estimators is None:
            return False
        return estimator in estimators and not skipped(model, estimator)

    return [(m, e) for m in models for e in estimators if e != "epoch" and wanted(m, e)]


def _measurement_jobs(pairs: list[tuple[str, str]], params: dict, cfg, seeds) -> tuple[list, list[dict]]:
    """Phase 2's jobs for the wanted ``(model, estimator)`` pairs, and the rows of those skipped up front
    (the exact Hessian of a model over ``cfg.hessian_max_params``)."""
    jobs, skipped_rows = [], []
    message = f"exact Hessian only up to {cfg.hessian_max_params / 1e6:g} M parameters"
    for m, e in pairs:
        planned = [Job(m, e, s, cfg) for s in seeds]
        if e == "curvature_hessian" and params.get(m, 0) > cfg.hessian_max_params:
            skipped_rows += [_with_context(failure_row(job, "skipped", message), job, params) for job in planned]
        else:
            jobs += planned
    return jobs, skipped_rows


def _with_context(row: dict, job, params: dict) -> dict:
    """``row`` with the job's context where it lacks it (a job skipped up front, or one whose process
    was killed before it reported anything)."""
    row.setdefault("family", MODELS[job.model][0])
    row.setdefault("what", INFO[job.estimator]["what"])
    row.setdefault("setting", setting_for(job))
    if row.get("params") is None and job.model in params:
        row["params"] = params[job.model]
    return row


def main(argv=None) -> dict:
    parser = _parser()
    args = parse_args(parser, argv, unused=("executor",))
    if args.report:
        return {"report": print_report(args.report, report)}
    models = subset_of(parser, "--models", args.models, list(MODELS), QUICK_MODELS if args.quick else FULL_MODELS)
    estimators = subset_of(parser, "--estimators", args.estimators, list(INFO),
                           [e for e in INFO if not (args.quick and e == "epoch_5000")])
    if not args.max_rss_gb > 0:  # the runner's memory cap (--timeout and --fisher-samples are typed)
        parser.error(f"--max-rss-gb must be > 0, got {args.max_rss_gb}")
    cap = args.timeout or (30.0 if args.quick else 600.0)
    floor = min(cap, 5.0 if args.quick else 60.0)
    cfg = config_for(args)
    measure = importlib.import_module("benchmarks.scale.measure").measure  # picklable by module path

    seeds = range(args.seeds)
    start = time.perf_counter()
    load_start = _load_average()
    timeouts: dict[tuple, float] = {}

    def executor():
        return ProcessExecutor(timeout_of=lambda job: timeouts.get((job.model, job.estimator), cap),
                               workers=args.workers, max_rss_gb=args.max_rss_gb, start_method=args.start_method,
                               preload=PRELOAD, threads=args.threads)

    if args.start_method == "forkserver":
        print("scale: starting the measurement server (imports torch, torchvision and Avalanche once; "
              "10-30 s)", flush=True)
    # phase 1: the reference epoch of every model (its first ok seed sets the timeouts of phase 2)
    ref_jobs = [Job(m, "epoch", s, cfg) for m in models for s in seeds]
    ref_rows = run_cached(args, measure, ref_jobs, "scale: reference epochs", executor=executor())
    epochs = {r["model"]: r["epoch5000_s"] for r in reversed(ref_rows) if r.get("status") == "ok"}
    params = {r["model"]: r["params"] for r in ref_rows if r.get("params")}
    # phase 2: every other measurement
    jobs, skipped_rows = _measurement_jobs(_wanted_pairs(args, models, estimators), params, cfg, seeds)
    for job in jobs:
        timeouts[(job.model, job.estimator)] = timeout_for(job.estimator, epochs.get(job.model), cap, floor)
    expected = sum(expected_seconds(j, epochs.get(j.model), timeouts[(j.model, j.estimator)]) for j in jobs)
    worst = sum(timeouts[(j.model, j.estimator)] + PROCESS_OVERHEAD_S for j in jobs)
    print(f"scale: {len(jobs)} measurements; expected about {expected / 60:.0f} min if every estimator meets "
          f"issue 15's targets, at most {worst / 60:.0f} min (every measurement at its timeout)", flush=True)
    rows = ref_rows + run_cached(args, measure, jobs, "scale: measurements", executor=executor())
    for job, row in zip(ref_jobs + jobs, rows):  # a process killed before it reported anything
        _with_context(row, job, params)
    order = {name: i for i, name in enumerate(INFO)}
    rows = sorted(rows + skipped_rows, key=lambda r: (models.index(r["model"]), order[r["estimator"]], r["seed"]))
    out = write_results(args.out, args, config={**asdict(cfg), "models": models, "estimators": estimators,
                                                "timeout_cap_s": cap, "max_rss_gb": args.max_rss_gb,
                                                "start_method": args.start_method},
                        rows=rows, summary=slopes(rows), wall_seconds=time.perf_counter() - start,
                        extra={"data": data_for(models),
                               "timeouts_s": {f"{m}/{e}": t for (m, e), t in timeouts.items()},
                               "expected_minutes": expected / 60, "params": params,
                               "load_average": {"start": load_start, "end": _load_average()}})
    plot(rows, out / "scale.png")
    text = print_report(out / "results.json", report, out_dir=out)
    return {"rows": rows, "report": text, "out": out}
