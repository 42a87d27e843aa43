"""Reproduction targets: continual-learning-baselines' published numbers next to this runner's.

ContinualAI's ``continual-learning-baselines`` ships one experiment file per (benchmark, strategy)
and a table of the accuracies their unit tests expect (``tests/target_results.csv``). For every
experiment that runs on this machine's data (MNIST), ``studies/targets/*.yaml`` re-expresses
**their** settings (model, optimizer, learning rate, epochs, batch size, memory, λ, experiences:
numbers read from the file named in ``source_file``) in the study runner's config format.

``python -m benchmarks.targets run`` prints the commands that run them (one seed first; each
config's own ``seeds`` after); ``python -m benchmarks.targets write`` reads the kept runs
(``out/targets/NAME/results.json``) and writes

* ``docs/targets.csv`` — one row per target: their target and settings, our mean ± std over
  seeds, how the data and settings differ, the gap and what explains it;
* ``docs/results/targets/`` — ``summary.md`` (the table, every command with relative paths, the
  code version and data of each run) and ``NAME/tables.md`` (the tables each run printed).

Their numbers are ``Top1_Acc_Stream`` after the last experience (accuracy over the whole test
stream); ours are the runner's ACC (mean over experiences of the final accuracy, task labels used
where the scenario is task-incremental); the two coincide when test experiences are the same size
(Permuted MNIST) and differ by < 0.01 on Split MNIST.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies" / "targets"
OUT = ROOT / "out" / "targets"
CSV_PATH = ROOT / "docs" / "targets.csv"
KEPT = ROOT / "docs" / "results" / "targets"

REPO = "ContinualAI/continual-learning-baselines"
# the latest target table read (its commit), and the earlier one that still had lwf,pmnist
TARGETS_FILE = "tests/target_results.csv@b2d0c950"
OLD_TARGETS_FILE = "strategies/target_results.csv@024d2658"

COLUMNS = ("scenario", "strategy", "their_target", "target_source", "their_settings", "our_acc_mean", "our_acc_std",
           "n_seeds", "our_forgetting_mean", "status", "data_difference", "settings_difference", "gap",
           "explanation", "source_file", "config")

_PERMUTED_DATA = ("MNIST subset: 8,000 train / 2,000 test images (theirs: full MNIST, 60,000 / 10,000), so every "
                  "experience has 7.5x fewer training images and an epoch 7.5x fewer SGD steps; permutations "
                  "drawn from the run's seed")
_SPLIT_DATA = ("MNIST subset: about 1,600 training / 400 test images per 2-class experience (theirs: about "
               "12,000 / 2,000), so an epoch has 7.5x fewer SGD steps")

# One row per target. `config` / `study_strategy` name the run; settings come from `source_file`
# (path@commit in their repository); `explanation` is what the investigation of the gap found.
TARGETS = [
    {
        "scenario": "permuted_mnist", "strategy": "EWC", "config": "pmnist_ewc", "study_strategy": "EWC",
        "their_target": 0.83, "target_source": f"{TARGETS_FILE} ewc,pmnist",
        "their_settings": "10 exp; MLP 784-512-10 ReLU; SGD lr 0.001 (no momentum); 10 epochs; batch 256; "
                          "ewc_lambda 1, mode separate",
        "source_file": "experiments/permuted_mnist/ewc.py@7033630d",
        "data_difference": _PERMUTED_DATA,
        "settings_difference": "5 experiences x 5 epochs (theirs 10 x 10), cut to fit the shared 2-core CPU; "
                               "1 seed",
    },
    {
        "scenario": "permuted_mnist", "strategy": "SynapticIntelligence", "config": "pmnist_si",
        "study_strategy": "SynapticIntelligence",
        "their_target": 0.83, "target_source": f"{TARGETS_FILE} si,pmnist",
        "their_settings": "10 exp; MLP 784-1000-10 ReLU; Adam lr 0.001; 10 epochs; batch 256; si_lambda 10, eps 0.1",
        "source_file": "experiments/permuted_mnist/synaptic_intelligence.py@7033630d",
        "data_difference": _PERMUTED_DATA,
        "settings_difference": "5 experiences x 5 epochs (theirs 10 x 10), cut to fit the shared 2-core CPU; "
                               "the runner applies the package's SI CPU fix (without it Avalanche 0.6's SI is Naive "
                               "on a CPU); 1 seed",
    },
    {
        "scenario": "permuted_mnist", "strategy": "GEM", "config": "pmnist_gem", "study_strategy": "GEM",
        "their_target": 0.93, "target_source": f"{TARGETS_FILE} gem,pmnist (0.83 in earlier tables; README 0.80)",
        "their_settings": "5 exp (their unit test tests/gem/experiment.py; the file's default is 17); "
                          "MLP 784-100-100-10 ReLU; SGD lr 0.1; 1 epoch; batch 10; patterns_per_exp 1000, "
                          "memory_strength 0.5",
        "source_file": "experiments/permuted_mnist/gem.py@c5d60680",
        "data_difference": _PERMUTED_DATA,
        "settings_difference": "none (5 experiences as their test runs it; 1 seed)",
    },
    {
        "scenario": "permuted_mnist", "strategy": "AGEM", "config": "pmnist_agem", "study_strategy": "AGEM",
        "their_target": 0.81, "target_source": f"{TARGETS_FILE} agem,pmnist",
        "their_settings": "17 exp; MLP 784-256-256-10 ReLU; SGD lr 0.1; 1 epoch; batch 10; patterns_per_exp 250, "
                          "sample_size 256",
        "source_file": "experiments/permuted_mnist/agem.py@7f488998",
        "data_difference": _PERMUTED_DATA,
        "settings_difference": "none (their values; 1 seed)",
    },
    {
        "scenario": "permuted_mnist", "strategy": "LwF", "config": "pmnist_lwf", "study_strategy": "LwF",
        "their_target": 0.51,
        "target_source": f"{OLD_TARGETS_FILE} lwf,pmnist (no row in the current {TARGETS_FILE}, although "
                         "tests/lwf/experiment.py still asks for it)",
        "their_settings": "10 exp; MLP 784-1000-1000-10 ReLU; Adam lr 0.001; 5 epochs; batch 256; alpha 1, "
                          "temperature 1",
        "source_file": "experiments/permuted_mnist/lwf.py@2f05f40e",
        "data_difference": _PERMUTED_DATA,
        "settings_difference": "5 experiences (theirs 10), cut to fit the shared 2-core CPU; 1 seed",
    },
    {
        "scenario": "permuted_mnist", "strategy": "LFL", "config": "pmnist_lfl", "study_strategy": "LFL",
        "their_target": 0.88, "target_source": f"{TARGETS_FILE} lfl,pmnist",
        "their_settings": "4 exp; MLP 784-256-10 ReLU; SGD lr 0.01; 3 epochs; batch 128; lambda_e 0.0001",
        "source_file": "experiments/permuted_mnist/lfl.py@7f488998",
        "data_difference": _PERMUTED_DATA,
        "settings_difference": "none (their values; model studies/targets/clb.py:mlp, an Avalanche BaseModel with "
                               "get_features, which LFL requires)",
    },
    {
        "scenario": "split_mnist_task", "strategy": "SynapticIntelligence", "config": "smnist_task",
        "study_strategy": "SynapticIntelligence", "diagnostics": ["Naive"],
        "their_target": 0.97, "target_source": f"{TARGETS_FILE} si,smnist",
        "their_settings": "5 exp task-incremental, class order 0..9; multi-head MLP 784-256-256 ReLU; Adam lr "
                          "0.001; 10 epochs; batch 64; si_lambda 1, eps 0.1",
        "source_file": "experiments/split_mnist/synaptic_intelligence.py@7f488998",
        "data_difference": _SPLIT_DATA,
        "settings_difference": "class order drawn from the run's seed (theirs fixed to 0..9); class ids from zero "
                               "in each experience (theirs: the original ids, masked by the multi-head classifier)",
    },
    {
        "scenario": "split_mnist_task", "strategy": "RWalk", "config": "smnist_task", "study_strategy": "RWalk",
        "diagnostics": ["Naive"],
        "their_target": 0.99, "target_source": f"{TARGETS_FILE} rwalk,smnist (0.92 in earlier tables)",
        "their_settings": "5 exp task-incremental, class order 0..9; multi-head MLP 784-256-256 ReLU; Adam lr "
                          "0.001; 10 epochs; batch 64; Naive + RWalkPlugin(ewc_lambda 0.1, ewc_alpha 0.9, delta_t 10)",
        "source_file": "experiments/split_mnist/rwalk.py@7033630d",
        "data_difference": _SPLIT_DATA,
        "settings_difference": "class order drawn from the run's seed (theirs fixed to 0..9); class ids from zero "
                               "in each experience",
    },
    {
        "scenario": "split_mnist", "strategy": "LwF", "config": "smnist_lwf", "study_strategy": "LwF",
        "diagnostics": ["LwF_lr_x7.5"],
        "their_target": 0.23, "target_source": f"{TARGETS_FILE} lwf,smnist",
        "their_settings": "5 exp class-incremental; MLP 784-200-10 tanh; SGD lr 0.001; 21 epochs; batch 128; "
                          "alpha per experience [0, 0.5, 1.33333, 2.25, 3.2], temperature 2; cross-entropy divided "
                          "by the number of experiences seen",
        "source_file": "experiments/split_mnist/lwf.py@4e8a36e1",
        "data_difference": _SPLIT_DATA,
        "settings_difference": "none (their values; their LwF subclass and tanh MLP re-expressed in "
                               "studies/targets/clb.py: LwFCEPenalty, mlp)",
    },
    {
        "scenario": "split_mnist", "strategy": "GDumb", "config": "smnist_mlp400", "study_strategy": "GDumb",
        "their_target": 0.97, "target_source": f"{TARGETS_FILE} gdumb,smnist",
        "their_settings": "5 exp class-incremental; MLP 784-400-400-10 ReLU; SGD lr 0.1; 10 epochs; batch 16; "
                          "mem_size 4400",
        "source_file": "experiments/split_mnist/gdumb.py@fcb0be8a",
        "data_difference": _SPLIT_DATA + "; the 4,400-image memory holds 55 % of our 8,000 training images "
                                         "(7 % of theirs)",
        "settings_difference": "none (their values)",
    },
    {
        "scenario": "split_mnist", "strategy": "GenerativeReplay", "config": "smnist_mlp400",
        "study_strategy": "GenerativeReplay",
        "their_target": 0.75, "target_source": f"{TARGETS_FILE} generative_replay,smnist",
        "their_settings": "5 exp class-incremental; MLP 784-400-400-10 ReLU; Adam lr 0.001; 10 epochs; batch 16; "
                          "replay_size 100; Avalanche's default generator (MLP VAE, same epochs and batch)",
        "source_file": "experiments/split_mnist/generative_replay.py@5f40ab9a",
        "data_difference": _SPLIT_DATA,
        "settings_difference": "none (their values; the runner builds GenerativeReplay with its default VAE "
                               "generator, so no generator strategy had to be expressed)",
    },
    {
        "scenario": "split_mnist_1000", "strategy": "GSS_greedy", "config": "smnist_gss", "study_strategy": "GSS_greedy",
        "their_target": 0.78, "target_source": f"{TARGETS_FILE} gss,smnist",
        "their_settings": "5 exp class-incremental, class order from seed 1, 1000 random training images per "
                          "experience; MLP 784-100-100-10 ReLU; SGD lr 0.05; 3 epochs; batch 10; mem_size 300, "
                          "mem_strength 10",
        "source_file": "experiments/split_mnist/gss.py@27b4072a",
        "data_difference": "MNIST subset: the same 1,000 training images per experience (drawn from our ~1,600), "
                           "but 2,000 test images (theirs 10,000)",
        "settings_difference": "none (their values; the subsampled stream is studies/targets/clb.py:"
                               "split_mnist_subsampled)",
    },
]

# What the investigation of each gap found (filled from the kept runs; see the module docstring).
EXPLANATIONS: dict[tuple[str, str], str] = {
    ("permuted_mnist", "EWC"):
        "Underfitting, not forgetting (forgetting 0.044): plain SGD at lr 0.001 and batch 256 gets 5 epochs x "
        "32 = 160 steps per experience here against 10 x 235 = 2,350 on full MNIST (7.5x from the data size, 2x "
        "from the epoch cut), so experience 0 reaches only 0.60 (R[0,0]) and no experience passes 0.62. Their "
        "setting is tuned for full MNIST; on the subset it needs a larger lr or more epochs. Data size and the "
        "CPU cut, not the runner.",
    ("permuted_mnist", "SynapticIntelligence"):
        "Over the target because the stream was cut to 5 experiences (theirs 10): ACC averages 5 experiences, "
        "the oldest only 4 experiences old; experience 0 already falls from 0.95 to 0.76 over them (forgetting "
        "0.091), so 10 experiences would score lower. Each experience is learned to 0.95 despite 7.5x fewer "
        "steps (Adam). Note Avalanche 0.6's SI clamps every importance to at most 0.001 "
        "(after_training_exp passes clip_to=0.001 to update_ewc_data), so lambda 10 regularises weakly.",
    ("permuted_mnist", "GEM"):
        "Reproduced: 0.01 under the latest table's 0.93 (their unit test fails only more than 0.03 under it); "
        "0.09 over the earlier 0.83 and 0.12 over the README's 0.80. One epoch at batch 10 gives 800 SGD steps "
        "per experience here (6,000 on full MNIST), yet every experience reaches 0.90-0.92 and GEM's constraint "
        "keeps forgetting at zero (BWT +0.009), so the smaller data costs little.",
    ("permuted_mnist", "AGEM"):
        "0.04 under, from forgetting (0.156) on top of lower plasticity: one epoch at batch 10 is 800 steps per "
        "experience here (6,000 on full MNIST), so each experience reaches only 0.91 right after training "
        "(mean R[j,j]); A-GEM's projection on a 256-sample reference gradient then lets 17 experiences erode "
        "it. The 250 stored patterns per experience are the same number as theirs. Data size, not the runner.",
    ("permuted_mnist", "LwF"):
        "0.20 over an old target, mostly from the cut to 5 experiences (theirs 10): ACC averages 5 experiences "
        "and experience 0 already falls from 0.96 to 0.53 after 4 more (forgetting 0.251), so 10 would score "
        "lower. The target itself is from an earlier table, set with an Avalanche whose LwF distilled all "
        "output units (it now distils only previously active ones; continual-learning-baselines issue 21).",
    ("permuted_mnist", "LFL"):
        "Underfitting, not forgetting: 3 epochs at lr 0.01 (plain SGD, batch 128) are 189 steps per experience "
        "here against about 1,400 on full MNIST, so experience 0 reaches only 0.87 (R[0,0]) and LFL freezes the "
        "head after it; forgetting is 0.025. The gap is the data size (7.5x fewer steps per epoch).",
    ("split_mnist_task", "SynapticIntelligence"):
        "0.07 under, and under Naive with the same seed, init and training (0.954, row 'measured Naive'): the "
        "gap is one forgetting event (experience 2 falls from 0.99 to 0.67 after experience 4), so with one "
        "seed it is not separable from seed variance. Avalanche 0.6's SI clamps importances above at 0.001 but "
        "not below, so parameters with a positive path integral get a negative importance that rewards moving "
        "away from the old solution; whether that causes this event is not verified. Not the runner: the CPU "
        "fix only makes SI's weight snapshots copies.",
    ("split_mnist_task", "RWalk"):
        "Reproduced: within 0.01 of the latest target 0.99 (their file's docstring notes their own run fell "
        "short of 0.99) and above the earlier 0.92.",
    ("split_mnist", "LwF"):
        "0.41 over the target, explained by the data size: 21 epochs of plain SGD at lr 0.001 are 13 x 21 = 273 "
        "steps per experience here (about 2,000 on full MNIST), too little training on each new pair of classes "
        "to overwrite the old ones' logits. With lr x 7.5 (the gradient-flow time, lr x steps, of their larger "
        "epochs; row 'measured LwF_lr_x7.5') the same config gives 0.249, within 0.02 of their 0.23, and the "
        "forgetting typical of class-incremental LwF (0.91).",
    ("split_mnist", "GDumb"):
        "Close (0.02 under, one seed): GDumb retrains from scratch on its class-balanced 4,400-image memory, "
        "the same size as theirs, so its final training (10 epochs, 2,750 steps) matches theirs; the rest is "
        "seed and test-set noise (2,000 test images: a standard error of about 0.005), and a memory drawn "
        "from a 7.5x smaller pool.",
    ("split_mnist", "GenerativeReplay"):
        "0.07 over the target with one seed; not explained within this budget. The solver and Avalanche's "
        "default VAE both get 7.5x fewer steps per experience than on full MNIST; candidates are seed variance "
        "(one seed) and their target having been set with an earlier Avalanche release.",
    ("split_mnist_1000", "GSS_greedy"):
        "Reproduced: GSS trains on 1,000 images per experience in their setting too, so the subset changes "
        "only the test set (2,000 images: a standard error of about 0.009).",
}


def _fmt(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return f"{value:.{digits}f}"


def _relative(text: str) -> str:
    return str(text).replace(str(ROOT) + "/", "").replace(str(ROOT), ".")


def _acc_stats(result: dict | None, strategy: str) -> tuple[list[dict], list[dict]]:
    """``(finished runs, failed runs)`` of ``strategy``'s test runs in one results.json."""
    if result is None:
        return [], []
    runs = [r for r in result["runs"] if r["strategy"] == strategy and r["split"] == "test"]
    ok = [r for r in runs if not r.get("error") and r.get("status", "ok") == "ok"]
    return ok, [r for r in runs if r not in ok]


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return mean, std


