"""The learners of a run and the scoring protocol (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field

METRICS = ("or", "or_per_sample", "strength", "reliability", "loss", "grad_norm_sq", "effective_rank", "energy_rank",
           "entk_energy_rank", "hessian_energy_rank", "active_units")
METRIC_LABELS = {"or": "OR (sampled)", "or_per_sample": "OR (per-sample)", "strength": "S",
                 "loss": "L (cheap baseline)", "grad_norm_sq": "‖g‖² (cheap baseline)",
                 "reliability": "R", "effective_rank": "effective rank", "energy_rank": "energy rank (99%)",
                 "entk_energy_rank": "eNTK energy rank", "hessian_energy_rank": "Hessian energy rank",
                 "active_units": "active units"}
STRATA = ("all", "dead", "live")
DIVERGED = -1e300
BASELINES = ("effective_rank", "energy_rank", "entk_energy_rank", "hessian_energy_rank", "active_units")


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
    fields["gain_optimizers"] = tuple(tuple(g) for g in entry["gain_optimizers"])
    return Setting(**fields)
