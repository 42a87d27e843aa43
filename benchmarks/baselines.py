"""Standard continual-learning baselines: Naive, EWC, SI, GEM and Replay.

Average accuracy and forgetting per strategy on Split digits (scikit-learn, offline) and, with
``--data-root``, on Split MNIST and Permuted MNIST. Every later benchmark places its methods
next to these. Run ``python -m benchmarks.baselines --help``.

SI note: Avalanche 0.6's ``SynapticIntelligencePlugin`` is a no-op on CPU (it snapshots weights
as views); this benchmark applies :func:`avalanche_plugins._avalanche.compat.fix_synaptic_intelligence_on_cpu`
before building it, so "SI" here is the algorithm, not Naive under another name.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field

import torch

from avalanche_plugins._avalanche.compat import fix_synaptic_intelligence_on_cpu
from benchmarks.continual import (
    accuracy_evaluator,
    average_accuracy,
    average_forgetting,
    run_stream,
)
from benchmarks.data import make_stream
from benchmarks.harness import (
    Timer,
    benchmark_parser,
    format_table,
    seed_everything,
    summarize,
    write_results,
)
from benchmarks.models import build_model

STRATEGIES = ("naive", "ewc", "si", "gem", "replay")


@dataclass
class TrainConfig:
    """Everything that defines one run besides the strategy and the seed."""

    dataset: str = "digits"
    scenario: str = "split"
    n_experiences: int = 5
    task_incremental: bool = False
    model: str = "mlp"
    hidden: tuple[int, ...] = (128, 128)
    model_kwargs: dict = field(default_factory=dict)  # for non-MLP models (e.g. CNN widths)
    lr: float = 0.05
    momentum: float = 0.0
    epochs: int = 5
    batch_size: int = 32
    ewc_lambda: float = 100.0
    si_lambda: float = 10000.0
    gem_patterns: int = 64
    gem_strength: float = 0.5
    replay_mem: int = 100
    data_root: str | None = None
    validation: bool = False
    extra: dict = field(default_factory=dict)


def make_plugins(name: str, cfg: TrainConfig) -> list:
    """The Avalanche plugins that turn a Naive strategy into baseline ``name``."""
    from avalanche.training.plugins import (
        EWCPlugin,
        GEMPlugin,
        ReplayPlugin,
        SynapticIntelligencePlugin,
    )

    if name == "naive":
        return []
    if name == "ewc":
        return [EWCPlugin(ewc_lambda=cfg.ewc_lambda)]
    if name == "si":
        fix_synaptic_intelligence_on_cpu()  # Avalanche 0.6 SI is a no-op on CPU otherwise
        return [SynapticIntelligencePlugin(si_lambda=cfg.si_lambda)]
    if name == "gem":
        return [GEMPlugin(patterns_per_experience=cfg.gem_patterns, memory_strength=cfg.gem_strength)]
    if name == "replay":
        return [ReplayPlugin(mem_size=cfg.replay_mem)]
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")


def run_one(plugins_for, name: str, cfg: TrainConfig, seed: int, stream=None, keep_strategy: bool = False) -> dict:
    """Build the stream, model and strategy for ``(name, seed)``, train, and return a result row.

    ``plugins_for(name, cfg)`` returns the plugin list (so other benchmarks add their own methods).
    """
    from avalanche.training.supervised import Naive

    stream = stream or make_stream(cfg.dataset, cfg.scenario, n_experiences=cfg.n_experiences,
                                   task_incremental=cfg.task_incremental, data_root=cfg.data_root,
                                   seed=seed, validation=cfg.validation)
    seed_everything(seed)  # after the stream: Avalanche's generators reseed torch
    model_kwargs = {"hidden": cfg.hidden} if cfg.model == "mlp" else dict(cfg.model_kwargs)
    model = build_model(cfg.model, stream.input_shape, stream.n_classes,
                        multihead=cfg.task_incremental, **model_kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    strategy = Naive(model=model, optimizer=optimizer, criterion=torch.nn.CrossEntropyLoss(),
                     train_mb_size=cfg.batch_size, train_epochs=cfg.epochs, eval_mb_size=512,
                     device="cpu", plugins=plugins_for(name, cfg), evaluator=accuracy_evaluator())
    with Timer() as timer:
        acc = run_stream(strategy, stream.benchmark, progress=f"{name} seed {seed}")
    return {
        "strategy": name,
        "scenario": stream.description,
        "seed": seed,
        "acc": average_accuracy(acc),
        "forgetting": average_forgetting(acc),
        "wall_s": timer.seconds,
        "accuracy_matrix": acc.tolist(),
        **({"strategy_object": strategy} if keep_strategy else {}),
    }


def plot_accuracy(rows, path, title: str) -> None:
    """Final accuracy per experience, one line per strategy (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(6 * len(scenarios), 4), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios):
        for strategy in dict.fromkeys(r["strategy"] for r in rows):
            mats = [np.array(r["accuracy_matrix"]) for r in rows if r["strategy"] == strategy and r["scenario"] == scenario]
            if mats:
                final = np.mean([m[-1] for m in mats], axis=0)
                ax.plot(range(len(final)), final, marker="o", label=strategy)
        ax.set(xlabel="experience", ylabel="final test accuracy", title=scenario, ylim=(0, 1))
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def scenario_configs(args) -> list[TrainConfig]:
    quick = args.quick
    epochs = 2 if quick else 5
    configs = [TrainConfig(dataset="digits", scenario="split", epochs=epochs),
               TrainConfig(dataset="digits", scenario="split", task_incremental=True, epochs=epochs)]
    if args.data_root:
        base = dict(dataset="mnist", data_root=args.data_root, hidden=(256, 256), lr=0.01,
                    momentum=0.9, batch_size=64, epochs=1 if quick else 2, replay_mem=500)
        configs.append(TrainConfig(scenario="split", **base))
        configs.append(TrainConfig(scenario="permuted", n_experiences=3 if quick else 5, **base))
    return configs


