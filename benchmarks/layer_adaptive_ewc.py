"""Layer-adaptive EWC vs Avalanche's EWC at a matched tuning budget.

Methods: Naive, Avalanche ``EWCPlugin``, ``LayerAdaptiveEWCPlugin`` with the uniform, geometric
(α grid), measured and smoothed schedules, and EWC + Replay. Every EWC variant gets the same λ
grid, chosen on a validation split (held out from the training images) with seed 0; the chosen
settings then run on the test stream with ``--seeds`` seeds. ``lae_uniform`` is identical to
``ewc`` by construction (tested), so it reuses EWC's λ.

Scenarios (MNIST from ``--data-root``; scikit-learn digits when absent): Permuted (domain-
incremental, shared head), Split task-incremental (multi-head) and Split class-incremental,
each with an MLP and a small CNN. Also reported: the measured κ and α̂ of the per-layer Hessian
spectrum, two cost ratios (penalty time per iteration vs ``EWCPlugin``; the whole spectrum vs one
training epoch), and the continual-learning-baselines anchor (Avalanche EWC, 784-512-10,
SGD 0.001, 10 epochs, batch 256, λ=1 on Permuted MNIST) run on the same data.

Method: "Layers Matter" (Moser et al., 2026): λ_ℓ ∝ the top Hessian eigenvalue s_ℓ of layer ℓ, or
its geometric proxy λ_ℓ = c / α^(ℓ−1). Every run is one job of the shared executor
(:mod:`avalanche_plugins.study.harness.jobs`; resumable, ``--workers N``).
"""

from __future__ import annotations

import itertools
import time
import types
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from avalanche_plugins.layer_adaptive import layer_curvature, layer_top_eigenvalues
from avalanche_plugins.study.harness.data import make_stream
from avalanche_plugins.study.harness.jobs import Timer, run_jobs, seed_everything, torch_threads
from avalanche_plugins.study.harness.models import build_model
from avalanche_plugins.study.harness.protocol import TUNE_SEED, expand_grid, select_best
from avalanche_plugins.study.harness.results import (
    format_table,
    print_report,
    summarize,
    write_results,
)
from avalanche_plugins.study.harness.training import TrainConfig, accuracy_evaluator, run_strategy
from benchmarks._cli import (
    benchmark_parser,
    is_skipped,
    make_executor,
    parse_args,
    split_list,
)

ANCHOR = "anchor_permuted"
LAMBDA_METHODS = ("ewc", "lae_geometric", "lae_measured", "lae_smoothed", "ewc_replay")
METHODS = ("naive", "ewc", "lae_uniform", "lae_geometric", "lae_measured", "lae_smoothed", "ewc_replay")


@dataclass(frozen=True)
class Job:
    scenario_name: str
    model: str
    method: str
    seed: int
    validation: bool
    ewc_lambda: float = 0.0
    alpha: float | None = None
    data_root: str | None = None
    quick: bool = False


def plugins_for(method: str, cfg: TrainConfig) -> list:
    from avalanche.training.plugins import EWCPlugin, ReplayPlugin

    from avalanche_plugins import LayerAdaptiveEWCPlugin

    lam, extra = cfg.ewc_lambda, cfg.extra
    if method == "naive":
        return []
    if method == "ewc":
        return [EWCPlugin(ewc_lambda=lam)]
    if method == "ewc_replay":
        return [ReplayPlugin(mem_size=cfg.replay_mem), EWCPlugin(ewc_lambda=lam)]
    if method.startswith("lae_"):
        schedule = method[4:]
        return [LayerAdaptiveEWCPlugin(lam, schedule=schedule, alpha=extra.get("alpha") or 2.0,
                                       spectrum_samples=extra.get("spectrum_samples", 256),
                                       curvature=extra.get("curvature", "hessian"))]
    raise ValueError(f"unknown method {method!r}")


