"""How much "forgotten" task-A accuracy do transport keys bring back?

Every variant, control, output and ``--report``: docs/benchmarks.md, "benchmarks.transport_keys".
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from avalanche_plugins.study.catalog import datasets
from avalanche_plugins.study.catalog.zoo import TaskHeadsNet, build_model
from avalanche_plugins.study.jobs import Timer, seed_everything
from avalanche_plugins.study.report.files import print_report
from avalanche_plugins.transport import (
    CONTROLS,
    TransportKey,
    class_balanced_anchors,
    control_keys,
    fit_transport_key,
    gauss_newton_key,
    optimize_key,
    recovery,
    refine_key,
    stage_activations,
    stitch,
    stitched_accuracy,
)
from benchmarks._cli import benchmark_parser, is_skipped, parse_args, run_cached, subset_of
from benchmarks._results import format_table, saved_figure, summarize, write_results
from benchmarks._training import batched_accuracy, train_minibatches

PAIRS = ("split", "domain")
DATASETS = {"mnist": datasets.load_mnist_arrays,
            "fashion_mnist": datasets.load_fashion_mnist_arrays}
MODELS = ("cnn", "resnet", "vit")
MODEL_KWARGS = {"cnn": {"widths": (32, 64)}, "vit": {"dim": 48, "depth": 2, "heads": 4}}
STAGES = {"cnn": ["features.0", "features.1"], "resnet": ["stem", "layer1", "layer2", "layer3"],
          "vit": ["embed", "blocks.0", "blocks.1"]}


@dataclass(frozen=True)
class Config:
    """Training, key-fitting and evaluation settings shared by every job of a run."""

    data_root: str | None
    quick: bool
    dataset: str
    epochs_a: int = 3
    epochs_b: int = 2
    lr: float = 3e-3
    batch_size: int = 64
    max_train: int = 4000
    max_test: int = 500
    ridge: float = 1e-4
    refine_steps: int = 30
    refine_lr: float = 1e-3
    gn_iterations: int = 2
    gn_damping: float = 0.1
    stitch_steps: int = 100
    short_stitch_steps: int = 2
    stitch_batch: int = 64
    stitch_lr: float = 1e-2
    anchor_counts: tuple[int, ...] = (10, 50, 100, 500)
    main_anchors: int = 100


@dataclass(frozen=True)
class Job:
    pair: str
    model: str
    seed: int
    config: Config


def task_data(pair: str, data_root, quick: bool, dataset: str = "mnist"):
    """``{"A": (xtr, ytr, xte, yte), "B": ...}``, labels 0..K-1 per task (docs/benchmarks.md)."""
    xtr, ytr, xte, yte = (DATASETS[dataset](data_root) if data_root is not None
                          else datasets.load_digits_arrays())
    if quick:
        xtr, ytr = xtr[:2000], ytr[:2000]
    if pair == "split":
        def part(x, y, lo):
            keep = (y >= lo) & (y < lo + 5)
            return x[keep], y[keep] - lo
        return {"A": (*part(xtr, ytr, 0), *part(xte, yte, 0)), "B": (*part(xtr, ytr, 5), *part(xte, yte, 5))}
    g = torch.Generator().manual_seed(1234)
    perm = torch.randperm(xtr[0].numel(), generator=g)

    def permute(x):
        return x.reshape(len(x), -1)[:, perm].reshape(x.shape)
    return {"A": (xtr, ytr, xte, yte), "B": (permute(xtr), ytr, permute(xte), yte)}


def train_stitch(stitched, u, x, y, steps: int, lr: float, batch: int, seed: int) -> TransportKey:
    """The ``trained_stitch`` baseline (docs/benchmarks.md), on minibatches of the anchors."""
    key = TransportKey("cross_channel", u.shape[1] if u.dim() == 4 else u.shape[-1],
                       layout="channels_first" if u.dim() == 4 else ("tokens" if u.dim() == 3 else "flat"))
    stitched.key = key
    g = torch.Generator().manual_seed(seed)

    def loss_of_key():
        idx = torch.randperm(len(x), generator=g)[:batch]
        return nn.functional.cross_entropy(stitched.forward_from_stage(key(u[idx]), x[idx]), y[idx])

    return optimize_key(key, loss_of_key, steps=steps, lr=lr)


def evaluate_stage(theta_a, theta_ab, stage: str, anchors, test, cfg: Config, with_controls: bool) -> list[dict]:
    """Rows for every key variant at one stage and one anchor set."""
    xa, ya = anchors
    xte, yte = test
    with torch.no_grad():
        u = stage_activations(theta_ab, stage, xa)
        v = stage_activations(theta_a, stage, xa)
        h_test = stage_activations(theta_ab, stage, xte)
    rows = []

    def record(variant, key, seconds):
        stitched = stitch(theta_ab, theta_a, stage, key)
        acc = batched_accuracy(lambda h, x: stitched.forward_from_stage(stitched.key(h), x), h_test, xte,
                               targets=yte, batch_size=500)
        rows.append({"variant": variant, "acc": acc, "fit_s": seconds,
                     "key_params": getattr(key, "num_parameters", 0),
                     "residual": getattr(key, "residual", float("nan"))})

    refiners = {"refine": (refine_key, {"steps": cfg.refine_steps, "lr": cfg.refine_lr}),
                "gauss_newton": (gauss_newton_key, {"iterations": cfg.gn_iterations, "damping": cfg.gn_damping})}
    for family in ("identity", "channel", "cross_channel") if with_controls else ("channel", "cross_channel"):
        with Timer() as t:
            key = fit_transport_key(u, v, family, ridge=cfg.ridge)
        record(family, key, t.seconds)
        if family == "cross_channel" and with_controls:  # the late layers under an error of this key's size
            rows.append(_noise_at_residual(theta_a, stage, v, key.residual, (xte, yte)))
        if family == "cross_channel":  # label-free refinements of a copy of the closed form
            for name, (refine, options) in refiners.items():
                refined = copy.deepcopy(key)
                with Timer() as t_refine:
                    refine(refined, stitch(theta_ab, theta_a, stage, refined), xa, **options)
                record(f"cross_channel+{name}", refined, t.seconds + t_refine.seconds)
        if with_controls and family != "identity":
            for name, control in control_keys(key, u, v, family, ya, seed=0, ridge=cfg.ridge).items():
                record(f"{family}/{name}", control, float("nan"))
    for variant, steps in (("trained_stitch", cfg.stitch_steps), ("trained_stitch_short", cfg.short_stitch_steps)):
        stitched = stitch(theta_ab, theta_a, stage, TransportKey("identity", 1))
        with Timer() as t:
            key = train_stitch(stitched, u, xa, ya, steps, cfg.stitch_lr, cfg.stitch_batch, seed=0)
        record(variant, key, t.seconds)
    return rows


def _noise_at_residual(theta_a, stage: str, v, residual: float, test) -> dict:
    """The ``noise_at_residual`` row (docs/benchmarks.md); ``v``: θ_A's anchor activations."""
    xte, yte = test
    with torch.no_grad():
        h = stage_activations(theta_a, stage, xte)
        scale = (residual * (v - v.mean(0)).pow(2).mean()).sqrt()
        noisy = h + scale * torch.randn(h.shape, generator=torch.Generator().manual_seed(0))
    own = stitch(theta_a, theta_a, stage, TransportKey("identity", 1))
    acc = batched_accuracy(lambda z, x: own.forward_from_stage(z, x), noisy, xte, targets=yte, batch_size=500)
    return {"variant": "noise_at_residual", "acc": acc, "fit_s": float("nan"), "key_params": 0, "residual": residual}


