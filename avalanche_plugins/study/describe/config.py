"""Study configs: YAML or TOML files (or dicts) → a validated :class:`Study` (the validator).

It imports neither the builder nor the runner: checks that need to build a model are the
builder's (:func:`avalanche_plugins.study.run.build.check_model_builds`), which
:func:`avalanche_plugins.study.api.load_study` runs after :func:`read_study`.

Every key is checked before anything runs: unknown keys are rejected, names resolved (strategy,
plugin, metric, model and benchmark factories), kwargs compared with the signatures they go to,
and each error names the offending key, e.g. ``strategies[2].kwargs.ewc_lambda: expected a
number, got 'x'``. The format is documented in README "Comparative studies".
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from avalanche_plugins.study.catalog.diagnostics import ATTACHED, check_kwargs
from avalanche_plugins.study.catalog.registry import (
    ConfigError,
    ErrorList,
    Resolver,
    check_arguments,
    check_value,
    metric_factory,
    model_factory,
    parameters,
    plugin_class,
    strategy_class,
)
from avalanche_plugins.study.catalog.scenarios import (
    BUILTIN_SCENARIOS,
    builtin_scenarios,
    dataset_of,
)
from avalanche_plugins.study.catalog.zoo import DEFAULT_MODEL
from avalanche_plugins.study.contracts.grid import grid_target
from avalanche_plugins.study.contracts.specs import (
    GridKey,
    MetricSpec,
    ModelSpec,
    ScenarioSpec,
    StrategySpec,
    TrainingSpec,
)

__all__ = ["StrategyEntry", "BUILTIN_SCENARIOS", "LOGGERS", "STRATEGY_INJECTED", "TRAINING_DEFAULTS", "Study",
           "read_study"]

TRAINING_DEFAULTS = TrainingSpec().as_dict()  # the training keys and their defaults
OPTIMIZERS = ("sgd", "adam", "adamw")
LOGGERS = ("tensorboard", "wandb", "text")
STRATEGY_INJECTED = ("model", "optimizer", "criterion", "train_mb_size", "train_epochs", "eval_mb_size",
                     "device", "plugins", "evaluator")
MODEL_INJECTED = ("input_shape", "n_classes", "multihead")

_TOP = ("name", "description", "seeds", "tune_seed", "reference", "scenarios", "model", "training",
        "strategies", "metrics", "loggers", "quick")
_SCENARIO = ("name", "benchmark", "n_experiences", "task_incremental", "data_root", "kwargs", "online",
             "train_per_class", "test_per_class")
_ONLINE = ("experience_size", "access_task_boundaries")
_STRATEGY = ("name", "class", "kwargs", "plugins", "grid", "training", "recipe")
_QUICK = ("seeds", "training", "scenarios", "grid", "metrics")


@dataclass
class _Draft:
    """A study while it is validated: the config's sections as checked dicts (made typed at the end)."""

    name: str
    description: str
    seeds: int
    tune_seed: int
    reference: str
    scenarios: list[dict]
    model: dict
    training: dict
    strategies: list[dict]
    metrics: list[dict]
    loggers: list[str]
    source: str | None = None
    quick: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StrategyEntry:
    """A strategy of the study: one spec, or (``recipe:``) one per scenario with its recipe merged in."""

    name: str
    spec: StrategySpec | None = None
    per_scenario: dict = field(default_factory=dict)  # scenario name → StrategySpec

    def on(self, scenario: str) -> StrategySpec:
        """The spec that runs on ``scenario``."""
        return self.per_scenario.get(scenario) or self.spec

    def specs(self) -> list[StrategySpec]:
        return list(self.per_scenario.values()) or [self.spec]

    def as_dict(self) -> dict:
        """The config form: the spec's, or (a recipe strategy) ``{"name", "per_scenario": {scenario: spec}}``."""
        if not self.per_scenario:
            return self.spec.as_dict()
        return {"name": self.name, "per_scenario": {name: spec.as_dict() for name, spec in self.per_scenario.items()}}