def scenario_config(name: str, model: str, data_root, quick: bool) -> TrainConfig:
    """Training settings per scenario (MNIST subset when ``data_root``, digits otherwise)."""
    mnist = data_root is not None
    base = dict(dataset="mnist" if mnist else "digits", data_root=data_root, model=model,
                hidden=(256, 256) if mnist else (128, 128), model_kwargs={"widths": (16, 32)},
                momentum=0.9, lr=0.01, batch_size=64, replay_mem=200)
    epochs = 1 if quick else 2
    if name == "permuted":  # 8,000 images per experience: one epoch each
        return TrainConfig(scenario="permuted", n_experiences=3 if quick else 5, epochs=1, **base)
    if name == "split_task":
        return TrainConfig(scenario="split", task_incremental=True, epochs=epochs, **base)
    if name == "split_class":
        return TrainConfig(scenario="split", task_incremental=False, epochs=epochs, **base)
    if name == ANCHOR:  # continual-learning-baselines' Permuted MNIST EWC configuration
        return TrainConfig(dataset=base["dataset"], data_root=data_root, scenario="permuted",
                           n_experiences=3 if quick else 10, model="mlp", hidden=(512,), lr=0.001, momentum=0.0,
                           epochs=1 if quick else 10, batch_size=256, ewc_lambda=1.0)
    raise ValueError(f"unknown scenario {name!r}")


def run_job(job: Job) -> dict:
    cfg = scenario_config(job.scenario_name, job.model, job.data_root, job.quick)
    cfg = replace(cfg, ewc_lambda=job.ewc_lambda, validation=job.validation,
                  # the quoted runs measure the exact Hessian blocks; the Fisher blocks (the plugin's
                  # default) are compared with them in benchmarks.curvature_agreement
                  extra={"alpha": job.alpha, "spectrum_samples": 128 if job.quick else 256, "curvature": "hessian"})
    try:
        row = run_strategy(plugins_for, job.method, cfg, job.seed, keep_strategy=True, progress=False)
    except ValueError as error:  # a λ too large for the learning rate diverges (NaN loss): a grid outcome
        return {**_job_fields(job), "acc": float("nan"), "forgetting": float("nan"), "wall_s": float("nan"),
                "error": str(error)}
    strategy = row.pop("strategy_object")
    row.update(_job_fields(job))
    profiles = [p for p in strategy.plugins if hasattr(p, "profiles")]
    if profiles and profiles[0].profiles and profiles[0].profiles[-1].spectrum is not None:
        recs = profiles[0].profiles
        row["kappa"] = float(np.mean([r.kappa for r in recs]))
        row["alpha_hat"] = float(np.mean([r.alpha_hat for r in recs if r.alpha_hat is not None]))
        row["spectrum"] = [r.spectrum for r in recs]
        row["spectrum_s"] = float(np.mean([r.seconds.get("spectrum", 0.0) for r in recs]))
    return row


def _job_fields(job: Job) -> dict:
    """The job's identity in its row (the data root and quick flag are in the config)."""
    fields = asdict(job)
    del fields["data_root"], fields["quick"]
    return fields


def cells(scenarios, models, args) -> list[tuple[str, str]]:
    return [c for c in itertools.product(scenarios, models) if not is_skipped(args.skip, *c)]


def _run(jobs: list[Job], args, desc: str) -> list[dict]:
    return run_jobs(run_job, jobs, cache=f"{args.out}/jobs.jsonl", executor=make_executor(args),
                    desc=desc, progress=not args.no_progress)


