"""What a diagnostic's evaluation sample count costs and changes (issue 41's trade-off).

``TransportKeyMetric`` evaluates every stitched model (stages × families × controls) on the
evaluated experience as its batches stream by, and ``CycleAccuracyMetric`` evaluates every seen
test experience at every cycle: at field scale these are most of the diagnostics' cost
(docs/RESULTS.md, "What the diagnostics cost"). Both take ``eval_samples``: every
``⌈n / eval_samples⌉``-th sample of an experience of ``n``. This runs the ``fashion/1`` setting of
:mod:`benchmarks.diagnostics_cost` (class-incremental Split Fashion-MNIST, 2,000 test images per
experience, the zoo's ``cnn``, Naive, 1 epoch per experience; ``--data-root`` holding
``FashionMNIST/raw``) with only ``--metric`` attached, at the demo's arguments, for each
``--eval-samples`` value and seed, and reports the metric's seconds as a share of training and
how far its logged values are from those on the whole experience (mean and largest absolute
difference over every value of a seed, then over seeds), beside the binomial standard error
``√(p(1 − p)/m)`` of an accuracy on ``m`` samples at ``p = 0.5``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np

from avalanche_plugins.core.calls import sample_stride
from avalanche_plugins.study.api import load_study, plan_test_jobs
from avalanche_plugins.study.harness.jobs import Timer, torch_threads
from avalanche_plugins.study.harness.results import print_report
from avalanche_plugins.study.runner import run_job
from benchmarks._cli import benchmark_parser, parse_args
from benchmarks._results import write_results
from benchmarks.diagnostics_cost import METRICS, setting_config

ALL = 0  # --eval-samples 0: the whole experience (eval_samples=None)
TEST_IMAGES = 2000  # per experience of Split Fashion-MNIST (5 experiences of 2 classes)
#: the logged values compared, per metric: {metric name prefix: column title}
VALUES = {"TransportKeyMetric": {"TransportKeyAcc": "stitched acc", "TransportKeyRecovery": "recovery"},
          "CycleAccuracyMetric": {"CycleAccuracy": "cycle acc", "TAA": "TAA"}}


def _kwargs(metric: str) -> dict:
    spec = next((m for m in METRICS if (m["name"] if isinstance(m, dict) else m) == metric), metric)
    return dict(spec["kwargs"]) if isinstance(spec, dict) else {}


def _values(row: dict, metric: str) -> dict:
    """``{(metric, key, training experience, step): value}`` of the run's scalars of ``metric``."""
    return {(r["metric"], r["key"], r["training_experience"], r["step"]): float(r["value"]) for r in row["metrics"]
            if r["metric"].startswith(tuple(VALUES[metric])) and r["value"] not in ("", None)}


def run_one(job, metric: str, eval_samples: int) -> dict:
    spec = next(m for m in job.metrics if m.name == metric)
    kwargs = {**_kwargs(metric), "eval_samples": None if eval_samples == ALL else eval_samples}
    row = run_job(dataclasses.replace(job, metrics=(dataclasses.replace(spec, kwargs=kwargs),)), log_dir=None)
    if row["status"] != "ok":
        raise RuntimeError(f"{metric} eval_samples={eval_samples} seed {job.seed}: {row['status']}: {row.get('error')}")
    return {"seed": job.seed, "eval_samples": eval_samples, "train_s": row["train_s"],
            "metric_s": row["callback_s"][metric], "values": _values(row, metric)}


def compare(runs: list[dict], metric: str) -> list[dict]:
    """One row per (eval_samples, seed): cost, and the distance of its values to the whole experience's."""
    full = {r["seed"]: r["values"] for r in runs if r["eval_samples"] == ALL}
    rows = []
    for r in runs:
        reference = full[r["seed"]]
        shared = sorted(set(reference) & set(r["values"]))
        diffs = {prefix: [abs(r["values"][k] - reference[k]) for k in shared if k[0].startswith(prefix)]
                 for prefix in VALUES[metric]}
        rows.append({"metric": metric, "eval_samples": r["eval_samples"], "seed": r["seed"], "train_s": r["train_s"],
                     "metric_s": r["metric_s"], "share": r["metric_s"] / r["train_s"], "values": len(r["values"]),
                     "missing": len(set(reference) - set(r["values"])),
                     **{f"{p}_mean": float(np.mean(d)) if d else 0.0 for p, d in diffs.items()},
                     **{f"{p}_max": float(np.max(d)) if d else 0.0 for p, d in diffs.items()}})
    return rows


def report(saved: dict) -> str:
    rows, metric = saved["runs"], saved["config"]["metric"]
    titles = VALUES[metric]
    head = ["eval_samples", "seeds", "metric (s)", "metric / training",
            *(f"{t}: {kind} abs. diff." for t in titles.values() for kind in ("mean", "max")),
            "acc std. error at p = 0.5"]
    lines = [f"`{saved.get('command')}`", "", f"{metric}, Split Fashion-MNIST ({TEST_IMAGES} test images per experience)",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in sorted({r["eval_samples"] for r in rows}, key=lambda v: (v != ALL, -v)):
        part = [r for r in rows if r["eval_samples"] == k]
        m = len(range(0, TEST_IMAGES, sample_stride(TEST_IMAGES, None if k == ALL else k)))  # samples evaluated
        cells = ["all" if k == ALL else str(k), str(len(part)), f"{np.mean([r['metric_s'] for r in part]):.2f}",
                 f"{100 * np.mean([r['share'] for r in part]):.1f} %"]
        for prefix in titles:
            cells += [f"{np.mean([r[f'{prefix}_mean'] for r in part]):.4f}", f"{np.max([r[f'{prefix}_max'] for r in part]):.4f}"]
        cells.append(f"{math.sqrt(0.25 / m):.4f} ({m} samples)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = benchmark_parser("sample_counts", __doc__.splitlines()[0])
    parser.add_argument("--metric", choices=sorted(VALUES), default="TransportKeyMetric")
    parser.add_argument("--eval-samples", default="0,1000,500,250",
                        help="comma-separated eval_samples values (0: the whole experience)")
    args = parse_args(parser, argv)
    if args.report:
        return {"report": print_report(args.report, report)}
    if args.data_root is None:
        parser.error("--data-root: a folder holding FashionMNIST/raw")
    values = sorted({int(v) for v in args.eval_samples.split(",")} | {ALL})
    study = load_study(setting_config("fashion/1", SimpleNamespace()), seeds=args.seeds, data_root=args.data_root)
    jobs = [dataclasses.replace(j, metrics=tuple(m for m in j.metrics if m.name == args.metric))
            for j in plan_test_jobs(study, {}) if j.strategy.name == "Naive"]
    runs = []
    with Timer() as total, torch_threads(args.threads):
        for job in jobs:
            for k in values:
                runs.append(run_one(job, args.metric, k))
                print(json.dumps({key: v for key, v in runs[-1].items() if key != "values"}), flush=True)
    out = write_results(args.out, args, config={"metric": args.metric, "eval_samples": values, "kwargs": _kwargs(args.metric),
                                                "threads": args.threads, "setting": "fashion/1"},
                        rows=compare(runs, args.metric), summary=[], wall_seconds=total.seconds)
    text = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, results.csv, report.md ({total.seconds:.0f}s)")
    return {"report": text}


if __name__ == "__main__":
    main()