def run_job(job: Job) -> list[dict]:
    cfg = job.config
    start = time.perf_counter()
    seed_everything(job.seed)
    data = task_data(job.pair, cfg.data_root, cfg.quick, cfg.dataset)
    xtr_a, ytr_a, xtr_b, ytr_b = (t[:cfg.max_train] for t in (*data["A"][:2], *data["B"][:2]))
    xte_a, yte_a = (t[:cfg.max_test] for t in data["A"][2:])
    n_classes = int(ytr_a.max()) + 1
    trunk = build_model(job.model, tuple(xtr_a.shape[1:]), n_classes,
                        **MODEL_KWARGS.get(job.model, {}))
    trunk.head = nn.Identity()
    theta_a = TaskHeadsNet(trunk, trunk.feature_dim, n_classes, n_tasks=2)
    times = {}
    with Timer() as t:
        train_minibatches(theta_a, xtr_a, ytr_a, epochs=cfg.epochs_a, lr=cfg.lr, batch_size=cfg.batch_size,
                          generator=torch.Generator().manual_seed(job.seed), optimizer="adam", task=0)
    times["train_a_s"] = t.seconds
    theta_ab = copy.deepcopy(theta_a)
    with Timer() as t:
        train_minibatches(theta_ab, xtr_b, ytr_b, epochs=cfg.epochs_b, lr=cfg.lr, batch_size=cfg.batch_size,
                          generator=torch.Generator().manual_seed(job.seed + 1), optimizer="adam", task=1)
    times["train_b_s"] = t.seconds
    for p in [*theta_a.parameters(), *theta_ab.parameters()]:
        p.requires_grad_(False)
    acc_a, acc_ab = (stitched_accuracy(m, xte_a, yte_a, torch.zeros(len(yte_a), dtype=torch.long))
                     for m in (theta_a, theta_ab))
    # task-A views as plain chains (trunk -> head A), so stitched models run only the late part
    view_a, view_ab = nn.Sequential(theta_a.trunk, theta_a.heads[0]), nn.Sequential(theta_ab.trunk, theta_ab.heads[0])
    rows = []
    for n_anchors in cfg.anchor_counts:
        anchors = class_balanced_anchors((xtr_a, ytr_a), n_anchors, seed=job.seed)
        for stage in STAGES[job.model]:
            main = n_anchors == cfg.main_anchors
            for row in evaluate_stage(view_a, view_ab, f"0.{stage}", anchors, (xte_a, yte_a), cfg, main):
                row.update(pair=job.pair, model=job.model, seed=job.seed, stage=stage, n_anchors=n_anchors, acc_a=acc_a, acc_ab=acc_ab,
                           recovery=recovery(row["acc"], acc_ab, acc_a).value, bn_mode="eval", **times)
                rows.append(row)
    for row in rows:
        row["job_s"] = time.perf_counter() - start
    return rows