@dataclass(frozen=True)
class Study:
    """A validated study: typed, frozen specs (plain values, resolved again in every job's process)."""

    name: str
    description: str
    seeds: int
    tune_seed: int
    reference: str
    scenarios: tuple[ScenarioSpec, ...]
    model: ModelSpec
    training: TrainingSpec
    strategies: tuple[StrategyEntry, ...]
    metrics: tuple[MetricSpec, ...]
    loggers: tuple[str, ...]
    source: str | None = None
    quick: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)  # user module → hash of its source (job cache keys)
    paths: tuple = ()  # folders the user modules are imported from (a job puts them on sys.path while it runs)
    modules: dict = field(default_factory=dict)  # user module → the folder it was imported from (Resolver)

    def as_dict(self) -> dict:
        """The config's JSON form (what ``results.json`` echoes)."""
        return {"name": self.name, "description": self.description, "seeds": self.seeds, "tune_seed": self.tune_seed,
                "reference": self.reference, "scenarios": [s.as_dict() for s in self.scenarios],
                "model": self.model.as_dict(), "training": self.training.as_dict(),
                "strategies": [s.as_dict() for s in self.strategies], "metrics": [m.as_dict() for m in self.metrics],
                "loggers": list(self.loggers), "quick": copy.deepcopy(self.quick)}

    def strategy(self, name: str) -> StrategyEntry:
        return next(s for s in self.strategies if s.name == name)

    def sources_of(self, *specs) -> dict:
        """The source hashes of the user modules ``specs`` name (each spec knows its dotted names),
        for the cache key of the jobs that use them."""
        modules = {m for spec in specs for m in spec.modules()}
        return {m: h for m, h in self.sources.items() if m in modules}


def read_study(config, *, quick: bool = False, seeds: int | None = None, data_root=None,
               recipe_folder=None) -> Study:
    """Read and validate a study: a YAML/TOML path or an already parsed mapping.

    ``quick`` applies the config's ``quick:`` overrides; ``seeds`` replaces ``seeds``;
    ``data_root`` fills the ``data_root`` of scenarios that name none. Dotted
    ``module:callable`` names resolve against the config file's folder, then the working
    directory. Every error of the config is collected and raised at once (one
    :class:`ConfigError` listing them, each naming its key), experience counts that do not
    divide a split scenario's classes included. A strategy with ``recipe: true`` takes the tuned
    recipe of each scenario (``recipe_folder``: recipe files other than the shipped ones;
    :mod:`~avalanche_plugins.study.describe.recipes`). Whether the model builds for each scenario is
    the builder's check (:func:`avalanche_plugins.study.api.load_study` runs both).
    """
    raw, source = _raw_config(config)
    resolver = Resolver(*([Path(source).resolve().parent] if source else []), Path.cwd())
    found = ErrorList()
    raw, quick_spec = _quick_and_seeds(raw, found, quick, seeds)
    study = _top_level(raw, source, quick_spec, found, resolver)
    _entries(study, raw, found, data_root, recipe_folder, resolver)
    _names_and_reference(study, raw, found)
    found.raise_if_any()
    modules = [name.partition(":")[0] for name in _dotted_names(study)]
    return _typed(study, resolver.source_hashes(modules), resolver.folders(modules),
                  {m: resolver.imported_from[m] for m in dict.fromkeys(modules) if m in resolver.imported_from})


def _typed(draft: _Draft, sources: dict, paths: list, modules: dict) -> Study:
    """The validated draft as a :class:`Study` of typed, frozen specs."""
    def typed(spec: dict) -> StrategySpec:  # its grid keys as _strategy parsed them
        targets = spec[_GRID_TARGETS]
        return StrategySpec.from_dict(spec, tuple(GridKey(k, *targets[k], tuple(v)) for k, v in spec["grid"].items()))

    strategies = tuple(StrategyEntry(s["name"], None if "per_scenario" in s else typed(s),
                                     {k: typed(v) for k, v in s.get("per_scenario", {}).items()})
                       for s in draft.strategies)
    return Study(draft.name, draft.description, draft.seeds, draft.tune_seed, draft.reference,
                 tuple(ScenarioSpec(**s) for s in draft.scenarios), ModelSpec(draft.model["name"], draft.model["kwargs"]),
                 TrainingSpec(**draft.training), strategies,
                 tuple(MetricSpec(m["name"], dict(m["kwargs"])) for m in draft.metrics), tuple(draft.loggers),
                 draft.source, draft.quick, sources, tuple(paths), modules)


