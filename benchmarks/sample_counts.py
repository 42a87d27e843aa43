"""What a diagnostic's sample count costs and changes (issue 41's trade-off).

Method, outputs and ``--report``: docs/benchmarks.md, "benchmarks.sample_counts".
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import yaml

from avalanche_plugins.core.calls import sample_stride
from avalanche_plugins.study.api import load_study, plan_test_jobs
from avalanche_plugins.study.jobs import Timer, torch_threads
from avalanche_plugins.study.report.files import print_report
from avalanche_plugins.study.run.job import run_job
from benchmarks._cli import benchmark_parser, parse_args
from benchmarks._results import write_results
from benchmarks.diagnostics_cost import METRICS, setting_config

ALL = 0  # --eval-samples 0: the whole experience (eval_samples=None)
TEST_IMAGES = 2000  # per experience of Split Fashion-MNIST (5 experiences of 2 classes)
#: per metric (what each table is: the comments of sample_counts.yaml)
_SETTINGS = yaml.safe_load(Path(__file__).with_suffix(".yaml").read_text(encoding="utf-8"))
VALUES, COUNT_KWARG, REFERENCE, DEFAULT_COUNTS = (
    _SETTINGS[key] for key in ("values", "count_kwarg", "reference", "default_counts"))


def relative(metric: str) -> bool:
    """Whether ``metric``'s differences are relative to the reference value (docs/benchmarks.md)."""
    return metric in REFERENCE


def count_kwargs(metric: str, count: int) -> dict:
    """The keywords that set ``metric``'s sample count to ``count`` (``ALL``: whole experience)."""
    if metric == "OptimizationReadinessMetric":
        return {"n_samples": count, "n_batches": max(1, count // 2)}
    return {COUNT_KWARG[metric]: None if count == ALL else count}


def _kwargs(metric: str) -> dict:
    spec = next((m for m in METRICS if (m["name"] if isinstance(m, dict) else m) == metric), metric)
    return dict(spec["kwargs"]) if isinstance(spec, dict) else {}


def _values(row: dict, metric: str) -> dict:
    """``{(metric, key, training experience, step): value}`` of the run's scalars of ``metric``."""
    return {(r["metric"], r["key"], r["training_experience"], r["step"]): float(r["value"]) for r in row["metrics"]
            if r["metric"].startswith(tuple(VALUES[metric])) and r["value"] not in ("", None)}


def run_one(job, metric: str, eval_samples: int) -> dict:
    spec = next(m for m in job.metrics if m.name == metric)
    kwargs = {**_kwargs(metric), **count_kwargs(metric, eval_samples)}
    row = run_job(dataclasses.replace(job, metrics=(dataclasses.replace(spec, kwargs=kwargs),)), log_dir=None)
    if row["status"] != "ok":
        raise RuntimeError(f"{metric} eval_samples={eval_samples} seed {job.seed}: {row['status']}: {row.get('error')}")
    out = {"seed": job.seed, "eval_samples": eval_samples, "train_s": row["train_s"],
           "metric_s": row["callback_s"][metric], "values": _values(row, metric)}
    print(json.dumps({key: v for key, v in out.items() if key != "values"}), flush=True)
    return out


def _matches(name: str, prefix: str, metric: str) -> bool:
    """``name`` is one of the values ``prefix`` names (docs/benchmarks.md, sample_counts)."""
    return name == prefix if relative(metric) else name.startswith(prefix)


def _distance(value: float, reference: float, metric: str) -> float:
    gap = abs(value - reference)
    return gap / max(abs(reference), 1e-12) if relative(metric) else gap


def compare(runs: list[dict], metric: str) -> list[dict]:
    """One row per (count, seed): cost, and the distance of its values to the reference count's."""
    ref_count = REFERENCE.get(metric, ALL)
    full = {r["seed"]: r["values"] for r in runs if r["eval_samples"] == ref_count}
    rows = []
    for r in runs:
        reference = full[r["seed"]]
        shared = sorted(set(reference) & set(r["values"]))
        diffs = {prefix: [_distance(r["values"][k], reference[k], metric) for k in shared if _matches(k[0], prefix, metric)]
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
    kind_of = "rel. diff." if relative(metric) else "abs. diff."
    head = [COUNT_KWARG[metric], "seeds", "metric (s)", "metric / training",
            *(f"{t}: {kind} {kind_of}" for t in titles.values() for kind in ("mean", "max")),
            *([] if relative(metric) else ["acc std. error at p = 0.5"])]
    lines = [f"`{saved.get('command')}`", "", f"{metric}, Split Fashion-MNIST ({TEST_IMAGES} test images per experience)",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in sorted({r["eval_samples"] for r in rows}, key=lambda v: (v != ALL, -v)):
        part = [r for r in rows if r["eval_samples"] == k]
        reference = " (reference)" if k == REFERENCE.get(metric) else ""
        cells = ["all" if k == ALL else f"{k}{reference}", str(len(part)), f"{np.mean([r['metric_s'] for r in part]):.2f}",
                 f"{100 * np.mean([r['share'] for r in part]):.1f} %"]
        for prefix in titles:
            cells += [f"{np.mean([r[f'{prefix}_mean'] for r in part]):.4f}", f"{np.max([r[f'{prefix}_max'] for r in part]):.4f}"]
        if not relative(metric):
            m = len(range(0, TEST_IMAGES, sample_stride(TEST_IMAGES, None if k == ALL else k)))  # samples evaluated
            cells.append(f"{math.sqrt(0.25 / m):.4f} ({m} samples)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = benchmark_parser("sample_counts", __doc__.splitlines()[0])
    parser.add_argument("--metric", choices=sorted(VALUES), default="TransportKeyMetric")
    parser.add_argument("--eval-samples", "--counts", dest="eval_samples", default=None,
                        help="comma-separated sample counts (eval_samples of TransportKey / CycleAccuracy, 0: the whole "
                             "experience, default 0,1000,500,250; n_samples / calibration_size of the others, default "
                             "DEFAULT_COUNTS; the reference count is always added)")
    args = parse_args(parser, argv, unused=("quick", "skip", "workers", "executor"))
    if args.report:
        return {"report": print_report(args.report, report)}
    if args.data_root is None:
        parser.error("--data-root: a folder holding FashionMNIST/raw")
    given = args.eval_samples or DEFAULT_COUNTS.get(args.metric, "0,1000,500,250")
    values = sorted({int(v) for v in given.split(",")} | {REFERENCE.get(args.metric, ALL)})
    study = load_study(setting_config("fashion/1"), seeds=args.seeds, data_root=args.data_root)
    jobs = [dataclasses.replace(j, metrics=tuple(m for m in j.metrics if m.name == args.metric))
            for j in plan_test_jobs(study, {}) if j.strategy.name == "Naive"]
    with Timer() as total, torch_threads(args.threads):
        runs = [run_one(job, args.metric, k) for job in jobs for k in values]
    out = write_results(args.out, args, config={"metric": args.metric, "eval_samples": values, "kwargs": _kwargs(args.metric),
                                                "threads": args.threads, "setting": "fashion/1"},
                        rows=compare(runs, args.metric), summary=[], wall_seconds=total.seconds)
    text = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, results.csv, report.md ({total.seconds:.0f}s)")
    return {"report": text}


if __name__ == "__main__":
    main()