def config_for(args) -> Config:
    quick = args.quick
    sizes = {k: v for k, v in (("max_train", args.max_train), ("max_test", args.max_test)) if v is not None}
    return Config(data_root=args.data_root, quick=quick, dataset=args.dataset if args.data_root else "digits",
                  epochs_b=3 if quick else 2, anchor_counts=(10, 100) if quick else (10, 50, 100, 500), **sizes)


def tables(rows: list[dict], main_anchors: int) -> str:
    main = [r for r in rows if r["n_anchors"] == main_anchors]
    sweep = [r for r in rows if "/" not in r["variant"]]
    specs = [("Task-A accuracy of θ_A and θ_AB (eval-mode BatchNorm)", main,
              ["pair", "model", "stage"], ["acc_a", "acc_ab"]),
             (f"Stitched task-A accuracy and recovery, {main_anchors} anchors", main,
              ["pair", "model", "stage", "variant"], ["acc", "recovery", "residual", "fit_s"]),
             ("Anchor-count sweep: recovery, mean ± std over seeds and stages", sweep,
              ["pair", "model", "variant", "n_anchors"], ["recovery"])]
    return "\n\n".join(f"{title}\n" + format_table(summarize(selected, keys, values), keys, values)
                       for title, selected, keys, values in specs)


REPORT_VARIANTS = ("identity", "channel", "cross_channel", "cross_channel+refine", "cross_channel+gauss_newton",
                   "trained_stitch_short", "trained_stitch", "noise_at_residual")


