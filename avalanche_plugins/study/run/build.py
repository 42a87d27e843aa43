"""One study run's pieces from its specs: stream, model, plugins, evaluator, strategy.

Called inside the job's process (local pool or Ray worker), so every object is built where it
runs. What the study supplies that a config cannot:

* a dotted **benchmark factory** gets ``seed`` (and ``validation=True`` for tuning runs) when it
  accepts them; it may return a ``avalanche_plugins.study.catalog.datasets.Stream`` or an Avalanche benchmark
  (input shape read from its first sample, classes from ``n_classes`` or the targets);
* a dotted **model** callable gets ``input_shape`` ``(C, H, W)``, ``n_classes`` and ``multihead``
  (task-incremental scenario) when it accepts them, on top of its kwargs;
* **metrics**: what each configured metric gets from the run (a stream, a plugin, stages chosen
  for the model) and what the study adds by itself are the diagnostics catalog's
  (:mod:`avalanche_plugins.study.catalog.diagnostics`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from avalanche_plugins.study.catalog.diagnostics import (
    RunContext,
    always_metrics,
    configured_metrics,
    run_analyses,
)
from avalanche_plugins.study.catalog.registry import (
    ConfigError,
    metric_factory,
    parameters,
    plugin_class,
    resolve_dotted,
    strategy_class,
)
from avalanche_plugins.study.catalog.scenarios import dataset_of
from avalanche_plugins.study.contracts.specs import ModelSpec, RunSpec, ScenarioSpec, TrainingSpec

__all__ = ["check_model_builds", "build_evaluator", "build_model", "build_optimizer",
           "build_plugins", "build_stream", "build_strategy", "resolve_device"]


def build_stream(scenario: ScenarioSpec, seed: int, validation: bool):
    """The scenario's ``Stream`` for ``seed`` (class order, permutations, validation split)."""
    from avalanche_plugins.study.catalog.datasets import Stream, make_stream

    if not scenario.is_factory:
        dataset, kind, _ = dataset_of(scenario.benchmark)
        extra = {} if scenario.n_experiences is None else {"n_experiences": scenario.n_experiences}
        extra.update({k: v for k in ("train_per_class", "test_per_class") if (v := getattr(scenario, k)) is not None})
        return make_stream(dataset, kind, task_incremental=scenario.task_incremental,
                           data_root=scenario.data_root, seed=seed, validation=validation, **extra)
    factory = resolve_dotted(scenario.benchmark, "benchmark")
    params = parameters(factory)[0]
    kwargs = dict(scenario.kwargs)
    if "seed" in params:
        kwargs["seed"] = seed
    if validation:
        if "validation" not in params:
            raise ValueError(f"benchmark {scenario.benchmark!r} takes no 'validation' argument: a grid needs "
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
    return Stream(made, tuple(x.shape), n_classes, len(tasks) > 1, scenario.benchmark)


def build_model(spec: ModelSpec, stream) -> nn.Module:
    """The study's model for ``stream``: a zoo model, or the user's callable given what it accepts
    of ``input_shape``, ``n_classes`` and ``multihead``."""
    from avalanche_plugins.study.catalog.zoo import build_model as zoo

    if not spec.modules():
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.kwargs.items()}
        return zoo(spec.name, stream.input_shape, stream.n_classes, multihead=stream.task_incremental, **kwargs)
    factory = resolve_dotted(spec.name, "model.name")
    params, _, accepts_any, _ = parameters(factory)
    given = {"input_shape": tuple(stream.input_shape), "n_classes": stream.n_classes,
             "multihead": stream.task_incremental}
    return factory(**spec.kwargs, **{k: v for k, v in given.items() if k in params or accepts_any})


def build_optimizer(model: nn.Module, training: TrainingSpec) -> torch.optim.Optimizer:
    """The run's optimizer (SGD with momentum, Adam or AdamW) over every parameter of ``model``."""
    lr, decay = training.lr, training.weight_decay
    if training.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=training.momentum, weight_decay=decay)
    cls = torch.optim.Adam if training.optimizer == "adam" else torch.optim.AdamW
    return cls(model.parameters(), lr=lr, weight_decay=decay)


