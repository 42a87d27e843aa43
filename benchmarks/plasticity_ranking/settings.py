"""The learners of a run and the scoring protocol (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

_PRESETS = yaml.safe_load((Path(__file__).parent / "settings.yaml").read_text(encoding="utf-8"))
METRICS = tuple(_PRESETS["metrics"])
METRIC_LABELS = dict(_PRESETS["metrics"])
#: metrics read "lower = more plastic": negated before ranking (PLASTICITY_DIAGNOSTICS' directions)
NEGATED = tuple(_PRESETS["negated"])
#: OR's ingredients (cheaper parts of OR) and the variants beyond the paper
INGREDIENTS = tuple(_PRESETS["ingredients"])
VARIANTS = tuple(_PRESETS["variants"])
BASELINES = tuple(_PRESETS["baselines"])
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
    """The learners of the full run (or the reduced ``--quick`` run), from ``settings.yaml``."""
    mode, scr, pm = "quick" if quick else "full", _PRESETS["scr"], _PRESETS["pmnist"]
    settings = [setting_from_dict({**scr["common"], **scr[mode], "benchmark": "scr", "data": "scr",
                                   "name": f"scr/{variant}/h{len(hidden)}", "hidden": hidden,
                                   "variant": variant}) for variant, hidden in scr["grid"][mode]]
    data = "mnist" if data_root is not None else "digits"
    size = "digits" if data == "digits" else mode
    settings.append(setting_from_dict({
        **pm["common"], **pm[mode], "benchmark": "pmnist", "name": f"pmnist/{data}", "data": data,
        "examples_per_task": pmnist_examples or pm["examples_per_task"][size],
        "n_val": pmnist_val or pm["n_val"][size]}))
    return settings


def declining_settings(quick: bool, data_root=None, *, tasks: int | None = None, n_runs: int | None = None,
                       epochs: int | None = None) -> list[Setting]:
    """The streams that lose plasticity (issue 33) on MNIST from ``data_root`` (digits without it):
    docs/benchmarks.md, "benchmarks.plasticity_ranking"."""
    data = "mnist" if data_root is not None else "digits"
    preset = _PRESETS["declining"]
    common = {**preset["common"], **preset["quick" if quick else "full"], "data": data}
    common.update({k: v for k, v in (("n_checkpoints", tasks), ("epochs_per_task", epochs)) if v})
    if n_runs:
        common.update(n_runs=n_runs, n_runs_by_k=())
    if data == "digits":
        common.update(preset["digits"])
    streams = (("randlabel", "random_labels"), ("binary", "binary"))
    return [setting_from_dict({**common, "benchmark": bench, "name": f"{bench}/{data}",
                               "stream": stream}) for bench, stream in streams]


def gain_keys(setting: Setting) -> list[tuple[str, int]]:
    """``(ground-truth name, k)`` of every ground-truth column of a setting."""
    return [(name, k) for name, _, _ in setting.gain_optimizers for k in setting.ks]


def setting_from_dict(entry: dict) -> Setting:
    """A :class:`Setting` from its saved form (``asdict`` in ``results.json``: lists for tuples;
    ``setting_from_dict(asdict(s)) == s``)."""
    tuples = ("hidden", "ks", "ablation_fractions", "cost_k")
    fields = {k: tuple(v) if k in tuples else v for k, v in entry.items()}
    fields["n_runs_by_k"] = tuple(tuple(p) for p in entry.get("n_runs_by_k", ()))
    fields["gain_optimizers"] = tuple(tuple(g) for g in entry["gain_optimizers"])
    return Setting(**fields)