def docs_tables(rows: list[dict], main_anchors: int) -> str:
    """The tables quoted in docs/RESULTS.md (what each holds: docs/benchmarks.md)."""
    main = [r for r in rows if r["n_anchors"] == main_anchors]
    cells = list(dict.fromkeys((r["pair"], r["model"], r["stage"]) for r in main))

    def mean(cell, variant, field):
        xs = [r[field] for r in main if (r["pair"], r["model"], r["stage"]) == cell and r["variant"] == variant]
        return float(np.mean(xs)) if xs else float("nan")

    def acc_cell(cell, variant):
        return f"{mean(cell, variant, 'acc'):.3f} ({100 * mean(cell, variant, 'recovery'):.0f}%)"

    lines = ["| pair | model | stage | acc_A(θ_A) | acc_A(θ_AB) | " + " | ".join(REPORT_VARIANTS)
             + " | cross-ch. residual | trained / cross-ch. time | trained / Gauss–Newton time |",
             "|" + "---|" * (len(REPORT_VARIANTS) + 8)]
    for cell in cells:
        trained = mean(cell, "trained_stitch", "fit_s")
        lines.append(f"| {' | '.join(cell)} | {mean(cell, 'identity', 'acc_a'):.2f} | {mean(cell, 'identity', 'acc_ab'):.2f} | "
                     + " | ".join(acc_cell(cell, v) for v in REPORT_VARIANTS)
                     + f" | {mean(cell, 'cross_channel', 'residual'):.2f}"
                     + f" | {trained / mean(cell, 'cross_channel', 'fit_s'):.0f}×"
                     + f" | {trained / mean(cell, 'cross_channel+gauss_newton', 'fit_s'):.1f}× |")
    controls = [f"cross_channel/{c}" for c in CONTROLS]
    lines += ["", "| pair | model | stage | " + " | ".join(CONTROLS) + " |", "|" + "---|" * (len(CONTROLS) + 3)]
    for cell in cells:
        lines.append(f"| {' | '.join(cell)} | " + " | ".join(acc_cell(cell, v) for v in controls) + " |")
    counts = sorted({r["n_anchors"] for r in rows})
    lines += ["", "| pair | model | key | " + " | ".join(str(n) for n in counts) + " |",
              "|" + "---|" * (len(counts) + 3)]
    for pair, model in dict.fromkeys((r["pair"], r["model"]) for r in rows):
        for variant in ("cross_channel", "cross_channel+gauss_newton", "trained_stitch"):
            rec = [np.mean([r["recovery"] for r in rows if (r["pair"], r["model"], r["variant"], r["n_anchors"])
                            == (pair, model, variant, n)] or [np.nan]) for n in counts]
            lines.append(f"| {pair} | {model} | {variant} | " + " | ".join(f"{100 * x:.0f}%" for x in rec) + " |")
    ratios = time_ratios(rows, main_anchors)
    short_behind = sum(mean(c, "trained_stitch_short", "recovery") < mean(c, "cross_channel", "recovery") for c in cells)
    gaps = [100 * (mean(c, "trained_stitch", "recovery") - mean(c, "cross_channel+gauss_newton", "recovery"))
            for c in cells]
    lines += ["", f"Cost, all models: trained stitch {ratios['trained_stitch_s']:.2f} s, cross-channel "
              f"{ratios['cross_channel_s']:.3f} s ({ratios['trained_over_cross_channel']:.0f}×), Gauss–Newton "
              f"{ratios['gauss_newton_s']:.2f} s ({ratios['trained_over_gauss_newton']:.1f}×), Adam refinement "
              f"{ratios['cross_channel_refine_s']:.2f} s ({ratios['trained_over_refined']:.1f}×).",
              f"The 2-step trained stitch recovers less than the closed form on {short_behind} of {len(cells)} stages; "
              f"the trained stitch is {min(gaps):.0f} to {max(gaps):.0f} points above Gauss–Newton."]
    return "\n".join(lines)


def time_ratios(rows: list[dict], main_anchors: int) -> dict:
    """The time ratios of the report (docs/benchmarks.md, "benchmarks.transport_keys")."""
    def ratios(selected):
        def mean_time(variant):
            xs = [r["fit_s"] for r in selected if r["variant"] == variant]
            return float(np.mean(xs)) if xs else float("nan")

        trained, cross, channel, refined, newton = (mean_time(v) for v in (
            "trained_stitch", "cross_channel", "channel", "cross_channel+refine", "cross_channel+gauss_newton"))
        return {"trained_stitch_s": trained, "cross_channel_s": cross, "channel_s": channel,
                "cross_channel_refine_s": refined, "trained_over_cross_channel": trained / cross,
                "trained_over_channel": trained / channel, "trained_over_refined": trained / refined,
                "gauss_newton_s": newton, "trained_over_gauss_newton": trained / newton}

    main = [r for r in rows if r["n_anchors"] == main_anchors]
    out = ratios(main)
    out["per_model"] = {f"{p}/{m}": ratios([r for r in main if (r["pair"], r["model"]) == (p, m)])
                        for p, m in dict.fromkeys((r["pair"], r["model"]) for r in main)}
    return out


