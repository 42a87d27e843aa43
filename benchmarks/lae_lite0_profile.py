"""The per-layer curvature profile of an ImageNet-pretrained EfficientNet-Lite0 (issue 40).

Fisher and exact Hessian blocks (κ, α̂, R², the peak layer) on the first experience of Split
Fashion-MNIST, at the pretrained weights and after fine-tuning; writes ``OUT/results.json``,
``OUT/report.md`` (``--report`` re-prints it) and ``OUT/profile.png`` (method: docs/benchmarks.md,
"benchmarks.lae_lite0_profile"). Needs the data and the ``pretrained`` extra::

    python -m benchmarks.lae_lite0_profile --data-root DATA --seeds 3 --workers 2
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from avalanche_plugins.study.jobs import Timer
from avalanche_plugins.study.report.files import print_report
from benchmarks._cli import benchmark_parser, parse_args, run_cached
from benchmarks._results import saved_figure, write_results
from benchmarks.lae_pretrained import dataset_samples, sgd_naive

PHASES = ("pretrained", "fine_tuned")
MEASURES = ("fisher", "hessian")


@dataclass(frozen=True)
class Job:
    seed: int
    data_root: str | None
    samples: int = 256
    hessian_samples: int = 16  # 0: no exact blocks for this seed (7x the Fisher blocks' time at 1/16 of their samples)
    hessian_iter: int = 10
    hessian_tol: float = 1e-2
    input_size: int = 64
    train_per_class: int = 200
    epochs: int = 1


def _measure(model, x, y, job: Job) -> dict:
    from avalanche_plugins.layer_adaptive import layer_fisher_eigenvalues, layer_top_eigenvalues

    with Timer() as t:
        fisher = layer_fisher_eigenvalues(model, nn.CrossEntropyLoss(), x[: job.samples], y[: job.samples],
                                          seed=job.seed)
    out = {"fisher": {"layers": list(fisher.names), "s": [float(v) for v in fisher.top],
                      "seconds": t.seconds}}
    if not job.hessian_samples:
        return out
    n = job.hessian_samples
    with Timer() as t:
        hessian = layer_top_eigenvalues(model, nn.CrossEntropyLoss(), x[:n], y[:n],
                                        max_iter=job.hessian_iter, tol=job.hessian_tol, seed=job.seed)
    out["hessian"] = {"layers": list(hessian.names), "s": [float(v) for v in hessian.top],
                      "converged": [bool(c) for c in hessian.converged], "iterations": list(hessian.iterations),
                      "seconds": t.seconds}
    return out


def run_job(job: Job) -> dict:
    """Both measures of ``s_ℓ`` at the pretrained weights and after fine-tuning on experience 0."""
    from avalanche_plugins.study.catalog.datasets import make_stream
    from avalanche_plugins.study.catalog.zoo import build_model

    stream = make_stream("fashion_mnist", "split", n_experiences=5, data_root=job.data_root, seed=job.seed,
                         train_per_class=job.train_per_class)
    experience = stream.benchmark.train_stream[0]
    n = max(job.samples, job.hessian_samples)
    x, y, _ = dataset_samples(experience.dataset.eval(), n, job.seed, sort=False)
    torch.manual_seed(job.seed)
    model = build_model("efficientnet_lite0", stream.input_shape, stream.n_classes, input_norm="fashion_mnist",
                        input_size=job.input_size, bn_momentum=0.1)
    row = {"classes": sorted({int(c) for c in y}), "pretrained": _measure(model, x, y, job)}
    strategy = sgd_naive(model, [], job.epochs, lr=0.003, batch=16, eval_batch=250)
    strategy.train(experience, num_workers=0)
    model.eval()
    with torch.no_grad():
        row["train_accuracy"] = float((model(x).argmax(1) == y).float().mean())
    row["fine_tuned"] = _measure(model, x, y, job)
    return row


def profile_summary(s) -> dict:
    """κ, the geometric fit and the peak of one profile ``s`` (layers in forward order).

    Example:
        >>> d = profile_summary([8.0, 4.0, 2.0, 1.0])
        >>> d["kappa"], round(d["alpha_hat"], 6), d["peak"], d["peak_depth"]
        (8.0, 2.0, 0, 0.0)
    """
    from avalanche_plugins.layer_adaptive.hessian import condition_number, geometric_fit

    s = np.asarray(s, dtype=float)
    fit = geometric_fit(s)
    peak = int(np.argmax(s))
    return {"kappa": condition_number(s), "alpha_hat": fit.alpha, "r2": fit.r2, "peak": peak,
            "peak_depth": peak / max(len(s) - 1, 1)}


def _mean_std(values) -> str:
    values = np.asarray(values, dtype=float)
    return f"{values.mean():.3g} ± {values.std(ddof=1):.2g}" if len(values) > 1 else f"{values.mean():.3g}"


def table(rows: list[dict]) -> str:
    """Markdown: per (measure, phase) κ, α̂, R², the peak layer, over the seeds."""
    lines = ["| measure | phase | seeds | κ | α̂ | R² | peak layer (relative depth) | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for measure in MEASURES:
        for phase in PHASES:
            found = [(r[phase][measure], profile_summary(r[phase][measure]["s"])) for r in rows if measure in r[phase]]
            if not found:
                continue
            peaks = ", ".join(f"{m['layers'][d['peak']]} ({d['peak_depth']:.2f})" for m, d in found)
            lines.append(f"| {measure} | {phase} | {len(found)} | {_mean_std([d['kappa'] for _, d in found])} | "
                         f"{_mean_std([d['alpha_hat'] for _, d in found])} | {_mean_std([d['r2'] for _, d in found])} | "
                         f"{peaks} | {_mean_std([m['seconds'] for m, _ in found])} |")
    return "\n".join(lines)


def figure(rows: list[dict], path: Path) -> None:
    with saved_figure(path, 1, 2, figsize=(11, 3.6), dpi=110) as (fig, axes):
        for ax, measure in zip(axes[0], MEASURES):
            for phase, style in zip(PHASES, ("-", "--")):
                for i, r in enumerate(rows):
                    if measure not in r[phase]:
                        continue
                    s = r[phase][measure]["s"]
                    ax.semilogy(range(1, len(s) + 1), s, style, color=f"C{i}", alpha=0.8,
                                label=f"seed {r['seed']}, {phase.replace('_', ' ')}")
            ax.set(title=f"{measure} blocks", xlabel="layer ℓ (forward order)", ylabel="s_ℓ")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("EfficientNet-Lite0 (ImageNet-1k) on Split Fashion-MNIST experience 1: per-layer curvature")


def report(saved: dict) -> str:
    return f"`{saved.get('command')}`\n\n" + table(saved["runs"])


def main(argv=None) -> dict:
    parser = benchmark_parser("lae_lite0_profile", __doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=256, help="samples of the Fisher blocks")
    parser.add_argument("--hessian-samples", type=int, default=16, help="samples of the exact Hessian blocks")
    parser.add_argument("--hessian-iter", type=int, default=10, help="Lanczos steps per layer at most")
    parser.add_argument("--hessian-seeds", type=int, default=1, help="the first N seeds also get the exact blocks")
    parser.add_argument("--input-size", type=int, default=64)
    args = parse_args(parser, argv, unused=("skip",))
    if args.report:
        return {"report": print_report(args.report, report)}
    if args.data_root is None:
        parser.error("--data-root: a folder holding FashionMNIST/raw (Split Fashion-MNIST)")
    if args.quick:  # minutes instead of an hour: a smoke run of every step, not a measurement
        args.samples, args.hessian_samples, args.hessian_iter = 32, 4, 3
    jobs = [Job(seed, args.data_root, args.samples, args.hessian_samples if seed < args.hessian_seeds else 0,
                args.hessian_iter, input_size=args.input_size, train_per_class=20 if args.quick else 200)
            for seed in range(args.seeds)]
    with Timer() as total:
        rows = run_cached(args, run_job, jobs, "profiles")
    rows = [{**row, "seed": job.seed, "job": asdict(job)} for job, row in zip(jobs, rows)]
    out = write_results(args.out, args, config={"jobs": [asdict(job) for job in jobs]}, rows=rows, summary=[],
                        wall_seconds=total.seconds)
    figure(rows, out / "profile.png")
    text = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, report.md, profile.png")
    return {"rows": rows, "report": text}


if __name__ == "__main__":
    main()
