"""Layer-adaptive EWC on a pretrained backbone: does pretraining make curvature depth-dependent?

Method, outputs and ``--report``: docs/benchmarks.md, "benchmarks.lae_pretrained".
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from avalanche_plugins.study.catalog.datasets import (
    VALIDATION_FRACTION,
    _stratified_split,
    load_mnist_arrays,
)
from avalanche_plugins.study.catalog.zoo import build_model
from avalanche_plugins.study.jobs import Timer, seed_everything
from avalanche_plugins.study.jobs.environment import quiet_deprecations
from avalanche_plugins.study.jobs.protocol import TUNE_SEED, select_best, split_list
from avalanche_plugins.study.report.files import print_report
from benchmarks._cli import benchmark_parser, make_executor, parse_args, run_cached, subset_of
from benchmarks._results import format_table, summarize, write_results
from benchmarks._training import accuracy_evaluator

METHODS = ("naive", "ewc", "lae_geometric", "lae_measured", "lae_smoothed")
SCENARIOS = ("task", "class")  # task- or class-incremental
FAILED = {"acc": float("nan"), "acc_pretrain_classes": float("nan"), "forgetting": float("nan")}
_ACC = re.compile(r"^Top1_Acc_Exp/eval_phase/test_stream/(?:Task\d+/)?Exp(\d+)$")


@dataclass(frozen=True)
class Job:
    kind: str  # "profile" | "run"
    scenario: str  # "task" | "class"
    seed: int
    validation: bool = False
    method: str = "naive"
    ewc_lambda: float = 0.0
    alpha: float | None = None
    widths: tuple[int, ...] = (8, 16, 32, 64)
    pretrain_epochs: int = 15
    epochs: int = 2
    data_root: str | None = None
    out: str = "out/lae_pretrained"
    replay: int = 0  # ReplayPlugin memory (samples) beside every method; 0: none


def make_benchmark(data_root, task_incremental: bool, validation: bool):
    """Classes 0–4 (pretraining), then {5, 6}, then {7, 8, 9}; fixed class order."""
    from avalanche.benchmarks import nc_benchmark

    xtr, ytr, xte, yte = load_mnist_arrays(data_root)
    if validation:  # the study's stratified split at seed 0
        keep, held = _stratified_split(ytr.numpy(), VALIDATION_FRACTION, 0)
        xtr, ytr, xte, yte = xtr[keep], ytr[keep], xtr[held], ytr[held]
    return nc_benchmark(TensorDataset(xtr, ytr), TensorDataset(xte, yte), n_experiences=3,
                        task_labels=task_incremental, fixed_class_order=list(range(10)),
                        per_exp_classes={0: 5, 1: 2}, class_ids_from_zero_in_each_exp=task_incremental,
                        class_ids_from_zero_from_first_exp=not task_incremental)


def sgd_naive(model, plugins, epochs: int, lr: float, *, batch: int = 64, eval_batch: int = 512,
              evaluator=None):
    """Avalanche ``Naive`` on the CPU: SGD at ``lr`` with momentum 0.9, cross-entropy
    (``evaluator``: :func:`accuracy_evaluator` when None)."""
    from avalanche.training.supervised import Naive

    return Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                 criterion=nn.CrossEntropyLoss(), train_mb_size=batch, train_epochs=epochs,
                 eval_mb_size=eval_batch, device="cpu", plugins=list(plugins),
                 evaluator=accuracy_evaluator() if evaluator is None else evaluator)


def _model(job: Job):
    return build_model("cnn", (1, 28, 28), 10, multihead=job.scenario == "task", widths=job.widths)


def dataset_samples(dataset, n: int, seed: int, *, sort: bool = True) -> list[torch.Tensor]:
    """``n`` seeded random items of an Avalanche dataset as tensors: the inputs stacked, then each
    label field (targets, task labels) as integers; in index order unless ``sort`` is False."""
    idx = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:n]
    items = [dataset[i] for i in (idx.sort().values if sort else idx).tolist()]
    labels = [torch.as_tensor([int(it[k]) for it in items]) for k in range(1, len(items[0]))]
    return [torch.stack([it[0] for it in items]), *labels]


def _profile(model, experience, multihead: bool, seed: int) -> dict:
    """Hessian-block top eigenvalues per layer (256 samples), κ and α̂."""
    from avalanche_plugins.layer_adaptive import layer_top_eigenvalues
    from avalanche_plugins.layer_adaptive.profile import layer_profile

    x, y, t = dataset_samples(experience.dataset.eval(), 256, seed)
    spectrum = layer_top_eigenvalues(model, nn.CrossEntropyLoss(), x, y, max_iter=100, tol=1e-3,
                                     seed=seed, task_labels=t if multihead else None)
    prof = layer_profile(0, spectrum)
    return {"layers": list(prof.layer_names), "s": [float(v) for v in spectrum.top], "kappa": None if prof.kappa is None else float(prof.kappa),
            "alpha_hat": None if prof.alpha_hat is None else float(prof.alpha_hat)}


def _eval(strategy, benchmark) -> dict[int, float]:
    metrics = strategy.eval(benchmark.test_stream, num_workers=0)
    return {int(m.group(1)): v for k, v in metrics.items() if (m := _ACC.match(k))}


def pretrained(job: Job, benchmark) -> tuple[Path, dict]:
    """``(weights file, profiles)`` of the pretraining on experience 0 (no profiles when cached)."""
    path = Path(job.out) / "pretrained" / (f"{job.scenario}_s{job.seed}_{'val' if job.validation else 'test'}"
                                           f"_w{'-'.join(map(str, job.widths))}_e{job.pretrain_epochs}.pt")
    if path.exists():
        return path, {}
    seed_everything(job.seed)
    model = _model(job)
    strategy = sgd_naive(model, [], 1, lr=0.05)
    first = benchmark.train_stream[0]
    with quiet_deprecations():
        strategy.train(first, num_workers=0)
        info = {"one_epoch": _profile(model, first, job.scenario == "task", job.seed),
                "one_epoch_acc": _eval(strategy, benchmark).get(0)}
        strategy.train_epochs = job.pretrain_epochs - 3
        strategy.train(first, num_workers=0)
        for group in strategy.optimizer.param_groups:  # two final epochs at a tenth of the lr: converge
            group["lr"] = 0.005
        strategy.train_epochs = 2
        strategy.train(first, num_workers=0)
    info["pretrained"] = _profile(model, first, job.scenario == "task", job.seed)
    info["pretrained_acc"] = _eval(strategy, benchmark).get(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return path, info


def _load_plugin(path):
    """A plugin that loads the pretrained weights after the model adaptation of experience 0."""
    from avalanche.core import SupervisedPlugin

    def load(plugin, strategy, **kwargs):
        if strategy.clock.train_exp_counter == 0:
            own = strategy.model.state_dict()  # the heads of later tasks (made by evaluations) are not loaded
            saved = {k: v for k, v in torch.load(path).items() if k in own}
            strategy.model.load_state_dict(saved, strict=False)

    return type("LoadPretrained", (SupervisedPlugin,), {"before_training_exp": load})()


def plugins_for(job: Job) -> list:
    from avalanche.training.plugins import EWCPlugin, ReplayPlugin

    from avalanche_plugins import LayerAdaptiveEWCPlugin

    memory = [ReplayPlugin(mem_size=job.replay)] if job.replay else []
    if job.method == "naive":
        return memory
    if job.method == "ewc":
        return [EWCPlugin(ewc_lambda=job.ewc_lambda), *memory]
    return [LayerAdaptiveEWCPlugin(job.ewc_lambda, schedule=job.method[4:], alpha=job.alpha or 2.0,
                                   curvature="fisher", seed=job.seed), *memory]


def _profile_row(job: Job, benchmark, path: Path, info: dict, fields: dict) -> dict:
    if not info:  # weights were cached by an earlier run: re-measure the pretrained profile
        model = _model(job)
        strategy = sgd_naive(model, [_load_plugin(path)], 0, lr=0.01)
        with quiet_deprecations():
            strategy.train(benchmark.train_stream[0], num_workers=0)
        profile = _profile(model, benchmark.train_stream[0], job.scenario == "task", job.seed)
        info = {"pretrained": profile, "pretrained_acc": _eval(strategy, benchmark).get(0)}
    p = info["pretrained"]
    print(f"profile {job.scenario} seed {job.seed} val={job.validation}: pretrained acc "
          f"{info['pretrained_acc']:.3f} κ {p['kappa']:.1f} α̂ {p['alpha_hat']}", flush=True)
    return {**fields, **info}


def run_job(job: Job) -> dict:
    benchmark = make_benchmark(job.data_root, job.scenario == "task", job.validation)
    path, info = pretrained(job, benchmark)
    fields = {k: v for k, v in asdict(job).items() if k not in ("data_root", "out")}
    if job.kind == "profile":
        return _profile_row(job, benchmark, path, info, fields)
    seed_everything(job.seed)
    model = _model(job)
    plugins = plugins_for(job)
    strategy = sgd_naive(model, [_load_plugin(path), *plugins], 0, lr=0.01)
    n = len(benchmark.train_stream)
    acc = np.full((n, n), np.nan)
    try:
        with Timer() as timer, quiet_deprecations():
            for i, experience in enumerate(benchmark.train_stream):
                strategy.train_epochs = 0 if i == 0 else job.epochs
                strategy.train(experience, num_workers=0)
                for j, v in _eval(strategy, benchmark).items():
                    acc[i, j] = v
    except ValueError as error:  # a λ too large diverges (NaN loss): a grid outcome
        return {**fields, **FAILED, "error": str(error)}
    if not np.isfinite(acc[-1]).all() or any(not torch.isfinite(p).all() for p in model.parameters()):
        return {**fields, **FAILED, "error": "non-finite weights"}
    row = {**fields, "acc": float(np.mean(acc[-1])), "acc_pretrain_classes": float(acc[-1, 0]),
           "forgetting": float(np.mean([np.max(acc[j:n - 1, j]) - acc[n - 1, j] for j in range(n - 1)])),
           "accuracy_matrix": acc.tolist(), "wall_s": timer.seconds}
    profiles = [p for p in plugins if hasattr(p, "profiles")]
    if profiles and profiles[0].profiles:
        row["lambdas"] = profiles[0].lambdas
    print(f"{job.scenario} {job.method:<14} λ={job.ewc_lambda:g} α={job.alpha} seed {job.seed} "
          f"val={job.validation}: ACC {row['acc']:.3f} pretrain-classes {row['acc_pretrain_classes']:.3f} "
          f"({timer.seconds:.0f}s)", flush=True)
    return row


def report(saved: dict) -> str:
    lines = []
    prof = [r for r in saved["runs"] if r["kind"] == "profile" and not r["validation"]]
    if prof:
        lines += ["Per-layer top Hessian eigenvalue s_ℓ before the stream (test-split runs, mean over seeds)",
                  "| scenario | network | acc (classes 0–4) | s_ℓ per layer | κ | α̂ | n |", "|---|---|---|---|---|---|---|"]
        for sc in dict.fromkeys(r["scenario"] for r in prof):
            for key, acc_key in (("one_epoch", "one_epoch_acc"), ("pretrained", "pretrained_acc")):
                rs = [r for r in prof if r["scenario"] == sc and key in r]
                if not rs:
                    continue
                s = np.mean([r[key]["s"] for r in rs], axis=0)
                kap = [r[key]["kappa"] for r in rs]
                ah = [r[key]["alpha_hat"] for r in rs if r[key]["alpha_hat"] is not None]
                lines.append(f"| {sc} | {key.replace('_', ' ')} | {np.mean([r[acc_key] for r in rs]):.3f} | "
                             + ", ".join(f"{v:.3g}" for v in s) + f" | {np.mean(kap):.1f} ({min(kap):.1f}–{max(kap):.1f}) | "
                             + (f"{np.mean(ah):.2f}" if ah else "–") + f" | {len(rs)} |")
    lines += ["", format_table(saved["summary"], ["scenario", "method", "ewc_lambda", "alpha"],
                               ["acc", "acc_pretrain_classes", "forgetting"])]
    lines += ["", "Paired over seeds: each schedule − uniform EWC (final ACC; scipy paired t-test)",
              "| scenario | method | ΔACC mean | seeds higher | t-test p | Δ pretrain-classes acc |", "|---|---|---|---|---|---|"]
    lines += [paired_line(saved["runs"], sc, m) for sc in dict.fromkeys(s["scenario"] for s in saved["summary"])
              for m in METHODS if m != "ewc"]
    return "\n".join(lines)


def paired_line(rows, scenario, method) -> str:
    from scipy import stats

    test = [r for r in rows if r["kind"] == "run" and not r["validation"] and r["scenario"] == scenario]
    base = {r["seed"]: r for r in test if r["method"] == "ewc"}
    other = {r["seed"]: r for r in test if r["method"] == method}
    seeds = sorted(set(base) & set(other))
    d = np.array([other[s]["acc"] - base[s]["acc"] for s in seeds])
    dp = np.array([other[s]["acc_pretrain_classes"] - base[s]["acc_pretrain_classes"] for s in seeds])
    if len(d) < 2 or not np.isfinite(d).all():
        return f"| {scenario} | {method} | – | – | – | – |"
    p = stats.ttest_rel([other[s]["acc"] for s in seeds], [base[s]["acc"] for s in seeds]).pvalue
    return (f"| {scenario} | {method} | {d.mean():+.4f} | {int((d > 0).sum())}/{len(d)} | {p:.3f} | "
            f"{dp.mean():+.4f} |")


def main(argv=None) -> dict:
    parser = benchmark_parser("lae_pretrained", __doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="task,class", help="task and/or class (incremental)")
    parser.add_argument("--lambdas", default="1,10,100,1000")
    parser.add_argument("--alphas", default="0.5,2,4", help="α grid of the geometric schedule")
    parser.add_argument("--widths", default="8,16,32,64")
    parser.add_argument("--pretrain-epochs", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per later experience")
    parser.add_argument("--replay", type=int, default=0, metavar="N",
                        help="replay memory (samples) beside every method, so class-incremental is not "
                             "decided by the head alone (default 0: none)")
    args = parse_args(parser, argv, unused=("skip",))
    if args.replay < 0:
        parser.error(f"--replay must be a number of samples >= 0, got {args.replay}")
    if args.report:
        return {"report": print_report(args.report, report)}
    scenarios = subset_of(parser, "--scenarios", args.scenarios, SCENARIOS)
    lambdas, alphas = ([float(v) for v in split_list(grid)] for grid in (args.lambdas, args.alphas))
    if args.quick:
        scenarios, lambdas, alphas = scenarios[:1], lambdas[1:3], alphas[1:2]
        args.pretrain_epochs, args.epochs = min(args.pretrain_epochs, 4), 1
    common = dict(widths=tuple(int(v) for v in split_list(args.widths)), pretrain_epochs=args.pretrain_epochs,
                  epochs=args.epochs, data_root=args.data_root, out=args.out, replay=args.replay)
    seeds = list(range(args.seeds))
    executor = make_executor(args)
    start = time.perf_counter()
    tune_jobs = [Job("profile", sc, TUNE_SEED, True, **common) for sc in scenarios]
    tune_jobs += [Job("run", sc, TUNE_SEED, True, m, lam, a, **common) for sc in scenarios
                  for m in METHODS[1:] for lam in lambdas
                  for a in (alphas if m == "lae_geometric" else [None])]
    tuning = run_cached(args, run_job, tune_jobs, "tuning (validation)", executor=executor)
    best = select_best([r for r in tuning if r["kind"] == "run"], lambda r: (r["scenario"], r["method"]))
    test_jobs = [Job("profile", sc, s, False, **common) for sc in scenarios for s in seeds]
    for sc in scenarios:
        for m in METHODS:
            if m != "naive" and (sc, m) not in best:
                print(f"{sc}/{m}: every tuned setting diverged; not run", flush=True)
                continue
            lam, a = (0.0, None) if m == "naive" else (best[(sc, m)]["ewc_lambda"], best[(sc, m)]["alpha"])
            test_jobs += [Job("run", sc, s, False, m, lam, a, **common) for s in seeds]
    test = run_cached(args, run_job, test_jobs, "test", executor=executor)
    rows = tuning + test
    wall = time.perf_counter() - start
    runs = [r for r in test if r["kind"] == "run"]
    summary = summarize(runs, ["scenario", "method", "ewc_lambda", "alpha"], ["acc", "acc_pretrain_classes", "forgetting"])
    out = write_results(args.out, args, config={"args": vars(args), "scenarios": scenarios, "lambdas": lambdas,
                                                "alphas": alphas, **{k: v for k, v in common.items() if k != "out"}},
                        rows=rows, summary=summary, wall_seconds=wall,
                        extra={"chosen": {f"{k[0]}/{k[1]}": {"ewc_lambda": v["ewc_lambda"], "alpha": v["alpha"],
                                                              "val_acc": v["acc"]} for k, v in best.items()}})
    text = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, results.csv, report.md ({wall:.0f}s)")
    return {"rows": rows, "summary": summary, "report": text, "out": out}


if __name__ == "__main__":
    main()