def tune(scenarios, models, args) -> tuple[dict, list[dict]]:
    """Pick λ (and α for geometric) per (scenario, model, method) on the validation split, seed 0."""
    jobs = []
    for scenario, model in cells(scenarios, models, args):
        for method in LAMBDA_METHODS:
            grid = {"ewc_lambda": args.lambdas, "alpha": args.alphas if method == "lae_geometric" else [None]}
            for setting in expand_grid(grid):
                jobs.append(Job(scenario, model, method, TUNE_SEED, True, setting["ewc_lambda"], setting["alpha"],
                                args.data_root, args.quick))
    rows = _run(jobs, args, "tuning (validation)")
    best = select_best(rows, lambda r: (r["scenario_name"], r["model"], r["method"]))  # diverged settings never win
    chosen = {k: {"ewc_lambda": v["ewc_lambda"], "alpha": v["alpha"], "val_acc": v["acc"]} for k, v in best.items()}
    for scenario, model in cells(scenarios, models, args):  # identical to EWC by construction
        chosen[(scenario, model, "lae_uniform")] = dict(chosen[(scenario, model, "ewc")])
    return chosen, rows


def penalty_cost_ratio(data_root, n_reps: int = 300) -> dict:
    """Time of penalty forward+backward per iteration: LayerAdaptiveEWC / Avalanche EWCPlugin,
    measured on the same model after 3 experiences (both plugins hold 3 anchors)."""
    from avalanche.training.plugins import EWCPlugin

    from avalanche_plugins import LayerAdaptiveEWCPlugin

    cfg = replace(scenario_config("permuted", "mlp", data_root, quick=True), epochs=1, ewc_lambda=1.0)
    ewc, lae = EWCPlugin(ewc_lambda=1.0), LayerAdaptiveEWCPlugin(1.0, schedule="uniform")
    row = run_strategy(lambda *_: [ewc, lae], "both", replace(cfg, n_experiences=3), 0, keep_strategy=True,
                       progress=False)
    model = row["strategy_object"].model
    times = {"ewc": [], "lae": []}
    for _ in range(n_reps):
        for name, plugin in (("ewc", ewc), ("lae", lae)):
            fake = types.SimpleNamespace(clock=types.SimpleNamespace(train_exp_counter=3), model=model,
                                         device="cpu", loss=torch.zeros(1, requires_grad=True) * 1.0)
            start = time.perf_counter()
            plugin.before_backward(fake)
            fake.loss.sum().backward()
            times[name].append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
    ewc_t, lae_t = float(np.median(times["ewc"])), float(np.median(times["lae"]))
    return {"penalty_ms_ewc": 1e3 * ewc_t, "penalty_ms_lae": 1e3 * lae_t, "penalty_time_ratio": lae_t / ewc_t,
            "n_params": sum(p.numel() for p in model.parameters()), "anchors": 3}


def spectrum_cost_ratio(data_root) -> dict:
    """Whole per-layer spectrum (the plugin's defaults: 256 samples of the experience, power
    iteration with at most 100 iterations, tolerance 1e-3) vs one training epoch on the same
    experience."""
    from avalanche.training.supervised import Naive

    out = {}
    for model_name in ("mlp", "cnn"):
        cfg = scenario_config("permuted", model_name, data_root, quick=True)
        stream = make_stream(cfg.dataset, cfg.scenario, n_experiences=1, data_root=data_root)
        seed_everything(0)
        kwargs = {"hidden": cfg.hidden} if model_name == "mlp" else cfg.model_kwargs
        model = build_model(model_name, stream.input_shape, 10, **kwargs)
        criterion = torch.nn.CrossEntropyLoss()
        strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9),
                         criterion=criterion, train_mb_size=cfg.batch_size, train_epochs=1,
                         evaluator=accuracy_evaluator())
        experience = stream.benchmark.train_stream[0]
        with Timer() as epoch:
            strategy.train(experience)
        with Timer() as spectrum:
            x, y = _samples(experience.dataset, 256, seed=0)
            layer_top_eigenvalues(model, criterion, x, y, max_iter=100, tol=1e-3, chunk_size=None, seed=0)
        with Timer() as fisher_blocks:  # the plugin's default curvature on its default 64 samples
            layer_curvature(model, criterion, x[:64], y[:64], method="fisher", seed=0)
        out[model_name] = {"epoch_s": epoch.seconds, "spectrum_s": spectrum.seconds,
                           "spectrum_vs_epoch": spectrum.seconds / epoch.seconds,
                           "fisher_blocks_s": fisher_blocks.seconds,
                           "fisher_blocks_vs_epoch": fisher_blocks.seconds / epoch.seconds,
                           "epoch_samples": len(experience.dataset)}
    return out


