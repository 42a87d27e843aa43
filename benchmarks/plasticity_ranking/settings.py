"""The learners of a run and the scoring protocol (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

_SCORES = yaml.safe_load((Path(__file__).parent / "metrics.yaml").read_text(encoding="utf-8"))
METRICS = tuple(_SCORES["metrics"])
METRIC_LABELS = dict(_SCORES["metrics"])
#: metrics read "lower = more plastic": negated before ranking (PLASTICITY_DIAGNOSTICS' directions)
NEGATED = tuple(_SCORES["negated"])
#: OR's ingredients (cheaper parts of OR) and the variants beyond the paper
INGREDIENTS = tuple(_SCORES["ingredients"])
VARIANTS = tuple(_SCORES["variants"])
BASELINES = tuple(_SCORES["baselines"])
STRATA = ("all", "dead", "live")
DIVERGED = -1e300


@dataclass(frozen=True)
class Setting:
    """One learner on one benchmark (a run = one setting × one seed)."""

    benchmark: str  # "scr" | "pmnist"
    name: str
    hidden: tuple[int, ...]
    optimizer: str  # learner optimizer: "adam" | "sgd"
    lr: float
    n_checkpoints: int
    checkpoint_every: int = 5
    examples_per_task: int = 10_000
    n_val: int = 10_000
    variant: str = "bit_flip"  # SCR only
    ks: tuple[int, ...] = (1, 10, 100)
    gain_optimizers: tuple[tuple[str, str, float], ...] = (("adam_fresh", "adam", 0.01), ("sgd", "sgd", 0.01))
    gain_batch: int = 4
    n_runs: int = 128
    or_batch: int = 4
    or_batches: int = 128
    n_probe: int = 256
    n_probe_jacobian: int = 64
    ablation_fractions: tuple[float, ...] = (1.0, 0.1, 0.01, 0.001)
    ablation_batches: int = 16
    ablation_batch: int = 1
    cost_k: tuple[int, ...] = (10, 100)  # G^(k) timed for the cost ratio (extra runs if not in ks)
    data: str = "scr"  # "scr" | "mnist" | "digits"
    # declining streams (issue 33): minibatch learner, several epochs per task
    stream: str = "permuted"  # image streams: "permuted" | "random_labels" | "binary"
    train_batch: int = 1  # > 1: torch minibatch learner (MinibatchLearner) instead of the online NumPy loop
    momentum: float = 0.0
    epochs_per_task: int = 1
    per_sample_or: bool = True
    lookahead_k: int = 10  # lookahead readiness LA^(k'): k' steps ...
    lookahead_runs: int = 8  # ... of this many runs (ground truth's first optimizer, lr, gain_batch)
    n_runs_by_k: tuple[tuple[int, int], ...] = ()  # ((k, runs), ...): fewer runs for a costly k
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def n_tasks(self) -> int:
        """Tasks trained; the target of the last checkpoint is task ``n_tasks``."""
        return self.n_checkpoints * self.checkpoint_every


def default_settings(quick: bool, data_root=None, *, pmnist_examples: int | None = None,
                     pmnist_val: int | None = None) -> list[Setting]:
    """The learners of the full run (or the reduced ``--quick`` run)."""
    settings = []
    scr_common = dict(optimizer="adam", lr=0.01, gain_optimizers=(
        ("adam_fresh", "adam", 0.01), ("adam_continue", "adam_continue", 0.01), ("sgd", "sgd", 0.01)))
    if quick:
        scr_common.update(n_checkpoints=12, examples_per_task=2000, n_val=1000, ks=(1, 10), n_probe=128,
                          n_probe_jacobian=32)
        scr_grid = [("bit_flip", (5,)), ("bit_flip", (5, 5)), ("resample", (5, 5))]
    else:
        scr_common.update(n_checkpoints=30)
        scr_grid = [(v, h) for v in ("bit_flip", "resample") for h in ((5,), (5, 5))]
    for variant, hidden in scr_grid:
        settings.append(Setting(benchmark="scr", name=f"scr/{variant}/h{len(hidden)}", hidden=hidden,
                                variant=variant, data="scr", **scr_common))
    data = "mnist" if data_root is not None else "digits"
    pm = dict(optimizer="sgd", lr=0.003, gain_optimizers=(("sgd", "sgd", 0.003), ("adam_fresh", "adam", 0.001)),
              ablation_fractions=(1.0, 0.1, 0.01), hidden=(100, 100, 100), data=data)
    if quick:
        pm.update(n_checkpoints=8, ks=(1, 10), n_probe=128, n_probe_jacobian=16,
                  examples_per_task=pmnist_examples or (1347 if data == "digits" else 1000),
                  n_val=pmnist_val or (450 if data == "digits" else 500))
    else:
        pm.update(n_checkpoints=30, n_probe=256, n_probe_jacobian=16,
                  examples_per_task=pmnist_examples or (1347 if data == "digits" else 10_000),
                  n_val=pmnist_val or (450 if data == "digits" else 2000))
    settings.append(Setting(benchmark="pmnist", name=f"pmnist/{data}", **pm))
    return settings


def declining_settings(quick: bool, data_root=None, *, tasks: int | None = None, n_runs: int | None = None,
                       epochs: int | None = None) -> list[Setting]:
    """The streams that lose plasticity (issue 33) on MNIST from ``data_root`` (digits without it):
    docs/benchmarks.md, "benchmarks.plasticity_ranking"."""
    data = "mnist" if data_root is not None else "digits"
    common = dict(hidden=(256, 256), optimizer="sgd", lr=0.01, momentum=0.9, train_batch=64,
                  epochs_per_task=epochs or 10,
                  checkpoint_every=1, n_checkpoints=tasks or (6 if quick else 20), examples_per_task=1000,
                  n_val=1000, ks=(1, 10) if quick else (1, 10, 100),
                  gain_optimizers=(("sgd", "sgd", 0.01),), n_runs=n_runs or (32 if quick else 128),
                  n_runs_by_k=() if quick or n_runs else ((100, 64),), ablation_fractions=(1.0, 0.1), n_probe=256,
                  n_probe_jacobian=8, per_sample_or=False, data=data)
    if data == "digits":
        common.update(examples_per_task=500, n_val=300, hidden=(64, 64))
    return [Setting(benchmark="randlabel", name=f"randlabel/{data}", stream="random_labels", **common),
            Setting(benchmark="binary", name=f"binary/{data}", stream="binary", **common)]


def gain_keys(setting: Setting) -> list[tuple[str, int]]:
    """``(ground-truth name, k)`` of every ground-truth column of a setting."""
    return [(name, k) for name, _, _ in setting.gain_optimizers for k in setting.ks]


def setting_from_dict(entry: dict) -> Setting:
    """A :class:`Setting` from its saved form (``asdict`` in ``results.json``: lists for tuples).

    Example:
        >>> from dataclasses import asdict
        >>> s = default_settings(True)[0]
        >>> setting_from_dict(asdict(s)) == s
        True
    """
    tuples = ("hidden", "ks", "ablation_fractions", "cost_k")
    fields = {k: tuple(v) if k in tuples else v for k, v in entry.items()}
    fields["n_runs_by_k"] = tuple(tuple(p) for p in entry.get("n_runs_by_k", ()))
    fields["gain_optimizers"] = tuple(tuple(g) for g in entry["gain_optimizers"])
    return Setting(**fields)
