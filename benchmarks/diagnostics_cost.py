"""What the diagnostics cost end to end: the same run with and without every diagnostic attached.

Issue 41. Settings ``demo``, ``fashion/1``, ``fashion/5``, ``resnet18`` (``--skip`` names, each
with ``/without`` and ``/with``); ``--lean`` adds runs at :data:`LEAN_METRICS`' counts. Writes
``results.json``, ``results.csv`` and ``report.md`` (``--report`` re-prints it); what is timed and
each setting: docs/benchmarks.md, "benchmarks.diagnostics_cost".
"""

from __future__ import annotations

import dataclasses
import json
import resource
import tempfile
from pathlib import Path

import torch
import yaml

from avalanche_plugins.study.api import load_study, plan_test_jobs
from avalanche_plugins.study.jobs import Timer, torch_threads
from avalanche_plugins.study.report.files import print_report
from avalanche_plugins.study.run.job import run_job
from benchmarks._cli import benchmark_parser, is_skipped, parse_args
from benchmarks._results import write_results

SETTINGS = ("demo", "fashion/1", "fashion/5", "resnet18")
STUDIES = Path(__file__).resolve().parents[1] / "studies"  # the field settings' configs beside the demo's
DEMO = STUDIES / "demo.yaml"
#: studies/demo.yaml's diagnostics at its arguments (but the Grow-only one)
METRICS = [m for m in yaml.safe_load(DEMO.read_text(encoding="utf-8"))["metrics"]
           if m != "NewbornGradientMetric"]
#: the same diagnostics at their lean counts, and each one's report column (diagnostics_cost.yaml)
LEAN_METRICS, SHORT = (yaml.safe_load(Path(__file__).with_suffix(".yaml").read_text(encoding="utf-8"))[key]
                       for key in ("lean_metrics", "short"))
COUNTS = {"demo": METRICS, "lean": LEAN_METRICS}


def cifar_shaped(seed: int = 0, images: int = 5000, test_images: int = 1000, n_experiences: int = 2,
                 n_classes: int = 100):
    """A class-incremental stream of generated CIFAR-shaped tensors: ``n_experiences`` of
    ``images`` training and ``test_images`` test images (seeded standard-normal inputs, uniform
    labels; the study's benchmark factory of the ``resnet18`` setting)."""
    from avalanche.benchmarks import nc_benchmark
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(seed)

    def data(n):
        per_class = -(-n * n_experiences // n_classes)
        y = torch.arange(n_classes).repeat_interleave(per_class)[torch.randperm(n_classes * per_class, generator=g)]
        y = y[: n * n_experiences]
        return TensorDataset(torch.randn(len(y), 3, 32, 32, generator=g), y)

    return nc_benchmark(data(images), data(test_images), n_experiences=n_experiences, task_labels=False, seed=seed,
                        class_ids_from_zero_from_first_exp=True)


def setting_config(name: str, args=None, counts: str = "demo") -> dict | Path:
    """The study config of a setting (a path for the demo; ``studies/diagnostics_cost_*.yaml`` at
    the setting's epochs or ``args``' image counts) with the diagnostics of ``counts``
    (:data:`COUNTS`: the demo's arguments, or ``lean``)."""
    if name == "demo":
        return DEMO
    family, _, epochs = name.partition("/")
    config = yaml.safe_load((STUDIES / f"diagnostics_cost_{family}.yaml").read_text(encoding="utf-8"))
    if epochs:
        config["training"]["epochs"] = int(epochs)
    else:
        config["scenarios"][0]["kwargs"] = {"images": args.resnet_images, "test_images": args.resnet_test_images}
    return {**config, "metrics": COUNTS[counts]}


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_mb() -> float:
    try:
        status = Path("/proc/self/status").read_text().splitlines()
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):  # no /proc, or no VmHWM line
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(job, setting: str, run: str, *, images: bool = False) -> dict:
    """One run of ``job``: its seconds, per-metric seconds and peak memory."""
    reset = _reset_peak()
    with tempfile.TemporaryDirectory() as folder:
        row = run_job(job, log_dir=folder if images else None)
    if row["status"] != "ok":
        raise RuntimeError(f"{setting}/{run}: {row['status']}: {row.get('error')}")
    metrics = {SHORT.get(k, k): v for k, v in row["callback_s"].items() if k in SHORT}
    out = {"setting": setting, "run": run, "train_s": row["train_s"], "diagnostics_s": row["diagnostics_s"],
           "ratio": row["diagnostics_s"] / row["train_s"], "wall_s": row["wall_s"], "figures_s": row["figures_s"],
           "acc": row["acc"], "peak_mb": _peak_mb(), "peak_since_start": not reset,
           **{f"{name}_s": seconds for name, seconds in metrics.items()}}
    print(json.dumps(out), flush=True)
    return out


