"""One study run's pieces from its specs: stream, model, plugins, evaluator, strategy.

Called inside the job's process (local pool or Ray worker), so every object is built where it
runs. What the study supplies that a config cannot:

* a dotted **benchmark factory** gets ``seed`` (and ``validation=True`` for tuning runs) when it
  accepts them; it may return a ``avalanche_plugins.study.harness.data.Stream`` or an Avalanche benchmark
  (input shape read from its first sample, classes from ``n_classes`` or the targets);
* a dotted **model** callable gets ``input_shape`` ``(C, H, W)``, ``n_classes`` and ``multihead``
  (task-incremental scenario) when it accepts them, on top of its kwargs;
* **metrics**: ``CycleAccuracyMetric`` gets the run's test stream (and the cycle of its Grow /
  Prune plugin); ``NewbornGradientMetric`` the run's ``GrowPlugin(track_newborn=True)`` (runs
  without one go without it); ``TransportKeyMetric`` without ``stages`` (or ``stages: auto``) gets
  up to three stages (:func:`auto_stages`); runs with a Grow / Prune / FixedMask plugin also get
  :class:`CompactnessMetric`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from avalanche.evaluation import PluginMetric
from avalanche.evaluation.metric_results import MetricValue
from avalanche.evaluation.metric_utils import get_metric_name
from torch import nn

from avalanche_plugins.study.registry import (
    ConfigError,
    metric_factory,
    parameters,
    plugin_class,
    resolve_dotted,
    strategy_class,
)
from avalanche_plugins.study.scenarios import BUILTIN_SCENARIOS, INPUT_SHAPES

__all__ = ["CompactnessMetric", "auto_stages", "check_model_builds", "build_evaluator", "build_model", "build_optimizer",
           "build_plugins", "build_stream", "build_strategy", "resolve_device"]


def build_stream(scenario: dict, seed: int, validation: bool):
    """The scenario's ``Stream`` for ``seed`` (class order, permutations, validation split)."""
    from avalanche_plugins.study.harness.data import Stream, make_stream

    if ":" not in scenario["benchmark"]:
        dataset, kind = BUILTIN_SCENARIOS[scenario["benchmark"]]
        extra = {} if scenario["n_experiences"] is None else {"n_experiences": scenario["n_experiences"]}
        return make_stream(dataset, kind, task_incremental=scenario["task_incremental"],
                           data_root=scenario["data_root"], seed=seed, validation=validation, **extra)
    factory = resolve_dotted(scenario["benchmark"], "benchmark")
    params = parameters(factory)[0]
    kwargs = dict(scenario["kwargs"])
    if "seed" in params:
        kwargs["seed"] = seed
    if validation:
        if "validation" not in params:
            raise ValueError(f"benchmark {scenario['benchmark']!r} takes no 'validation' argument: a grid needs "
                             "a validation split")
        kwargs["validation"] = True
    made = factory(**kwargs)
    if isinstance(made, Stream):
        return made
    train = made.train_stream
    x = train[0].dataset[0][0]
    n_classes = getattr(made, "n_classes", None)
    if not isinstance(n_classes, int):
        n_classes = 1 + max(int(max(exp.dataset.targets)) for exp in train)
    tasks = {t for exp in train for t in getattr(exp, "task_labels", [0])}
    return Stream(made, tuple(x.shape), n_classes, len(tasks) > 1, scenario["benchmark"])


def build_model(spec: dict, stream) -> nn.Module:
    from avalanche_plugins.study.harness.models import build_model as zoo

    if ":" not in spec["name"]:
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["kwargs"].items()}
        return zoo(spec["name"], stream.input_shape, stream.n_classes, multihead=stream.task_incremental, **kwargs)
    factory = resolve_dotted(spec["name"], "model.name")
    params, _, accepts_any, _ = parameters(factory)
    given = {"input_shape": tuple(stream.input_shape), "n_classes": stream.n_classes,
             "multihead": stream.task_incremental}
    return factory(**spec["kwargs"], **{k: v for k, v in given.items() if k in params or accepts_any})


def build_optimizer(model: nn.Module, training: dict) -> torch.optim.Optimizer:
    lr, decay = training["lr"], training["weight_decay"]
    if training["optimizer"] == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=training["momentum"], weight_decay=decay)
    cls = torch.optim.Adam if training["optimizer"] == "adam" else torch.optim.AdamW
    return cls(model.parameters(), lr=lr, weight_decay=decay)


def _value(v):  # YAML lists stand for tuples in kwargs such as hidden=(64, 64)
    return tuple(v) if isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) else v