def plot(rows: list[dict], out: Path, main_anchors: int) -> None:
    variants = [v for v in REPORT_VARIANTS
                if v not in ("trained_stitch_short", "noise_at_residual")]
    combos = sorted({(r["pair"], r["model"]) for r in rows})
    main = [r for r in rows if r["n_anchors"] == main_anchors]
    size = (3.2 * len(combos), 3)
    with saved_figure(out / "recovery.png", 1, len(combos), figsize=size, dpi=120) as (_, axes):
        for ax, (pair, model) in zip(axes[0], combos):
            stages = STAGES[model]
            ours = [r for r in main if (r["pair"], r["model"]) == (pair, model)]
            for variant in variants:
                cell = [r for r in ours if r["variant"] == variant]
                ys = [np.nanmean([r["recovery"] for r in cell if r["stage"] == s] or [np.nan])
                      for s in stages]
                ax.plot(range(len(stages)), ys, marker="o", label=variant)
            ax.set_xticks(range(len(stages)), stages, rotation=30, fontsize=7)
            ax.set_title(f"{pair} / {model}", fontsize=9)
            ax.axhline(1.0, color="gray", lw=0.5)
            ax.set_ylabel("recovery")
        axes[0][0].legend(fontsize=6)


def report(saved: dict) -> str:
    """Every table of a saved run: the summaries, the docs tables and the time ratios."""
    rows, main_anchors = saved["runs"], saved["config"]["main_anchors"]
    return (tables(rows, main_anchors) + "\n\n" + docs_tables(rows, main_anchors)
            + "\n\nTime ratios: " + json.dumps(time_ratios(rows, main_anchors), indent=1))


def main(argv=None) -> dict:
    parser = benchmark_parser("transport_keys", __doc__.splitlines()[0],
                              skip_help="PAIR/MODEL cells (e.g. domain/resnet) or a pair")
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--pairs", default=None, help=f"comma-separated subset of {','.join(PAIRS)}")
    parser.add_argument("--dataset", choices=tuple(DATASETS), default="mnist",
                        help="the images under --data-root (MNIST/raw or FashionMNIST/raw); digits without it")
    parser.add_argument("--max-train", type=int, default=None, help="training images per task (default 4000)")
    parser.add_argument("--max-test", type=int, default=None, help="task-A test images (default 500)")
    args = parse_args(parser, argv)
    if args.report:
        return {"report": print_report(args.report, report)}
    models = subset_of(parser, "--models", args.models, MODELS, ["cnn"] if args.quick else MODELS)
    pairs = subset_of(parser, "--pairs", args.pairs, PAIRS, ["split"] if args.quick else PAIRS)
    cfg = config_for(args)
    jobs = [Job(p, m, s, cfg) for p in pairs for m in models if not is_skipped(args.skip, p, m)
            for s in range(args.seeds)]
    start = time.perf_counter()
    per_job = run_cached(args, run_job, jobs, "transport keys")
    rows = [r for job_rows in per_job for r in job_rows]
    ratios = time_ratios(rows, cfg.main_anchors)
    summary = summarize(rows, ["pair", "model", "stage", "n_anchors", "variant"],
                        ["acc", "recovery", "residual", "fit_s", "key_params"])
    out = write_results(args.out, args, config=asdict(cfg), rows=rows, summary=summary,
                        wall_seconds=time.perf_counter() - start, extra={"time_ratios": ratios, "bn_mode": "eval"})
    plot(rows, out, cfg.main_anchors)
    text = print_report(out / "results.json", report, out_dir=out)
    return {"rows": rows, "time_ratios": ratios, "report": text}


if __name__ == "__main__":
    main()
