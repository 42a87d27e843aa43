"""What the transport keys' evaluation sample count costs and changes (issue 41's trade-off).

``TransportKeyMetric`` evaluates every stitched model (stages × families × controls) on the
evaluated experience as its batches stream by: at field scale that is most of the diagnostics'
cost (docs/RESULTS.md, "What the diagnostics cost"). ``eval_samples`` evaluates every
``⌈n / eval_samples⌉``-th sample instead. This runs the ``fashion/1`` setting of
:mod:`benchmarks.diagnostics_cost` (class-incremental Split Fashion-MNIST, the zoo's ``cnn``, Naive,
1 epoch per experience; ``--data-root`` holding ``FashionMNIST/raw``) with only the transport-key
metric attached, at the demo's arguments, for each ``--eval-samples`` value and seed, and reports
the metric's seconds as a share of training and how far its logged accuracies and recoveries are
from those on the whole experience (mean and largest absolute difference over every variant and
evaluation of a seed, then over seeds), beside the binomial standard error ``√(p(1 − p)/m)`` an
accuracy on ``m`` samples has.
"""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np

from avalanche_plugins.study.api import load_study, plan_test_jobs
from avalanche_plugins.study.harness.jobs import Timer, torch_threads
from avalanche_plugins.study.harness.results import print_report, write_results
from avalanche_plugins.study.runner import run_job
from benchmarks._cli import benchmark_parser, parse_args
from benchmarks.diagnostics_cost import METRICS, setting_config

ALL = 0  # --eval-samples 0: the whole experience (eval_samples=None)
TRANSPORT = next(m for m in METRICS if isinstance(m, dict) and m["name"] == "TransportKeyMetric")


def _values(row: dict) -> dict:
    """``{(metric, key, training experience): value}`` of the run's transport-key scalars."""
    return {(r["metric"], r["key"], r["training_experience"]): float(r["value"]) for r in row["metrics"]
            if r["metric"].startswith("TransportKey") and r["value"] not in ("", None)}


def run_one(job, eval_samples: int) -> dict:
    kwargs = {**TRANSPORT["kwargs"], "eval_samples": None if eval_samples == ALL else eval_samples}
    metric = dataclasses.replace(job.metrics[0], kwargs=kwargs)
    row = run_job(dataclasses.replace(job, metrics=(metric,)), log_dir=None)
    if row["status"] != "ok":
        raise RuntimeError(f"eval_samples={eval_samples} seed {job.seed}: {row['status']}: {row.get('error')}")
    return {"seed": job.seed, "eval_samples": eval_samples, "train_s": row["train_s"],
            "tk_s": row["callback_s"]["TransportKeyMetric"], "values": _values(row)}


def compare(runs: list[dict]) -> list[dict]:
    """One row per (eval_samples, seed): cost, and the distance of its values to the whole experience's."""
    full = {r["seed"]: r["values"] for r in runs if r["eval_samples"] == ALL}
    rows = []
    for r in runs:
        reference = full[r["seed"]]
        shared = sorted(set(reference) & set(r["values"]))
        diffs = {kind: [abs(r["values"][k] - reference[k]) for k in shared if k[0].startswith(kind)]
                 for kind in ("TransportKeyAcc", "TransportKeyRecovery")}
        rows.append({"eval_samples": r["eval_samples"], "seed": r["seed"], "train_s": r["train_s"],
                     "tk_s": r["tk_s"], "share": r["tk_s"] / r["train_s"], "values": len(r["values"]),
                     "missing": len(set(reference) - set(r["values"])),
                     **{f"{kind}_mean": float(np.mean(d)) if d else 0.0 for kind, d in diffs.items()},
                     **{f"{kind}_max": float(np.max(d)) if d else 0.0 for kind, d in diffs.items()}})
    return rows


def report(saved: dict) -> str:
    rows = saved["runs"]
    n_test = saved["config"]["test_images"]
    head = ["eval_samples", "seeds", "TK (s)", "TK / training", "acc: mean abs. diff.", "acc: max abs. diff.",
            "recovery: mean abs. diff.", "recovery: max abs. diff.", "acc std. error at p = 0.5"]
    lines = [f"`{saved.get('command')}`", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in sorted({r["eval_samples"] for r in rows}, key=lambda v: (v != ALL, -v)):
        part = [r for r in rows if r["eval_samples"] == k]
        m = n_test if k == ALL else -(-n_test // -(-n_test // k))  # samples evaluated: n / ⌈n / k⌉
        cells = ["all" if k == ALL else str(k), str(len(part)), f"{np.mean([r['tk_s'] for r in part]):.2f}",
                 f"{100 * np.mean([r['share'] for r in part]):.1f} %",
                 *(f"{np.mean([r[c] for r in part]):.4f}" if "mean" in c else f"{np.max([r[c] for r in part]):.4f}"
                   for c in ("TransportKeyAcc_mean", "TransportKeyAcc_max", "TransportKeyRecovery_mean",
                             "TransportKeyRecovery_max")),
                 f"{math.sqrt(0.25 / m):.4f} ({m} samples)"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = benchmark_parser("transport_key_samples", __doc__.splitlines()[0])
    parser.add_argument("--eval-samples", default="0,1000,500,250",
                        help="comma-separated eval_samples values (0: the whole experience)")
    args = parse_args(parser, argv)
    if args.report:
        return {"report": print_report(args.report, report)}
    if args.data_root is None:
        parser.error("--data-root: a folder holding FashionMNIST/raw")
    values = sorted({int(v) for v in args.eval_samples.split(",")} | {ALL})
    study = load_study(setting_config("fashion/1", SimpleNamespace()), seeds=args.seeds, data_root=args.data_root)
    jobs = [j for j in plan_test_jobs(study, {}) if j.strategy.name == "Naive"]
    jobs = [dataclasses.replace(j, metrics=tuple(m for m in j.metrics if m.name == "TransportKeyMetric"))
            for j in jobs]
    runs = []
    with Timer() as total, torch_threads(args.threads):
        for job in jobs:
            for k in values:
                runs.append(run_one(job, k))
                print(json.dumps({key: v for key, v in runs[-1].items() if key != "values"}), flush=True)
    rows = compare(runs)
    out = write_results(args.out, args, config={"eval_samples": values, "metric": TRANSPORT, "threads": args.threads,
                                                "test_images": 2000, "setting": "fashion/1"},
                        rows=rows, summary=[], wall_seconds=total.seconds)
    text = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, results.csv, report.md ({total.seconds:.0f}s)")
    return {"rows": rows, "report": text}


if __name__ == "__main__":
    main()