def build_plugins(specs: list[dict]) -> list:
    return [plugin_class(p["name"], "plugin")(**{k: _value(v) for k, v in p["kwargs"].items()}) for p in specs]


class CompactnessMetric(PluginMetric[float]):
    """Fraction of hidden units active (``masks.compactness()``) of the run's Grow / Prune /
    FixedMask plugin after every training epoch, as ``Compactness/train_phase/...``."""

    def __init__(self, plugin):
        super().__init__()
        self.plugin, self.value = plugin, None

    def result(self):
        return self.value

    def reset(self):
        self.value = None

    def __str__(self):
        return "Compactness"

    def after_training_epoch(self, strategy):
        masks = getattr(self.plugin, "masks", None)
        if masks is None:
            return None
        self.value = float(masks.compactness())
        name = get_metric_name(self, strategy, add_experience=True, add_task=True)
        return [MetricValue(self, name, self.value, strategy.clock.train_iterations)]


def auto_stages(model: nn.Module, x: torch.Tensor, task_labels: torch.Tensor, max_stages: int = 3) -> list[str]:
    """Up to ``max_stages`` stitching stages, evenly spread: for every parametrised layer after the
    first (the layer map's order), the outermost module that can cut the model
    (``split_points``) and finishes right before that layer starts."""
    from avalanche.models import avalanche_forward

    from avalanche_plugins.core.layers import discover_layers
    from avalanche_plugins.core.split import split_points

    class OneTask(nn.Module):  # a plain forward(x) for multi-task models
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, inputs):
            return avalanche_forward(self.m, inputs, task_labels)

    wrapped = OneTask()
    layers = [layer.name for layer in discover_layers(wrapped, x)]
    try:
        points = set(split_points(wrapped, x))
    except TypeError:  # a multi-task model cannot be cut as a whole: its trunk can
        points = set()
        for name, child in model.named_children():
            try:
                points |= {f"m.{name}", *(f"m.{name}.{p}" for p in split_points(child, x))}
            except (TypeError, RuntimeError, ValueError):
                continue
    events, hooks = [], []
    for name, module in wrapped.named_modules():
        if name:
            hooks.append(module.register_forward_pre_hook(lambda *_, n=name: events.append(("start", n))))
            hooks.append(module.register_forward_hook(lambda *_, n=name: events.append(("end", n))))
    try:
        with torch.no_grad():
            wrapped(x)
    finally:
        for hook in hooks:
            hook.remove()
    stages: list[str] = []
    for layer in layers[1:]:
        before = [n for kind, n in events[:events.index(("start", layer))] if kind == "end" and n in points]
        if before and before[-1][2:] not in stages:
            stages.append(before[-1][2:])
    if len(stages) > max_stages:
        stages = [stages[i] for i in dict.fromkeys(np.linspace(0, len(stages) - 1, max_stages).round().astype(int))]
    if not stages:
        raise ValueError(f"TransportKeyMetric: found no stage to stitch at in {type(model).__name__}; "
                         "give metrics[...].kwargs.stages")
    return stages


def _example(stream, n: int = 8):
    data = stream.benchmark.train_stream[0].dataset
    items = [data[i] for i in range(min(n, len(data)))]
    x = torch.stack([item[0] for item in items])
    t = torch.as_tensor([int(item[-1]) if len(item) > 2 else 0 for item in items])
    return x, t


def build_evaluator(metric_specs: list[dict], stream, model, plugins, *, tidy_path, context: dict,
                    images: bool, loggers=(), log_dir=None, run_name: str = "run", project: str = "study",
                    task_il: bool = False):
    """One ``EvaluationPlugin``: accuracy / forgetting / BWT (and task-incremental accuracy with
    ``task_il``), the configured metrics, and a ``TidyCSVLogger`` (plus the configured
    TensorBoard / W&B / text loggers). Returns ``(evaluator, loggers, configured metrics)``."""
    from avalanche.evaluation.metrics import accuracy_metrics, bwt_metrics, forgetting_metrics
    from avalanche.training.plugins import EvaluationPlugin

    from avalanche_plugins import TidyCSVLogger
    from avalanche_plugins.study.task_il_metric import TaskILAccuracyMetric

    metrics = [*accuracy_metrics(experience=True, stream=True), *forgetting_metrics(experience=True, stream=True),
               *bwt_metrics(experience=True, stream=True)]
    if task_il:
        metrics.append(TaskILAccuracyMetric())
    configured = []
    editing = [p for p in plugins if hasattr(p, "masks") and hasattr(p, "clock")]
    for spec in metric_specs:
        kwargs = {k: _value(v) for k, v in spec["kwargs"].items()}
        name = spec["name"]
        if name == "CycleAccuracyMetric":
            kwargs["test_stream"] = stream.benchmark.test_stream
            if editing:
                kwargs.setdefault("epochs_per_cycle", editing[0].clock.epochs_per_cycle)
                kwargs.setdefault("cycle_scope", editing[0].clock.scope)
        elif name == "NewbornGradientMetric":
            growing = [p for p in plugins if getattr(p, "track_newborn", False)]
            if not growing:
                continue
            kwargs["grow_plugin"] = growing[0]
        elif name == "TransportKeyMetric" and kwargs.get("stages", "auto") == "auto":
            kwargs["stages"] = auto_stages(model, *_example(stream))
        made = metric_factory(name, "metric")(**kwargs)
        configured += list(made) if isinstance(made, (list, tuple)) else [made]
    metrics += [*configured, *(CompactnessMetric(p) for p in editing)]
    tidy = TidyCSVLogger(tidy_path, context=context, images=images)
    all_loggers = [tidy, *_extra_loggers(loggers, log_dir, run_name, project)]
    return EvaluationPlugin(*metrics, loggers=all_loggers, collect_all=False), all_loggers, configured