def _diagnostics(result: dict | None, names: list[str]) -> str:
    """``"diagnostic NAME: ACC m ± s (n=k)"`` for each diagnostic strategy that ran."""
    parts = []
    for name in names:
        ok, _ = _acc_stats(result, name)
        mean, std = _mean_std([r["acc"] for r in ok])
        if mean is not None:
            parts.append(f"measured {name}: ACC {mean:.3f}{f' ± {std:.3f}' if std is not None else ''} (n={len(ok)})")
    return "; ".join(parts)


def load_runs(out: Path = OUT) -> dict[str, dict]:
    """``{config name: results.json}`` of the kept runs under ``out``."""
    found = {}
    for path in sorted(out.glob("*/results.json")):
        found[path.parent.name] = json.loads(path.read_text())
    return found


def target_rows(saved: dict[str, dict]) -> list[dict]:
    """The rows of ``docs/targets.csv`` from the kept runs (a target without a run is kept, empty)."""
    rows = []
    for target in TARGETS:
        result = saved.get(target["config"])
        ok, failed = _acc_stats(result, target["study_strategy"])
        mean, std = _mean_std([r["acc"] for r in ok])
        forgetting = [r["forgetting"] for r in ok if r.get("forgetting") is not None]
        if result is None or not (ok or failed):
            status = "not run"
        elif failed:
            status = "; ".join(f"seed {r['seed']} failed: {r.get('error')}" for r in failed)
        else:
            status = "ok"
        gap = None if mean is None else mean - target["their_target"]
        row = {k: target.get(k, "") for k in COLUMNS}
        row.update(their_target=f"{target['their_target']:.2f}", our_acc_mean=_fmt(mean), our_acc_std=_fmt(std),
                   n_seeds=str(len(ok)), our_forgetting_mean=_fmt(sum(forgetting) / len(forgetting) if forgetting
                                                                  else None),
                   status=status, gap=_fmt(gap, 3), config=f"studies/targets/{target['config']}.yaml",
                   source_file=f"{REPO}:{target['source_file']}",
                   explanation=" ".join(x for x in (EXPLANATIONS.get((target["scenario"], target["strategy"]), ""),
                                                    _diagnostics(result, target.get("diagnostics", []))) if x))
        rows.append(row)
    return rows


