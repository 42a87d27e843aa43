"""Standard continual-learning baselines: Naive, EWC, SI, GEM and Replay.

Average accuracy and forgetting per strategy on Split digits (scikit-learn, offline) and, with
``--data-root``, on Split MNIST and Permuted MNIST. Every later benchmark places its methods
next to these. Run ``python -m benchmarks.baselines --help``.

SI note: Avalanche 0.6's ``SynapticIntelligencePlugin`` is a no-op on CPU (it snapshots weights
as views); this benchmark applies :func:`avalanche_plugins.fix_synaptic_intelligence_on_cpu`
before building it, so "SI" here is the algorithm, not Naive under another name.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import asdict, dataclass

from avalanche_plugins import fix_synaptic_intelligence_on_cpu
from avalanche_plugins.study.harness.jobs import run_jobs
from avalanche_plugins.study.harness.results import (
    format_table,
    plot_final_accuracy,
    print_report,
    summarize,
    write_results,
)
from avalanche_plugins.study.harness.training import TrainConfig, config_stream, run_strategy
from benchmarks._cli import (
    benchmark_parser,
    is_skipped,
    make_executor,
    parse_args,
    split_list,
)

STRATEGIES = ("naive", "ewc", "si", "gem", "replay")


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


def scenario_name(cfg: TrainConfig) -> str:
    """``dataset/scenario/mode``, e.g. ``digits/split/task`` (the names ``--skip`` takes)."""
    mode = "task" if cfg.task_incremental else ("class" if cfg.scenario == "split" else "domain")
    return f"{cfg.dataset}/{cfg.scenario}/{mode}"


@dataclass(frozen=True)
class Job:
    strategy: str
    seed: int
    cfg: TrainConfig


@functools.lru_cache(maxsize=2)
def _stream(cfg_json: str, seed: int):
    return config_stream(TrainConfig(**json.loads(cfg_json)), seed)


def run_job(job: Job) -> dict:
    """One strategy on one scenario and seed (the stream is shared by the strategies of a seed)."""
    stream = _stream(json.dumps(asdict(job.cfg), sort_keys=True), job.seed)
    row = run_strategy(make_plugins, job.strategy, job.cfg, job.seed, stream=stream, progress=False)
    row["config"] = asdict(job.cfg)
    print(f"{row['scenario']:<45} {job.strategy:<14} seed {job.seed}: ACC {row['acc']:.3f} "
          f"F {row['forgetting']:.3f} ({row['wall_s']:.1f}s)", flush=True)
    return row


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


def report(saved: dict) -> str:
    """The summary table of a saved run."""
    return format_table(saved["summary"], ["scenario", "strategy"], ["acc", "forgetting", "wall_s"])


def main(argv=None) -> dict:
    parser = benchmark_parser("baselines", __doc__.splitlines()[0],
                              skip_help="scenarios as DATASET/SCENARIO/MODE (digits/split/class, digits/split/task, "
                                        "mnist/split/class, mnist/permuted/domain) or a prefix (mnist)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated subset of {','.join(STRATEGIES)}")
    args = parse_args(parser, argv)
    if args.report:
        return {"report": print_report(args.report, report)}
    chosen = split_list(args.strategies)
    unknown = set(chosen) - set(STRATEGIES)
    if unknown:
        parser.error(f"--strategies: unknown {sorted(unknown)}; choose from {STRATEGIES}")
    configs = [c for c in scenario_configs(args) if not is_skipped(args.skip, *scenario_name(c).split("/"))]
    jobs = [Job(strategy, seed, cfg) for cfg in configs for seed in range(args.seeds) for strategy in chosen]
    start = time.perf_counter()
    rows = run_jobs(run_job, jobs, cache=f"{args.out}/jobs.jsonl", executor=make_executor(args),
                    desc="baselines", progress=not args.no_progress)
    wall = time.perf_counter() - start
    summary = summarize(rows, ["scenario", "strategy"], ["acc", "forgetting", "wall_s"])
    out = write_results(args.out, args, config={"args": vars(args), "strategies": chosen,
                                                "scenarios": [asdict(c) for c in configs]},
                        rows=rows, summary=summary, wall_seconds=wall)
    plot_final_accuracy(rows, out / "accuracy.png", "baselines: final accuracy per experience")
    text = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, results.csv, report.md, accuracy.png ({wall:.0f}s)")
    return {"rows": rows, "summary": summary, "out": out, "report": text}


if __name__ == "__main__":
    main()