def naive_job(config, data_root=None):
    """The Naive test job of a study ``config`` (a path or a dict) at one seed."""
    study = load_study(config, seeds=1, data_root=data_root)
    return next(j for j in plan_test_jobs(study, {}) if j.strategy.name == "Naive")


def run_setting(name: str, args) -> list[dict]:
    """Every run of one setting (the demo: without diagnostics first, so that the first run with
    them pays their first-call warm-ups; the others: with them first)."""
    job = naive_job(setting_config(name, args), args.data_root)
    without = None if is_skipped(args.skip, *name.split("/"), "without") else dataclasses.replace(job, metrics=())
    if name != "demo":  # the long runs: the one with diagnostics first (its ratio is the result)
        lean = []
        if args.lean:  # the same job with the diagnostics at their lean counts
            lean_job = naive_job(setting_config(name, args, "lean"), args.data_root)
            lean = [measure(lean_job, name, "with (lean counts)")]
        skip_demo_counts = is_skipped(args.skip, *name.split("/"), "with")
        return [*([] if skip_demo_counts else [measure(job, name, "with")]), *lean,
                *([measure(without, name, "without")] if without else [])]
    runs = [measure(without, name, "without")] if without else []
    return runs + [measure(job, name, "with"), measure(job, name, "with (warm)"),
                   measure(job, name, "with images", images=True)]


def report(saved: dict) -> str:
    rows = saved["runs"]
    names = [n for n in SHORT.values() if any(f"{n}_s" in r for r in rows)]
    without = {r["setting"]: r["train_s"] for r in rows if r["run"] == "without"}
    head = ["setting", "run", "training (s)", "diagnostics (s)", "diagnostics / training",
            "diagnostics / training without", "figures (s)",
            *[f"{n} (s, % of training)" for n in names], "peak RSS (MB)", "accuracy"]
    lines = [f"`{saved.get('command')}`", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["setting"], r["run"], f"{r['train_s']:.2f}", f"{r['diagnostics_s']:.2f}", f"{r['ratio']:.3f}",
                 f"{r['diagnostics_s'] / without[r['setting']]:.3f}" if r["setting"] in without else "–",
                 f"{r['figures_s']:.2f}" if "figures_s" in r else "–"]
        cells += [f"{r[f'{n}_s']:.2f} ({100 * r[f'{n}_s'] / r['train_s']:.1f} %)" if f"{n}_s" in r else "–"
                  for n in names]
        cells += [f"{r['peak_mb']:.0f}" + ("*" if r["peak_since_start"] else ""), f"{r['acc']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "diagnostics / training: within the run; diagnostics / training without: against the training "
              "seconds of the same setting's run without diagnostics (the first run of a setting in the process "
              "also pays first-call costs of its model's kernels in its training)"]
    if any(r["peak_since_start"] for r in rows):
        lines += ["", "\\* the process's peak so far (its high-water mark could not be reset)"]
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = benchmark_parser("diagnostics_cost", __doc__.splitlines()[0],
                              skip_help=", ".join(SETTINGS) + " (each with /without)")
    parser.add_argument("--lean", action="store_true",
                        help="also run the field settings with the diagnostics at LEAN_METRICS' counts")
    parser.add_argument("--resnet-images", type=int, default=5000, help="training images per experience")
    parser.add_argument("--resnet-test-images", type=int, default=1000, help="test images per experience")
    args = parse_args(parser, argv, unused=("quick", "seeds", "workers", "executor"))
    if args.report:
        return {"report": print_report(args.report, report)}
    if args.data_root is None and not is_skipped(args.skip, "fashion"):
        parser.error("the fashion settings need --data-root (a folder holding FashionMNIST/raw); "
                     "or --skip fashion")
    settings = [s for s in SETTINGS if not is_skipped(args.skip, *s.split("/"))]
    with Timer() as total, torch_threads(args.threads):
        runs = [run for name in settings for run in run_setting(name, args)]
    out = write_results(args.out, args, config={"settings": settings, "metrics": METRICS,
                                                "lean_metrics": LEAN_METRICS if args.lean else None,
                                                "threads": args.threads,
                                                "resnet_images": args.resnet_images,
                                                "resnet_test_images": args.resnet_test_images},
                        rows=runs, summary=[], wall_seconds=total.seconds, extra={"runs": runs})
    text = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, results.csv, report.md ({total.seconds:.0f}s)")
    return {"runs": runs, "report": text}


if __name__ == "__main__":
    main()