def _samples(dataset, n: int, seed: int):
    """``n`` seeded random samples of an Avalanche dataset (eval transforms) as tensors."""
    data = dataset.eval() if hasattr(dataset, "eval") else dataset
    idx = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:n].sort().values.tolist()
    items = [data[i] for i in idx]
    return torch.stack([item[0] for item in items]), torch.as_tensor([int(item[1]) for item in items])


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((s["scenario_name"], s["model"]) for s in summary))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.6), squeeze=False)
    for ax, (scenario, model) in zip(axes[0], groups):
        rows = [s for s in summary if s["scenario_name"] == scenario and s["model"] == model]
        ax.bar(range(len(rows)), [r["acc_mean"] for r in rows], yerr=[r["acc_std"] for r in rows], capsize=3)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r["method"] for r in rows], rotation=60, ha="right", fontsize=8)
        lo = min(r["acc_mean"] for r in rows)
        ax.set_ylim(max(0.0, lo - 0.1), 1.0)
        ax.set_title(f"{scenario} / {model}", fontsize=9)
        ax.set_ylabel("final average accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(saved: dict) -> str:
    """Per scenario/model cell: accuracy and forgetting of every method at its chosen λ (α), the
    measured κ and α̂; the anchor; the cost ratios."""
    summary = saved["summary"]
    lines = []
    for scenario, model in dict.fromkeys((s["scenario_name"], s["model"]) for s in summary):
        part = [s for s in summary if s["scenario_name"] == scenario and s["model"] == model]
        lines += ["", f"### {scenario} / {model}", format_table(part, ["method", "ewc_lambda", "alpha"],
                                                                ["acc", "forgetting"])]
        k = [s for s in part if "kappa" in s]
        if k:
            lines.append("measured κ = " + ", ".join(f"{s['method']}: {s['kappa']:.1f} (α̂ {s['alpha_hat']:.2f})"
                                                   for s in k))
    if saved.get("anchor"):
        lines += ["", "anchor (continual-learning-baselines Permuted MNIST EWC config):",
                  format_table(saved["anchor"], ["method"], ["acc", "forgetting"])]
    if saved.get("penalty_time_ratio") is not None:
        lines += ["", f"penalty time LAE / EWCPlugin: {saved['penalty_time_ratio']:.2f}x; spectrum / epoch: "
                  + ", ".join(f"{m} {v:.2f}x" for m, v in saved["spectrum_vs_epoch_ratio"].items())]
    return "\n".join(lines).lstrip("\n")


def main(argv=None) -> dict:
    parser = benchmark_parser("layer_adaptive_ewc", __doc__.splitlines()[0],
                              skip_help="SCENARIO/MODEL cells (e.g. permuted/cnn) or a scenario; "
                                        "anchor (the continual-learning-baselines anchor); costs (the cost ratios)")
    parser.add_argument("--scenarios", default="permuted,split_task,split_class")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--lambdas", default="1,10,100,1000,10000", help="λ grid shared by every EWC variant")
    parser.add_argument("--alphas", default="0.5,2", help="α grid of the geometric schedule")
    args = parse_args(parser, argv)
    if args.report:
        return {"report": print_report(args.report, report)}
    args.lambdas = [float(v) for v in split_list(args.lambdas)]
    args.alphas = [float(v) for v in split_list(args.alphas)]
    scenarios = split_list(args.scenarios)
    models = split_list(args.models)
    if args.quick:
        scenarios, models = scenarios[:1], models[:1]
        args.lambdas = args.lambdas[2:4] if len(args.lambdas) > 3 else args.lambdas
        args.alphas = args.alphas[:2]
    seeds = list(range(args.seeds))
    with Timer() as total:
        chosen, tuning_rows = tune(scenarios, models, args)
        jobs = []
        for scenario, model in cells(scenarios, models, args):
            for method in METHODS:
                if method != "naive" and (scenario, model, method) not in chosen:
                    print(f"{scenario}/{model}/{method}: every tuned setting diverged; not run", flush=True)
                    continue
                setting = chosen.get((scenario, model, method), {"ewc_lambda": 0.0, "alpha": None})
                for seed in seeds:
                    jobs.append(Job(scenario, model, method, seed, False, setting["ewc_lambda"], setting["alpha"],
                                    args.data_root, args.quick))
        # the anchor is EWC on every seed; Naive under the same configuration on the first seed for reference
        anchor_jobs = [] if is_skipped(args.skip, "anchor") else (
            [Job(ANCHOR, "mlp", "ewc", seed, False, 1.0, None, args.data_root, args.quick) for seed in seeds]
            + [Job(ANCHOR, "mlp", "naive", seeds[0], False, 1.0, None, args.data_root, args.quick)])
        rows = _run(anchor_jobs + jobs, args, "final runs (test)")
        anchor = [r for r in rows if r["scenario_name"] == ANCHOR]
        test_rows = [r for r in rows if r["scenario_name"] != ANCHOR]
        costs = None
        if not is_skipped(args.skip, "costs"):
            with torch_threads(args.threads):
                costs = {"penalty": penalty_cost_ratio(args.data_root), "spectrum": spectrum_cost_ratio(args.data_root)}
    for r in tuning_rows:
        r["phase"] = "tune"
    for r in test_rows:
        r["phase"] = "test"
    for r in anchor:
        r["phase"] = "anchor"
    order = {m: i for i, m in enumerate(METHODS)}
    test_rows.sort(key=lambda r: (scenarios.index(r["scenario_name"]), models.index(r["model"]), order[r["method"]], r["seed"]))
    summary = summarize(test_rows, ["scenario_name", "model", "method"], ["acc", "forgetting", "wall_s"])
    for s in summary:
        setting = chosen.get((s["scenario_name"], s["model"], s["method"]))
        s["ewc_lambda"] = setting["ewc_lambda"] if setting else None
        s["alpha"] = setting["alpha"] if setting else None
        spectral = [r for r in test_rows if r["scenario_name"] == s["scenario_name"] and r["model"] == s["model"]
                    and r["method"] == s["method"] and "kappa" in r]
        if spectral:
            s["kappa"] = float(np.mean([r["kappa"] for r in spectral]))
            s["alpha_hat"] = float(np.mean([r["alpha_hat"] for r in spectral]))
    anchor_summary = summarize(anchor, ["method"], ["acc", "forgetting", "wall_s"]) if anchor else []
    results = {
        "methods": {s["scenario_name"] + "/" + s["model"] + "/" + s["method"]: s["acc_mean"] for s in summary},
        "chosen": {"/".join(k): v for k, v in chosen.items()},
        "costs": costs,
        "penalty_time_ratio": costs["penalty"]["penalty_time_ratio"] if costs else None,
        "spectrum_vs_epoch_ratio": {m: v["spectrum_vs_epoch"] for m, v in costs["spectrum"].items()} if costs else None,
        "anchor": anchor_summary,
    }
    out = write_results(args.out, args, config={"args": vars(args), "scenarios": scenarios, "models": models,
                                                "seeds": seeds, "train": {f"{s}/{m}": asdict(scenario_config(s, m, args.data_root, args.quick))
                                                                         for s in scenarios for m in models}},
                        rows=tuning_rows + test_rows + anchor, summary=summary, wall_seconds=total.seconds,
                        extra=results)
    plot(summary, out / "accuracy.png")
    results["report"] = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, results.csv, report.md, accuracy.png ({total.seconds:.0f}s)")
    return results


if __name__ == "__main__":
    main()