def _extra_loggers(names, log_dir, run_name: str, project: str) -> list:
    import avalanche.logging as logging

    from avalanche_plugins import fix_text_loggers, fix_wandb_logger

    out = []
    root = Path(log_dir) if log_dir is not None else Path("study_logs")
    for name in names:
        if name == "tensorboard":
            out.append(logging.TensorboardLogger(tb_log_dir=str(root / "tensorboard" / run_name)))
        elif name == "wandb":
            os.environ.setdefault("WANDB_MODE", "offline")
            os.environ.setdefault("WANDB_SILENT", "true")
            fix_wandb_logger()
            (root / "wandb").mkdir(parents=True, exist_ok=True)
            out.append(logging.WandBLogger(project_name=project, run_name=run_name, dir=str(root / "wandb"),
                                           save_code=False))
        elif name == "text":
            fix_text_loggers()
            path = root / "text" / f"{run_name}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            out.append(logging.TextLogger(open(path, "w")))
    return out


def resolve_device(name: str) -> str:
    """``"auto"``: CUDA when available, else the CPU; any other name as given."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def build_strategy(spec: dict, model: nn.Module, training: dict, plugins: list, evaluator):
    """The configured strategy class with the study's model, optimizer, loss, batch sizes and
    evaluator (SynapticIntelligence with the package's CPU fix)."""
    from avalanche_plugins import fix_synaptic_intelligence_on_cpu

    fix_synaptic_intelligence_on_cpu()  # Avalanche 0.6's SI is a no-op on CPU without it
    cls = strategy_class(spec["class"], "class")
    kwargs = {k: _value(v) for k, v in spec["kwargs"].items()}
    return cls(model=model, optimizer=build_optimizer(model, training), criterion=nn.CrossEntropyLoss(),
               train_mb_size=training["batch_size"], train_epochs=training["epochs"],
               eval_mb_size=training["eval_batch_size"], device=resolve_device(training["device"]), plugins=plugins,
               evaluator=evaluator, **kwargs)


def check_model_builds(model: dict, scenario: dict, where: str) -> None:
    """Build the study's model for a built-in scenario's input shape and class count and run it
    on two zero inputs (``ConfigError`` naming ``model`` and the scenario otherwise). Scenarios
    from a benchmark factory are checked when the run builds them."""
    if ":" in scenario["benchmark"]:
        return
    from avalanche.models import avalanche_forward

    from avalanche_plugins.study.harness.data import N_CLASSES, Stream

    dataset, kind = BUILTIN_SCENARIOS[scenario["benchmark"]]
    shape, total = INPUT_SHAPES[dataset], N_CLASSES[dataset]
    n_exp = scenario["n_experiences"] or 5
    n_classes = total // n_exp if scenario["task_incremental"] and kind == "split" else total
    stream = Stream(None, shape, n_classes, scenario["task_incremental"], scenario["benchmark"])
    try:
        net = build_model(model, stream)
        with torch.no_grad():
            avalanche_forward(net.eval(), torch.zeros(2, *shape), torch.zeros(2, dtype=torch.long))
    except Exception as error:  # noqa: BLE001 - any failure to build or run is the config's error
        raise ConfigError(f"model: {model['name']!r} cannot be built for or run on {where} "
                          f"({scenario['name']}: input shape {shape}, {n_classes} classes): "
                          f"{type(error).__name__}: {error}") from None
