"""What layer-adaptive EWC costs: penalty time per iteration against Avalanche's EWCPlugin, and the
per-layer spectrum against one training epoch.

``python -m benchmarks.lae_costs [--data-root DATA]`` writes ``results.json`` and ``report.md``
(``--report`` re-prints it); what is timed: docs/benchmarks.md, "benchmarks.lae_costs".
"""

from __future__ import annotations

import torch

from avalanche_plugins import quiet_evaluator
from avalanche_plugins.layer_adaptive import layer_curvature, layer_top_eigenvalues
from avalanche_plugins.study.catalog.datasets import make_stream
from avalanche_plugins.study.catalog.zoo import build_model
from avalanche_plugins.study.jobs import Timer, seed_everything, torch_threads
from avalanche_plugins.study.report.files import print_report
from benchmarks._cli import benchmark_parser, parse_args
from benchmarks._results import write_results
from benchmarks.lae_pretrained import dataset_samples, sgd_naive
from benchmarks.scale.measure import penalty_times

MODELS = {"mlp": lambda mnist: {"hidden": (256, 256) if mnist else (128, 128)}, "cnn": lambda mnist: {"widths": (16, 32)}}
SGD = {"lr": 0.01, "momentum": 0.9}
BATCH = 64


def _naive(model, plugins=()):
    return sgd_naive(model, plugins, 1, SGD["lr"], batch=BATCH, evaluator=quiet_evaluator())


def _model(name: str, stream, data_root):
    seed_everything(0)
    return build_model(name, stream.input_shape, stream.n_classes, **MODELS[name](data_root is not None))


def penalty_cost(data_root, repetitions: int = 300) -> dict:
    """Median time of the penalty's forward + backward: LayerAdaptiveEWC / EWCPlugin, both holding
    the anchors of the same 3 experiences."""
    from avalanche.training.plugins import EWCPlugin

    from avalanche_plugins import LayerAdaptiveEWCPlugin

    dataset = "mnist" if data_root else "digits"
    stream = make_stream(dataset, "permuted", n_experiences=3, data_root=data_root, seed=0)
    model = _model("mlp", stream, data_root)
    ewc, lae = EWCPlugin(ewc_lambda=1.0), LayerAdaptiveEWCPlugin(1.0, schedule="uniform")
    strategy = _naive(model, [ewc, lae])
    for experience in stream.benchmark.train_stream:
        strategy.train(experience, num_workers=0)
    ewc_s, lae_s = penalty_times(model, ewc, lae, anchors=3, repetitions=repetitions)
    return {"penalty_ms_ewc": 1e3 * ewc_s, "penalty_ms_lae": 1e3 * lae_s, "penalty_time_ratio": lae_s / ewc_s,
            "n_params": sum(p.numel() for p in model.parameters()), "anchors": 3}


def spectrum_cost(data_root, model_name: str) -> dict:
    """One training epoch, the exact per-layer spectrum (256 samples) and the Fisher blocks (64
    samples) on the same experience and model."""
    dataset = "mnist" if data_root else "digits"
    stream = make_stream(dataset, "permuted", n_experiences=1, data_root=data_root, seed=0)
    model = _model(model_name, stream, data_root)
    experience = stream.benchmark.train_stream[0]
    strategy = _naive(model)
    with Timer() as epoch:
        strategy.train(experience, num_workers=0)
    x, y, _ = dataset_samples(experience.dataset.eval(), 256, seed=0)
    criterion = torch.nn.CrossEntropyLoss()
    with Timer() as spectrum:
        layer_top_eigenvalues(model, criterion, x, y, max_iter=100, tol=1e-3, chunk_size=None, seed=0)
    with Timer() as fisher:
        layer_curvature(model, criterion, x[:64], y[:64], method="fisher", seed=0)
    return {"epoch_s": epoch.seconds, "spectrum_s": spectrum.seconds, "spectrum_vs_epoch": spectrum.seconds / epoch.seconds,
            "fisher_blocks_s": fisher.seconds, "fisher_blocks_vs_epoch": fisher.seconds / epoch.seconds,
            "epoch_samples": len(experience.dataset)}


def report(saved: dict) -> str:
    penalty, spectrum = saved["penalty"], saved["spectrum"]
    lines = ["| cost | value |", "|---|---|",
             f"| penalty time per iteration, LayerAdaptiveEWC / EWCPlugin ({penalty['n_params']:,} parameters, "
             f"3 anchors) | {penalty['penalty_time_ratio']:.2f}× ({penalty['penalty_ms_lae']:.2f} ms / "
             f"{penalty['penalty_ms_ewc']:.2f} ms) |"]
    for model, cost in spectrum.items():
        lines += [f"| {model}: exact spectrum (256 samples) / one epoch ({cost['epoch_samples']} samples) | "
                  f"{cost['spectrum_vs_epoch']:.2f}× ({cost['spectrum_s']:.2f} s / {cost['epoch_s']:.2f} s) |",
                  f"| {model}: Fisher blocks (64 samples) / one epoch | {cost['fisher_blocks_vs_epoch']:.3f}× |"]
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = benchmark_parser("lae_costs", __doc__.splitlines()[0])
    args = parse_args(parser, argv, unused=("seeds", "skip", "workers", "executor"))
    if args.report:
        return {"report": print_report(args.report, report)}
    with Timer() as total, torch_threads(args.threads):
        results = {"penalty": penalty_cost(args.data_root, repetitions=30 if args.quick else 300),
                   "spectrum": {m: spectrum_cost(args.data_root, m) for m in MODELS}}
    out = write_results(args.out, args, config={"models": {m: f(args.data_root is not None) for m, f in MODELS.items()},
                                                "sgd": SGD, "batch_size": BATCH, "threads": args.threads},
                        rows=[], summary=[], wall_seconds=total.seconds, extra=results)
    results["report"] = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, report.md ({total.seconds:.0f}s)")
    return results


if __name__ == "__main__":
    main()