def main(argv=None, plugins_for=make_plugins, strategies=STRATEGIES, name="baselines",
         description: str | None = None) -> dict:
    parser = benchmark_parser(name, description or __doc__.splitlines()[0])
    parser.add_argument("--strategies", default=",".join(strategies),
                        help=f"comma-separated subset of {','.join(strategies)}")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = set(chosen) - set(strategies)
    if unknown:
        parser.error(f"--strategies: unknown {sorted(unknown)}; choose from {strategies}")
    seeds = range(1 if args.quick and args.seeds == 3 else args.seeds)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    rows = []
    with Timer() as total:
        for cfg in scenario_configs(args):
            for seed in seeds:
                stream = make_stream(cfg.dataset, cfg.scenario, n_experiences=cfg.n_experiences,
                                     task_incremental=cfg.task_incremental, data_root=cfg.data_root,
                                     seed=seed, validation=cfg.validation)
                for strategy in chosen:
                    row = run_one(plugins_for, strategy, cfg, seed, stream=stream)
                    row["config"] = asdict(cfg)
                    rows.append(row)
                    print(f"{row['scenario']:<45} {strategy:<14} seed {seed}: ACC {row['acc']:.3f} "
                          f"F {row['forgetting']:.3f} ({row['wall_s']:.1f}s)", flush=True)
    summary = summarize(rows, ["scenario", "strategy"], ["acc", "forgetting", "wall_s"])
    table = format_table(summary, ["scenario", "strategy"], ["acc", "forgetting", "wall_s"])
    out = write_results(args.out, config={"args": vars(args), "strategies": chosen,
                                          "scenarios": [asdict(c) for c in scenario_configs(args)]},
                        rows=rows, summary=summary, wall_seconds=total.seconds)
    plot_accuracy(rows, out / "accuracy.png", f"{name}: final accuracy per experience")
    print(table)
    print(f"wrote {out}/results.json, results.csv, accuracy.png ({total.seconds:.0f}s)")
    return {"rows": rows, "summary": summary, "out": out}


if __name__ == "__main__":
    main()
