"""Typed specs: what the validator makes of a config, once, and what build, run and report read.

Frozen dataclasses, each with ``as_dict()`` giving the config's JSON form (what ``results.json``
echoes). Specs hold plain values (names, kwargs), so a job holding them pickles to any worker and
hashes into its cache key; the objects they name are resolved where the job runs. Each spec knows
the dotted ``package.module:callable`` names it resolved (:meth:`modules`), so a job's cache key
sees the user modules it runs. A strategy's grid keys are parsed once, into :class:`GridKey` s.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["GridKey", "MetricSpec", "ModelSpec", "PluginSpec", "RunSpec", "ScenarioSpec", "StrategySpec",
           "TrainingSpec", "apply_setting", "dotted_modules"]


def dotted_modules(*names: str) -> tuple[str, ...]:
    """The modules of the dotted ``module:callable`` names among ``names`` (built-in names have none).

    Example:
        >>> dotted_modules("split_digits", "my_pkg.streams:make", "mlp")
        ('my_pkg.streams',)
    """
    return tuple(dict.fromkeys(n.partition(":")[0] for n in names if ":" in n))


@dataclass(frozen=True)
class ScenarioSpec:
    """One scenario: a built-in benchmark name (with ``n_experiences``, ``task_incremental``,
    ``data_root``, ``train_per_class``, ``test_per_class``) or a factory
    ``package.module:callable`` (with ``kwargs``). ``online``
    (``{"experience_size": int, "access_task_boundaries": bool}``, None: offline) trains on
    Avalanche's ``split_online_stream`` of the training stream, evaluating after each original
    experience."""

    name: str
    benchmark: str
    n_experiences: int | None = None
    task_incremental: bool = False
    data_root: str | None = None
    kwargs: dict = field(default_factory=dict)
    online: dict | None = None
    train_per_class: int | None = None  # None: every training image
    test_per_class: int | None = None  # None: every test (or validation) image

    @property
    def is_factory(self) -> bool:
        return ":" in self.benchmark

    def modules(self) -> tuple[str, ...]:
        return dotted_modules(self.benchmark)

    def as_dict(self) -> dict:
        return {"name": self.name, "benchmark": self.benchmark, "n_experiences": self.n_experiences,
                "task_incremental": self.task_incremental, "data_root": self.data_root,
                "kwargs": copy.deepcopy(self.kwargs), **({"online": dict(self.online)} if self.online else {}),
                **{k: v for k in ("train_per_class", "test_per_class") if (v := getattr(self, k)) is not None}}


@dataclass(frozen=True)
class ModelSpec:
    """A zoo model name or a ``package.module:callable``, with its kwargs."""

    name: str
    kwargs: dict = field(default_factory=dict)

    def modules(self) -> tuple[str, ...]:
        return dotted_modules(self.name)

    def as_dict(self) -> dict:
        return {"name": self.name, "kwargs": copy.deepcopy(self.kwargs)}


PluginSpec = ModelSpec  # a plugin: its class name (or dotted path) and kwargs
MetricSpec = ModelSpec  # a metric: its name (or dotted path) and kwargs


@dataclass(frozen=True)
class TrainingSpec:
    """The training settings of a run (the config's ``training:`` with its defaults)."""

    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    epochs: int = 1
    batch_size: int = 32
    eval_batch_size: int = 256
    device: str = "cpu"

    def updated(self, values: Mapping) -> TrainingSpec:
        """A copy with ``values`` (a strategy's own training, a grid setting) applied."""
        return dataclasses.replace(self, **values) if values else self

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class GridKey:
    """One grid key, parsed: where its values go (``kind`` ``"strategy"``, ``"training"`` or
    ``"plugin"``; the plugin's ``index``) and which ``argument`` they set."""

    key: str
    kind: str
    index: int | None
    argument: str
    values: tuple


@dataclass(frozen=True)
class RunSpec:
    """What one run builds: the strategy class (name or dotted path), its kwargs and plugins, a
    grid setting already applied."""

    name: str
    cls: str
    kwargs: dict = field(default_factory=dict)
    plugins: tuple[PluginSpec, ...] = ()

    def modules(self) -> tuple[str, ...]:
        return dotted_modules(self.cls, *(p.name for p in self.plugins))


@dataclass(frozen=True)
class StrategySpec:
    """A strategy entry on one scenario (a recipe merged in, if it takes one): class, kwargs,
    plugins, parsed grid, its own training overrides, and the recipe and what overrode it."""

    name: str
    cls: str
    kwargs: dict = field(default_factory=dict)
    plugins: tuple[PluginSpec, ...] = ()
    grid: tuple[GridKey, ...] = ()
    training: dict = field(default_factory=dict)
    recipe: str | None = None
    overridden: tuple[str, ...] = ()

    def modules(self) -> tuple[str, ...]:
        return dotted_modules(self.cls, *(p.name for p in self.plugins))

    def grid_values(self) -> dict:
        """``{key: [values]}`` of the grid (what ``expand_grid`` takes)."""
        return {g.key: list(g.values) for g in self.grid}

    def as_dict(self) -> dict:
        out = {"name": self.name, "class": self.cls, "kwargs": copy.deepcopy(self.kwargs),
               "plugins": [p.as_dict() for p in self.plugins], "grid": self.grid_values(),
               "training": dict(self.training)}
        if self.recipe is not None:
            out.update({"recipe": self.recipe, "overridden": list(self.overridden)})
        return out

    @classmethod
    def from_dict(cls, spec: Mapping, grid: tuple[GridKey, ...] | None = None) -> StrategySpec:
        """The inverse of ``as_dict`` (a validated strategy, or one a ``results.json`` saved),
        its grid keys parsed (:func:`~avalanche_plugins.study.contracts.grid.grid_target`: a key naming no
        plugin of the strategy is a ``ConfigError``), unless ``grid`` holds them parsed already (the
        loader parses each key once, while checking it).

        Example:
            >>> spec = StrategySpec("EWC", "EWC", {"ewc_lambda": 1.0}, grid=(GridKey("ewc_lambda", "strategy",
            ...                     None, "ewc_lambda", (1.0, 10.0)),))
            >>> StrategySpec.from_dict(spec.as_dict()) == spec
            True
        """
        from avalanche_plugins.study.contracts.grid import grid_target

        if grid is None:
            grid = tuple(GridKey(key, *grid_target(key, spec["plugins"], key), tuple(values))
                         for key, values in spec.get("grid", {}).items())
        return cls(spec["name"], spec["class"], dict(spec["kwargs"]),
                   tuple(PluginSpec(p["name"], dict(p["kwargs"])) for p in spec["plugins"]), grid,
                   dict(spec.get("training", {})), spec.get("recipe"), tuple(spec.get("overridden", ())))

    def with_setting(self, setting: Mapping) -> tuple[RunSpec, dict]:
        """``(run spec, training overrides)`` with one grid setting (``{grid key: value}``) applied
        through the parsed grid keys; the overrides are the strategy's own ``training`` with the
        setting's ``training.KEY`` values (what :func:`apply_setting` lays over the study's)."""
        kwargs = dict(self.kwargs)
        plugins = [dict(p.kwargs) for p in self.plugins]
        trained = dict(self.training)
        keys = {g.key: g for g in self.grid}
        for key, value in setting.items():
            target = keys[key]
            if target.kind == "strategy":
                kwargs[target.argument] = value
            elif target.kind == "training":
                trained[target.argument] = value
            else:
                plugins[target.index][target.argument] = value
        run = RunSpec(self.name, self.cls, kwargs, tuple(PluginSpec(p.name, k) for p, k in zip(self.plugins, plugins)))
        return run, trained


def apply_setting(strategy: StrategySpec, training: TrainingSpec, setting: Mapping) -> tuple[RunSpec, TrainingSpec]:
    """``(run spec, training)`` of ``strategy`` with one grid setting (``{grid key: value}``)
    applied through its parsed grid keys; the strategy's own training overrides the study's."""
    run, trained = strategy.with_setting(setting)
    return run, training.updated(trained)
