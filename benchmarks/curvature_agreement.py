"""How far are the fast per-layer curvature estimators from the exact Hessian blocks?

Method, outputs and ``--report``: docs/benchmarks.md, "benchmarks.curvature_agreement".
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from avalanche_plugins.core.stats import spearman
from avalanche_plugins.layer_adaptive.curvature import layer_curvature
from avalanche_plugins.layer_adaptive.hessian import condition_number, geometric_fit
from avalanche_plugins.layer_adaptive.schedules import layer_weights
from avalanche_plugins.study.catalog.datasets import load_digits_arrays, load_mnist_arrays
from avalanche_plugins.study.catalog.zoo import build_model
from avalanche_plugins.study.jobs import Timer, seed_everything
from avalanche_plugins.study.report.files import print_report
from benchmarks._cli import benchmark_parser, is_skipped, parse_args, run_cached, subset_of
from benchmarks._results import format_table, saved_figure, summarize, write_results
from benchmarks._training import train_minibatches

MODELS = ("mlp", "cnn", "vit")
CHECKPOINTS = ("init", "early", "trained")
EXACT = "hessian@256"
WEIGHTS = ("measured", "smoothed")  # the layer_weights schedules compared


@dataclass(frozen=True)
class Config:
    train_samples: int
    epochs: int
    exact_samples: int
    fisher_samples: tuple[int, ...]
    data_root: str | None
    reference_from: str | None = None  # a previous run's jobs.jsonl whose Hessian-block spectra are reused


@dataclass(frozen=True)
class Job:
    model: str
    checkpoint: str
    seed: int
    cfg: Config


def candidates(cfg: Config) -> dict[str, dict]:
    """Estimator name -> ``layer_curvature`` options (the exact reference first)."""
    out = {EXACT: {"method": "hessian", "n": cfg.exact_samples, "chunk_size": 64}}
    for n in cfg.fisher_samples:
        out[f"fisher_sampled@{n}"] = {"method": "fisher", "n": n, "labels": "sampled"}
        out[f"fisher_sampled_plain@{n}"] = {"method": "fisher", "n": n, "labels": "sampled", "debias": False}
    for n in (min(cfg.fisher_samples), max(cfg.fisher_samples)):
        out[f"fisher_true@{n}"] = {"method": "fisher", "n": n, "labels": "true"}
    out["hessian@64"] = {"method": "hessian", "n": 64, "chunk_size": 64}
    out["hessian_5it"] = {"method": "hessian", "n": cfg.exact_samples, "chunk_size": 64, "max_iter": 5}
    return out


def _derived(s: np.ndarray) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # uniform fallbacks are part of what is compared
        weights = {w: layer_weights(w, len(s), spectrum=s) for w in WEIGHTS}
    try:
        alpha = geometric_fit(s).alpha
    except ValueError:
        alpha = float("nan")
    return {"kappa": condition_number(s), "alpha": alpha, **weights}


def run_job(job: Job) -> list[dict]:
    cfg = job.cfg
    seed_everything(job.seed)
    x, y, _, _ = load_mnist_arrays(cfg.data_root) if cfg.data_root else load_digits_arrays()
    g = torch.Generator().manual_seed(job.seed)
    order = torch.randperm(len(x), generator=g)
    x_train, y_train = x[order[:cfg.train_samples]], y[order[:cfg.train_samples]]
    model = build_model(job.model, tuple(x.shape[1:]), 10)
    epochs = {"init": 0, "early": 1, "trained": cfg.epochs}[job.checkpoint]
    if epochs:
        train_minibatches(model, x_train, y_train, epochs=epochs, lr=1e-3, batch_size=64, generator=g)
    model.eval()
    # the measurement samples: the first N of one seeded draw, so every N is a prefix of the larger ones
    pool = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(1000 + job.seed))
    loss_fn = nn.CrossEntropyLoss()
    rows, reference = [], None
    saved = _saved_hessian_rows(cfg.reference_from, job)
    for name, options in candidates(cfg).items():
        options = dict(options)
        idx = pool[:options.pop("n")]
        if name in saved:  # the same seeded model, samples and Hessian code: reuse, do not recompute
            s, seconds = np.asarray(saved[name]["s"], dtype=float), saved[name]["seconds"]
        else:
            with Timer() as timer, warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # truncated power iterations warn by design
                spectrum = layer_curvature(model, loss_fn, x_train[idx], y_train[idx], seed=job.seed, **options)
            s, seconds = np.asarray(spectrum.top, dtype=float), timer.seconds
        d = _derived(s)
        if reference is None:
            reference = (s, d)
        s_ex, d_ex = reference
        rows.append({
            "model": job.model, "checkpoint": job.checkpoint, "seed": job.seed, "estimator": name,
            "n_layers": len(s), "seconds": seconds, "kappa": d["kappa"], "alpha_hat": d["alpha"],
            "log10_kappa_error": abs(np.log10(d["kappa"] / d_ex["kappa"])),
            "alpha_rel_error": abs(d["alpha"] / d_ex["alpha"] - 1.0),
            **{f"lambda_{w}_max_rel_error": float(np.max(np.abs(d[w] / d_ex[w] - 1.0))) for w in WEIGHTS},
            "spearman_s": spearman(s, s_ex) if len(s) > 2 else float("nan"),
            "s": s.tolist(),
        })
    return rows


def _saved_hessian_rows(path: str | None, job: Job) -> dict[str, dict]:
    """The Hessian-block rows of the same job in ``--reference-from`` (docs/benchmarks.md)."""
    if not path:
        return {}
    if not Path(path).exists():
        raise FileNotFoundError(f"--reference-from: no such file {path}")
    for line in Path(path).read_text().splitlines():
        entry = json.loads(line)
        job_fields, cfg = entry["job"], entry["job"]["cfg"]
        if (job_fields["model"], job_fields["checkpoint"], job_fields["seed"]) == (job.model, job.checkpoint, job.seed) \
                and (cfg["train_samples"], cfg["epochs"], cfg["exact_samples"]) == \
                (job.cfg.train_samples, job.cfg.epochs, job.cfg.exact_samples):
            return {row["estimator"]: row for row in entry["row"] if row["estimator"].startswith("hessian")}
    return {}


VALUES = ["log10_kappa_error", "alpha_rel_error", "lambda_measured_max_rel_error",
          "lambda_smoothed_max_rel_error", "spearman_s", "seconds"]


def report(results: dict) -> str:
    overall = summarize(results["runs"], ["estimator"], VALUES)
    return "\n".join([f"Agreement with the exact Hessian blocks ({EXACT}); mean over seeds "
                      f"(n = {results['config'].get('seeds', '?')})", "",
                      format_table(results["summary"], ["model", "checkpoint", "estimator"], VALUES), "",
                      "All models and checkpoints:", "", format_table(overall, ["estimator"], VALUES)])


def plot(rows: list[dict], out: Path) -> None:
    models = sorted({r["model"] for r in rows})
    shown = [EXACT, "fisher_sampled@128", "fisher_sampled_plain@128", "hessian@64"]
    with saved_figure(out / "profiles.png", 1, len(models), figsize=(4.2 * len(models), 3.4), dpi=110) as (_, axes):
        for ax, model in zip(axes[0], models):
            for r in rows:
                if r["model"] == model and r["checkpoint"] == "trained" and r["seed"] == 0 and r["estimator"] in shown:
                    ax.semilogy(range(1, len(r["s"]) + 1), r["s"], marker="o", label=r["estimator"])
            ax.set(title=f"{model}, trained, seed 0", xlabel="layer ℓ", ylabel="s_ℓ")
        axes[0][0].legend(fontsize=7)


def main(argv=None) -> dict:
    parser = benchmark_parser("curvature_agreement", __doc__.splitlines()[0],
                              skip_help="MODEL or MODEL/CHECKPOINT (e.g. vit/init)")
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--epochs", type=int, default=5, help="epochs of the 'trained' checkpoint (default 5)")
    parser.add_argument("--reference-from", default=None, metavar="JOBS_JSONL",
                        help="reuse the exact spectra of a previous run's jobs.jsonl (same models, checkpoints, "
                             "seeds, training); only the fast estimators are recomputed")
    args = parse_args(parser, argv)
    if args.report:
        return {"report": print_report(args.report, report)}
    models = subset_of(parser, "--models", args.models, MODELS, ["mlp"] if args.quick else MODELS)
    cfg = Config(train_samples=1000 if args.quick else 4000, epochs=2 if args.quick else args.epochs,
                 exact_samples=256, fisher_samples=(32, 64, 128, 256), data_root=args.data_root,
                 reference_from=args.reference_from)
    checkpoints = ("init", "trained") if args.quick else CHECKPOINTS
    jobs = [Job(m, c, s, cfg) for m in models for c in checkpoints if not is_skipped(args.skip, m, c)
            for s in range(args.seeds)]
    start = time.perf_counter()
    per_job = run_cached(args, run_job, jobs, "curvature agreement")
    rows = [r for job_rows in per_job for r in job_rows]
    summary = summarize(rows, ["model", "checkpoint", "estimator"], VALUES)
    out = write_results(args.out, args, config={**asdict(cfg), "seeds": args.seeds, "models": models,
                                                "checkpoints": list(checkpoints)},
                        rows=rows, summary=summary, wall_seconds=time.perf_counter() - start)
    plot(rows, out)
    text = print_report(out / "results.json", report, out_dir=out)
    return {"rows": rows, "report": text}


if __name__ == "__main__":
    main()