def _raw_config(config) -> tuple[dict, str | None]:
    """The config as a mapping, and the file it was read from (whose folder dotted names then
    resolve against, before the working directory)."""
    source = None
    if isinstance(config, (str, Path)):
        source = str(config)
        config = _read(Path(config))
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: expected a mapping of keys, got {type(config).__name__}")
    return copy.deepcopy(dict(config)), source


def _quick_and_seeds(raw: dict, found: ErrorList, quick: bool, seeds: int | None) -> tuple[dict, dict]:
    """Top-level keys checked; ``quick:`` validated (and applied with ``quick``); ``seeds`` replaced."""
    with found.attempt():
        _keys(raw, "", _TOP, required=("scenarios", "strategies"))
    quick_spec: dict = {}
    with found.attempt():
        quick_spec = _quick(raw.get("quick", {}))
    if quick:
        raw = _apply_quick(raw, quick_spec)
    if seeds is not None:
        raw["seeds"] = seeds
    return raw, quick_spec


def _section(found: ErrorList, fn, fallback):
    """``fn()``, or ``fallback`` with its error collected in ``found``."""
    with found.attempt():
        return fn()
    return fallback


def _top_level(raw: dict, source, quick_spec: dict, found: ErrorList, resolver: Resolver) -> _Draft:
    """The study's scalar sections (name, seeds, model, training, loggers); lists come after."""
    return _Draft(
        name=_section(found, lambda: _string(raw.get("name", Path(source).stem if source else "study"), "name"), "study"),
        description=_section(found, lambda: _string(raw.get("description", ""), "description"), ""),
        seeds=_section(found, lambda: _int(raw.get("seeds", 3), "seeds", minimum=1), 1),
        tune_seed=_section(found, lambda: _int(raw.get("tune_seed", 0), "tune_seed", minimum=0), 0),
        reference="", scenarios=[], strategies=[], metrics=[],
        model=_section(found, lambda: _model(raw.get("model", DEFAULT_MODEL), resolver), None),
        training=_section(found, lambda: _training(raw.get("training", {}), "training", defaults=TRAINING_DEFAULTS),
                          dict(TRAINING_DEFAULTS)),
        loggers=_section(found, lambda: _loggers(raw.get("loggers", [])), []),
        source=source, quick=quick_spec)


def _entries(study: _Draft, raw: dict, found: ErrorList, data_root, recipe_folder, resolver: Resolver) -> None:
    """Scenarios, metrics, then strategies (recipes need the scenarios), each entry on its own."""
    for key, target, fn in (("scenarios", study.scenarios, lambda e, w: _scenario(e, w, data_root, resolver)),
                            ("metrics", study.metrics, lambda e, w: _metric(e, w, resolver)),
                            ("strategies", study.strategies,
                             lambda e, w: _strategy_or_recipe(e, w, study.training, study.scenarios, recipe_folder,
                                                              (study.model or {}).get("name"), resolver))):
        entries = _section(found, lambda key=key: _list(raw.get(key, []), key, empty=key == "metrics"), [])
        for i, entry in enumerate(entries):
            made = _section(found, lambda entry=entry, i=i, fn=fn, key=key: fn(entry, f"{key}[{i}]"), None)
            if made is not None:
                target.append(made)


def _names_and_reference(study: _Draft, raw: dict, found: ErrorList) -> None:
    """Unique names per list, and a reference strategy that exists (default: the first)."""
    for key, items in (("scenarios", study.scenarios), ("strategies", study.strategies), ("metrics", study.metrics)):
        with found.attempt():
            _unique([item["name"] for item in items], key, "name")
    names = [s["name"] for s in study.strategies]
    reference = raw.get("reference", names[0] if names else None)
    if reference is not None and names and reference not in names:
        found.errors.append(f"reference: {reference!r} is not a strategy name; names are {', '.join(names)}")
    study.reference = reference or ""