def _value(v):  # YAML lists stand for tuples in kwargs such as hidden=(64, 64)
    return tuple(v) if isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) else v


def build_plugins(specs) -> list:
    """The run's plugins from their specs (YAML lists as tuples in their kwargs)."""
    return [plugin_class(p.name, "plugin")(**{k: _value(v) for k, v in p.kwargs.items()}) for p in specs]


def build_evaluator(metric_specs, stream, model, plugins, *, tidy_path, context: dict,
                    images: bool, loggers=(), log_dir=None, run_name: str = "run", project: str = "study",
                    task_il: bool = False):
    """One ``EvaluationPlugin``: accuracy / forgetting / BWT (and task-incremental accuracy with
    ``task_il``), the configured metrics with what the diagnostics catalog says each gets from the
    run (:mod:`~avalanche_plugins.study.catalog.diagnostics`), the study's own analyses, and a
    ``TidyCSVLogger`` (plus the configured TensorBoard / W&B / text loggers). Returns
    ``(evaluator, loggers, configured metrics)``."""
    from avalanche.training.plugins import EvaluationPlugin

    from avalanche_plugins import TidyCSVLogger

    run = RunContext(stream, model, list(plugins))
    configured = configured_metrics(metric_specs, run, factory=lambda name: metric_factory(name, "metric"),
                                    value=_value)
    metrics = [*always_metrics(task_il), *configured, *run_analyses(run)]
    tidy = TidyCSVLogger(tidy_path, context=context, images=images, defer_images=True)  # drawn after training
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


def build_strategy(spec: RunSpec, model: nn.Module, training: TrainingSpec, plugins: list, evaluator):
    """The configured strategy class with the study's model, optimizer, loss, batch sizes and
    evaluator (SynapticIntelligence with the package's CPU fix; the optimizer follows a model the
    strategy replaces mid online experience, e.g. online GDumb)."""
    from avalanche_plugins import fix_replaced_model_optimizer, fix_synaptic_intelligence_on_cpu

    fix_synaptic_intelligence_on_cpu()  # Avalanche 0.6's SI is a no-op on CPU without it
    fix_replaced_model_optimizer()  # else online GDumb never optimizes its fresh models (no-op otherwise)
    cls = strategy_class(spec.cls, "class")
    kwargs = {k: _value(v) for k, v in spec.kwargs.items()}
    return cls(model=model, optimizer=build_optimizer(model, training), criterion=nn.CrossEntropyLoss(),
               train_mb_size=training.batch_size, train_epochs=training.epochs,
               eval_mb_size=training.eval_batch_size, device=resolve_device(training.device), plugins=plugins,
               evaluator=evaluator, **kwargs)


def check_model_builds(model: ModelSpec, scenario: ScenarioSpec, where: str) -> None:
    """Build the study's model for a built-in scenario's input shape and class count and run it
    on two zero inputs (``ConfigError`` naming ``model`` and the scenario otherwise). Scenarios
    from a benchmark factory are checked when the run builds them."""
    if scenario.is_factory:
        return
    from avalanche.models import avalanche_forward

    from avalanche_plugins.study.catalog.datasets import Stream

    _, kind, dataset = dataset_of(scenario.benchmark)
    shape, total = dataset.input_shape, dataset.n_classes
    n_exp = scenario.n_experiences or 5
    n_classes = total // n_exp if scenario.task_incremental and kind == "split" else total
    stream = Stream(None, shape, n_classes, scenario.task_incremental, scenario.benchmark)
    try:
        net = build_model(model, stream)
        with torch.no_grad():
            avalanche_forward(net.eval(), torch.zeros(2, *shape), torch.zeros(2, dtype=torch.long))
    except Exception as error:  # noqa: BLE001 - any failure to build or run is the config's error
        raise ConfigError(f"model: {model.name!r} cannot be built for or run on {where} "
                          f"({scenario.name}: input shape {shape}, {n_classes} classes): "
                          f"{type(error).__name__}: {error}") from None