def write_csv(rows: list[dict], path: Path = CSV_PATH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def _markdown_table(rows: list[dict]) -> str:
    head = "| scenario | strategy | their target | ours (mean ± std, n) | gap | status |\n|---|---|---|---|---|---|\n"
    lines = []
    for r in rows:
        ours = f"{r['our_acc_mean']} ± {r['our_acc_std'] or '–'} (n={r['n_seeds']})" if r["our_acc_mean"] else "–"
        lines.append(f"| {r['scenario']} | {r['strategy']} | {r['their_target']} | {ours} | {r['gap'] or '–'} | "
                     f"{r['status']} |")
    return head + "\n".join(lines) + "\n"


def write_kept(saved: dict[str, dict], rows: list[dict], kept: Path = KEPT) -> None:
    """``summary.md`` and each run's ``tables.md`` under ``kept``."""
    kept.mkdir(parents=True, exist_ok=True)
    parts = ["# Reproduction targets: kept summary\n",
             "Generated by `python -m benchmarks.targets write` from `out/targets/*/results.json`; the table "
             "is `docs/targets.csv` in short. Data: the MNIST subset in `../shared/data` (8,000 train / 2,000 "
             "test images), not full MNIST.\n", _markdown_table(rows), "\n## Runs\n"]
    for name, result in saved.items():
        seeds = sorted({r["seed"] for r in result["runs"] if r["split"] == "test"})
        data = result.get("data") or {}
        parts.append(f"### {name}\n\n- config: `studies/targets/{name}.yaml`\n"
                     f"- command: `{_relative(result.get('command', ''))}`\n"
                     f"- code version: `{result.get('code_version')}`\n"
                     f"- seeds: {seeds}; wall time {result.get('wall_seconds', float('nan')):.0f} s\n"
                     f"- data: {data.get('name', '')} "
                     f"{', '.join(f'{k}: sha256 {v[:12]}' for k, v in sorted(data.get('sha256', {}).items()))}\n"
                     f"- tables: `docs/results/targets/{name}/tables.md`\n")
        tables = OUT / name / "tables.md"
        if tables.exists():
            (kept / name).mkdir(exist_ok=True)
            (kept / name / "tables.md").write_text(_relative(tables.read_text()))
    (kept / "summary.md").write_text("\n".join(parts))


def run_commands(first_pass: bool) -> list[str]:
    """The commands that run every target config (``--seeds 1`` for the first pass)."""
    seeds = " --seeds 1" if first_pass else ""
    return [f"nice -n 10 .venv/bin/avalanche-study run studies/targets/{p.stem}.yaml --data-root ../shared/data "
            f"--out out/targets/{p.stem} --workers 1 --no-progress{seeds}" for p in sorted(STUDIES.glob("*.yaml"))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.targets", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write docs/targets.csv and docs/results/targets/ from out/targets/")
    write.add_argument("--out", default=str(OUT), help="folder of the kept runs (default out/targets)")
    run = sub.add_parser("run", help="print the commands that run the target configs")
    run.add_argument("--first-pass", action="store_true", help="one seed each")
    args = parser.parse_args(argv)
    if args.command == "run":
        print("\n".join(run_commands(args.first_pass)))
        return 0
    saved = load_runs(Path(args.out))
    rows = target_rows(saved)
    write_csv(rows)
    write_kept(saved, rows)
    print(_markdown_table(rows))
    print(f"wrote {CSV_PATH.relative_to(ROOT)} and {KEPT.relative_to(ROOT)}/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