def _dotted_names(study: _Draft) -> list[str]:
    """The ``package.module:callable`` names the config resolved (a scenario's benchmark, the
    model, a strategy's class and plugins — every scenario's recipe of it —, a metric)."""
    names = [s["benchmark"] for s in study.scenarios] + [study.model["name"]] + [m["name"] for m in study.metrics]
    for strategy in study.strategies:
        for spec in strategy.get("per_scenario", {}).values() or [strategy]:
            names += [spec["class"], *(p["name"] for p in spec["plugins"])]
    return [n for n in names if ":" in n]


def _read(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config: no file {str(path)!r}")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"config: {path} is not valid YAML ({error})") from None
    if path.suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise ConfigError(f"config: reading TOML needs Python >= 3.11 (tomllib); use YAML for {path.name}") from None
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"config: {path} is not valid TOML ({error})") from None
    raise ConfigError(f"config: expected a .yaml, .yml or .toml file, got {path.name!r}")


# ------------------------------------------------------------------------------------------------
# small checks


def _join(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)


def _keys(value, path: str, allowed, required=()) -> dict:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {value!r}")
    errors = [f"{_join(path, key)}: unknown key; expected one of {', '.join(allowed)}"
              for key in value if key not in allowed]
    errors += [f"{_join(path, key)}: required key missing" for key in required if key not in value]
    if errors:
        raise ConfigError(errors)
    return dict(value)


def _list(value, path: str, empty: bool = False) -> list:
    if not isinstance(value, list) or (not value and not empty):
        raise ConfigError(f"{path}: expected a{'' if empty else ' non-empty'} list, got {value!r}")
    return value


