"""Scenarios and their training budgets (``--set`` overrides)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

SCENARIOS = ("split_mnist", "permuted_mnist", "split_digits", "split_fashion_mnist")
DEFAULT_SCENARIOS = SCENARIOS[:3]  # Fashion-MNIST on request: its data root differs from MNIST's


@dataclass(frozen=True)
class ScenarioConfig:
    old_epochs: int
    old_lr: float  # Adam
    batch_size: int
    new_epochs: int
    new_lr: float  # plain SGD
    max_train: int  # training samples per task (subsampled, seeded)
    max_test: int  # old-task test inputs of the ground truth
    calibration: int


def scenario_config(name: str, quick: bool, calibration: int, overrides: dict | None = None) -> ScenarioConfig:
    """A scenario's budget, ``overrides`` (:func:`parse_overrides`) applied: its own ones win."""
    if name == "split_digits":
        cfg = ScenarioConfig(old_epochs=20 if quick else 40, old_lr=1e-3, batch_size=32, new_epochs=10,
                             new_lr=0.02, max_train=10_000, max_test=10_000, calibration=calibration)
    else:  # the MNIST budgets: docs/benchmarks.md, "benchmarks.ads_zoo"
        cfg = ScenarioConfig(old_epochs=2 if quick else 5, old_lr=1e-3, batch_size=64,
                             new_epochs=2 if quick else 10, new_lr=0.01, max_train=60_000, max_test=10_000,
                             calibration=calibration)
    changes = {}
    for key, value in (overrides or {}).items():
        scenario, _, field = key.rpartition(".")
        if scenario in ("", name) and (field not in changes or scenario):  # scenario-specific wins
            changes[field] = value
    return replace(cfg, **changes)


def parse_overrides(items) -> dict:
    """``["max_train=2000", "split_digits.old_epochs=20"]`` → ``{field or scenario.field: value}``
    (typed like the :class:`ScenarioConfig` field; ``calibration`` has its own flag)."""
    types = {f.name: f.type for f in fields(ScenarioConfig) if f.name != "calibration"}
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        scenario, _, field = key.strip().rpartition(".")
        if not sep or field not in types:
            raise ValueError(f"unknown field {field!r} in {item!r}; choose from {', '.join(types)}")
        if scenario and scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r} in {item!r}; choose from {SCENARIOS}")
        out[key.strip()] = float(value) if types[field] in (float, "float") else int(value)
    return out