def _string(value, path: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{path}: expected a string, got {value!r}")
    return value


def _int(value, path: str, minimum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
        raise ConfigError(f"{path}: expected an integer{f' >= {minimum}' if minimum is not None else ''}, got {value!r}")
    return value


def _kwargs(value, path: str) -> dict:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{path}: expected a mapping of argument names to values, got {value!r}")
    return dict(value)


def _unique(names, path: str, key: str) -> None:
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ConfigError(f"{path}[{i}].{key}: {name!r} is used twice; names must be unique")
        seen.add(name)


def _named(entry, path: str, allowed=("name", "kwargs")) -> dict:
    """``"Name"`` or ``{name: Name, kwargs: {...}}`` → ``{"name", "kwargs"}``."""
    if isinstance(entry, str):
        entry = {"name": entry}
    entry = _keys(entry, path, allowed, required=("name",))
    entry["name"] = _string(entry["name"], _join(path, "name"))
    entry["kwargs"] = _kwargs(entry.get("kwargs", {}), _join(path, "kwargs"))
    return entry


# ------------------------------------------------------------------------------------------------
# sections


def _quick(value) -> dict:
    spec = _keys(value, "quick", _QUICK)
    if "seeds" in spec:
        _int(spec["seeds"], "quick.seeds", minimum=1)
    if "grid" in spec:
        _int(spec["grid"], "quick.grid", minimum=1)
    for key in ("training", "scenarios", "metrics"):
        if key in spec:
            _kwargs(spec[key], f"quick.{key}")
    return spec


def _apply_quick(raw: dict, spec: dict) -> dict:
    """The config with its ``quick:`` overrides (seeds 1 unless it says otherwise)."""
    raw = copy.deepcopy(raw)
    raw["seeds"] = spec.get("seeds", 1)
    raw["training"] = {**raw.get("training", {}), **spec.get("training", {})}
    if isinstance(raw.get("scenarios"), list):  # built-in scenarios only: a factory takes its own kwargs
        raw["scenarios"] = [s if ":" in str(s.get("benchmark", "") if isinstance(s, Mapping) else s)
                            else {**({"benchmark": s} if isinstance(s, str) else s), **spec.get("scenarios", {})}
                            for s in raw["scenarios"]]
    overrides = spec.get("metrics", {})
    for i, metric in enumerate(raw.get("metrics", [])):
        name = metric if isinstance(metric, str) else metric.get("name") if isinstance(metric, Mapping) else None
        if name in overrides:
            base = {"name": name} if isinstance(metric, str) else dict(metric)
            base["kwargs"] = {**base.get("kwargs", {}), **_kwargs(overrides[name], f"quick.metrics.{name}")}
            raw["metrics"][i] = base
    if "grid" in spec:
        for strategy in raw.get("strategies", []):
            if isinstance(strategy, Mapping) and isinstance(strategy.get("grid"), Mapping):
                strategy["grid"] = {k: v[: spec["grid"]] if isinstance(v, list) else v for k, v in strategy["grid"].items()}
    return raw


def _scenario(entry, path: str, data_root, resolver: Resolver) -> dict:
    if isinstance(entry, str):
        entry = {"benchmark": entry}
    spec = _keys(entry, path, _SCENARIO, required=("benchmark",))
    benchmark = _string(spec["benchmark"], f"{path}.benchmark")
    out = {"name": _string(spec.get("name", benchmark.rpartition(":")[2]), f"{path}.name"), "benchmark": benchmark,
           "n_experiences": None, "task_incremental": False, "data_root": spec.get("data_root") or data_root,
           "kwargs": _kwargs(spec.get("kwargs", {}), f"{path}.kwargs")}
    if out["data_root"] is not None:
        _string(out["data_root"], f"{path}.data_root")
    if spec.get("online") is not None:
        out["online"] = _online(spec["online"], f"{path}.online")
    if ":" in benchmark:
        factory = resolver.resolve(benchmark, f"{path}.benchmark")
        for key in ("n_experiences", "task_incremental", "data_root", "train_per_class", "test_per_class"):
            if spec.get(key) is not None:
                raise ConfigError(f"{path}.{key}: a benchmark factory takes its arguments in {path}.kwargs")
        out["data_root"] = None
        params, _, accepts_any, _ = parameters(factory)
        check_arguments(factory, out["kwargs"], f"{path}.kwargs",
                        injected=[n for n in ("seed", "validation") if n in params],
                        label=benchmark)
        return out
    known = builtin_scenarios()
    if benchmark not in known:
        raise ConfigError(f"{path}.benchmark: expected one of {', '.join(known)} or "
                          f"'package.module:callable', got {benchmark!r}")
    if out["kwargs"]:
        raise ConfigError(f"{path}.kwargs: only a 'package.module:callable' benchmark takes kwargs")
    if spec.get("n_experiences") is not None:
        out["n_experiences"] = _int(spec["n_experiences"], f"{path}.n_experiences", minimum=1)
        _, kind, dataset = dataset_of(benchmark)
        total = dataset.n_classes
        if kind == "split" and (total % out["n_experiences"] or out["n_experiences"] > total):
            divisors = [d for d in range(1, total + 1) if total % d == 0]
            raise ConfigError(f"{path}.n_experiences: {benchmark} has {total} classes, which "
                              f"{out['n_experiences']} experiences do not divide evenly; use one of "
                              f"{', '.join(map(str, divisors))}")
    task_incremental = spec.get("task_incremental", False)
    if not isinstance(task_incremental, bool):
        raise ConfigError(f"{path}.task_incremental: expected true or false, got {task_incremental!r}")
    out["task_incremental"] = task_incremental
    for key in ("train_per_class", "test_per_class"):
        if spec.get(key) is not None:
            out[key] = _int(spec[key], f"{path}.{key}", minimum=1)
    return out


def _online(entry, path: str) -> dict:
    """A scenario's ``online:``: ``{experience_size: N, access_task_boundaries: false}``."""
    spec = _keys(entry, path, _ONLINE, required=("experience_size",))
    access = spec.get("access_task_boundaries", False)
    if not isinstance(access, bool):
        raise ConfigError(f"{path}.access_task_boundaries: expected true or false, got {access!r}")
    return {"experience_size": _int(spec["experience_size"], f"{path}.experience_size", minimum=1),
            "access_task_boundaries": access}


def _model(entry, resolver: Resolver) -> dict:
    spec = _named(entry, "model")
    factory = model_factory(spec["name"], "model.name", resolver)
    if factory is None:  # a zoo model: its kwargs against its class, without what the study injects
        from avalanche_plugins.study.catalog.zoo import ZOO

        entry = ZOO[spec["name"]]
        check_arguments(entry.target, spec["kwargs"], "model.kwargs", injected=entry.injected,
                        label=f"model {spec['name']!r}")
    else:
        params, _, _, _ = parameters(factory)
        check_arguments(factory, spec["kwargs"], "model.kwargs", injected=[n for n in MODEL_INJECTED if n in params],
                        label=spec["name"])
    return spec


def _training(value, path: str, defaults: Mapping | None) -> dict:
    found = ErrorList()
    spec = {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: expected a mapping, got {value!r}")
    for key, given in value.items():
        with found.attempt():
            if key not in TRAINING_DEFAULTS:
                raise ConfigError(f"{_join(path, key)}: unknown key; expected one of {', '.join(TRAINING_DEFAULTS)}")
            _training_value(key, given, f"{path}.{key}")
            spec[key] = given
    found.raise_if_any()
    return {**(defaults or {}), **spec}


def _training_value(key: str, given, where: str) -> None:
    if key == "optimizer" and given not in OPTIMIZERS:
        raise ConfigError(f"{where}: expected one of {', '.join(OPTIMIZERS)}, got {given!r}")
    if key == "device":
        _string(given, where)
    if key in ("epochs", "batch_size", "eval_batch_size"):
        _int(given, where, minimum=1)
    if key in ("lr", "momentum", "weight_decay"):
        check_value(given, float, None, where)
        if given < 0 or (key == "lr" and given == 0):
            raise ConfigError(f"{where}: expected a {'positive' if key == 'lr' else 'non-negative'} number, got {given!r}")


def _strategy_or_recipe(entry, path: str, training: dict, scenarios: list[dict], folder, model=None,
                        resolver: Resolver | None = None) -> dict:
    """A strategy entry; with ``recipe:``, validated once per scenario with that scenario's recipe
    merged in (``per_scenario``: ``{scenario name: spec with "recipe" and "overridden"}``)."""
    if not isinstance(entry, Mapping) or entry.get("recipe") in (None, False):
        return _strategy(entry, path, training, resolver)
    from avalanche_plugins.study.describe.recipes import find_recipe, merge_recipe

    name = _string(entry.get("name"), f"{path}.name")
    recipe = entry["recipe"]
    if recipe is not True and not isinstance(recipe, str):
        raise ConfigError(f"{path}.recipe: expected true or a recipe name, got {recipe!r}")
    found, per = ErrorList(), {}
    for scenario in scenarios:
        with found.attempt():
            label, shipped = find_recipe(scenario, name if recipe is True else recipe, f"{path}.recipe", folder,
                                         model=model)
            merged, overridden = merge_recipe(dict(entry), shipped)
            spec = _strategy(merged, path, training, resolver)
            per[scenario["name"]] = {**spec, "recipe": label, "overridden": overridden}
    found.raise_if_any()
    if not per:
        raise ConfigError(f"{path}.recipe: the study has no scenario to take a recipe for")
    return {"name": name, "per_scenario": per}


def _strategy(entry, path: str, training: dict, resolver: Resolver | None = None) -> dict:
    """One strategy entry; every problem in it is reported (one ``ConfigError`` listing them)."""
    if isinstance(entry, str):
        entry = {"name": entry}
    spec = _keys(entry, path, _STRATEGY, required=("name",))
    name = _string(spec["name"], f"{path}.name")
    found = ErrorList()
    plugins = []
    with found.attempt():
        for i, p in enumerate(_list(spec.get("plugins", []), f"{path}.plugins", empty=True)):
            with found.attempt():
                plugins.append(_named(p, f"{path}.plugins[{i}]"))
    cls_name = _string(spec.get("class", "Naive" if spec.get("plugins") else name), f"{path}.class")
    where_cls = f"{path}.class" if "class" in spec else f"{path}.name"
    cls = None
    with found.attempt():
        cls = strategy_class(cls_name, where_cls, resolver)
    kwargs = grid = {}
    with found.attempt():
        kwargs = _kwargs(spec.get("kwargs", {}), f"{path}.kwargs")
    with found.attempt():
        grid = _kwargs(spec.get("grid", {}), f"{path}.grid")
    out = {"name": name, "class": cls_name, "kwargs": kwargs, "plugins": plugins, "grid": {}, "training": {}}
    with found.attempt():
        out["training"] = _training(spec.get("training", {}), f"{path}.training", defaults=None)
    classes = []
    for i, p in enumerate(plugins):
        classes.append(None)
        with found.attempt():
            classes[i] = plugin_class(p["name"], f"{path}.plugins[{i}].name", resolver)
    targets = out[_GRID_TARGETS] = {}  # grid key → (kind, plugin index, argument): parsed here only
    for key, values in grid.items():
        with found.attempt():
            targets[key] = _grid_target(key, values, path, plugins)
            out["grid"][key] = values
    for i, (plugin, plugin_cls) in enumerate(zip(plugins, classes)):
        if plugin_cls is None:
            continue
        optional = [a for kind, index, a in targets.values() if kind == "plugin" and index == i]
        with found.attempt():
            check_arguments(plugin_cls, plugin["kwargs"], f"{path}.plugins[{i}].kwargs", optional=optional,
                            label=plugin["name"])
    if cls is not None:
        optional = [a for kind, _, a in targets.values() if kind == "strategy"]
        with found.attempt():
            check_arguments(cls, kwargs, f"{path}.kwargs", injected=STRATEGY_INJECTED, optional=optional,
                            label=cls_name)
    for key, (kind, index, argument) in targets.items():
        target = cls if kind == "strategy" else classes[index] if kind == "plugin" else None
        if target is None:
            continue
        with found.attempt():
            params, _, _, hints = parameters(target)
            if argument not in params or (kind == "strategy" and argument in STRATEGY_INJECTED):
                label = cls_name if kind == "strategy" else plugins[index]["name"]
                raise ConfigError(f"{path}.grid.{key}: {label} has no argument {argument!r}")
            for j, value in enumerate(out["grid"][key]):
                with found.attempt():
                    check_value(value, hints.get(argument, params[argument].annotation), params[argument].default,
                                f"{path}.grid.{key}[{j}]")
    found.raise_if_any()
    return out


_GRID_TARGETS = "_grid_targets"  # a draft strategy's {grid key: (kind, plugin index, argument)}, parsed once


def _grid_target(key: str, values, path: str, plugins: list[dict]) -> tuple[str, int | None, str]:
    """Where a grid key goes (:func:`~avalanche_plugins.study.contracts.grid.grid_target`), its values checked
    where the target is known here (training values)."""
    where = f"{path}.grid.{key}"
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{where}: expected a non-empty list of values, got {values!r}")
    kind, index, argument = grid_target(key, plugins, where)
    if kind == "training":
        if argument not in TRAINING_DEFAULTS:
            raise ConfigError(f"{where}: training has no key {argument!r}; expected one of {', '.join(TRAINING_DEFAULTS)}")
        found = ErrorList()
        for j, value in enumerate(values):
            with found.attempt():
                _training_value(argument, value, f"{where}[{j}]")
        found.raise_if_any()
    return kind, index, argument


def _metric(entry, path: str, resolver: Resolver | None = None) -> dict:
    spec = _named(entry, path)
    if spec["name"] in ATTACHED:
        raise ConfigError(f"{path}.name: {spec['name']} is attached to every run already")
    factory = metric_factory(spec["name"], f"{path}.name", resolver)
    kwargs, injected, optional = check_kwargs(spec["name"], spec["kwargs"])  # the diagnostics catalog's
    check_arguments(factory, kwargs, f"{path}.kwargs", injected=injected, optional=optional, label=spec["name"])
    return spec


def _loggers(value) -> list[str]:
    for i, name in enumerate(_list(value, "loggers", empty=True)):
        if name not in LOGGERS:
            raise ConfigError(f"loggers[{i}]: expected one of {', '.join(LOGGERS)}, got {name!r}")
    return list(value)
