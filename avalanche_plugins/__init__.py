"""Research plugins and metrics for Avalanche continual learning.

One subpackage per result, each split into plain-PyTorch estimators and thin Avalanche adapters
(the files named ``*plugin*.py`` / ``*metric*.py``):

* :mod:`avalanche_plugins.core` — the layer map, stateless model calls, argument checks, one
  functional optimizer step, rank statistics (torch only).
* :mod:`avalanche_plugins.layer_adaptive` — per-layer Hessian spectrum, Fisher, λ_ℓ schedules;
  :class:`LayerAdaptiveEWCPlugin`, :class:`LayerAdaptiveLRPlugin`, :class:`LayerSensitivityMetric`,
  :class:`ClassifierAlignmentPlugin` (SLCA's classifier alignment).
* :mod:`avalanche_plugins.structural` — unit masks, grow/prune edits and scores;
  :class:`GrowPlugin`, :class:`PrunePlugin`, :class:`FixedMaskPlugin`, cycle/newborn metrics.
* :mod:`avalanche_plugins.readiness` — Optimization Readiness, k-step gain, label-agnostic
  baselines; :class:`OptimizationReadinessMetric`.
* :mod:`avalanche_plugins.ads` — Architecture-Driven Shift and its ground truth;
  :class:`ArchitectureDrivenShiftMetric`.
* :mod:`avalanche_plugins.transport` — transport keys, stitching, refinement, controls;
  :class:`TransportKeyMetric`.

The names below are imported lazily (PEP 562), so ``import avalanche_plugins.core.layers`` or any
other estimator module never imports ``avalanche``; only touching an adapter name does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what editors and type checkers see; at run time the names load lazily below
    # ruff: noqa: F401 (re-exported through __all__ = sorted(_EXPORTS), which ruff cannot read)
    from avalanche_plugins._avalanche.compat import (
        fix_checkpoint_pickling,
        fix_replaced_model_optimizer,
        fix_synaptic_intelligence_on_cpu,
        fix_text_loggers,
        fix_wandb_logger,
        save_checkpoint,
    )
    from avalanche_plugins._avalanche.evaluation import quiet_evaluator, stream_accuracy
    from avalanche_plugins._avalanche.task_il import TaskILAccuracyMetric
    from avalanche_plugins._avalanche.tidy_logger import TidyCSVLogger
    from avalanche_plugins.ads.metric import ArchitectureDrivenShiftMetric
    from avalanche_plugins.layer_adaptive.alignment_plugin import ClassifierAlignmentPlugin
    from avalanche_plugins.layer_adaptive.ewc_plugin import LayerAdaptiveEWCPlugin
    from avalanche_plugins.layer_adaptive.lr_plugin import LayerAdaptiveLRPlugin
    from avalanche_plugins.layer_adaptive.sensitivity_metric import LayerSensitivityMetric
    from avalanche_plugins.readiness.metric import OptimizationReadinessMetric
    from avalanche_plugins.structural.metrics import CycleAccuracyMetric, NewbornGradientMetric
    from avalanche_plugins.structural.plugins import (
        FixedMaskPlugin,
        GrowPlugin,
        PrunePlugin,
        retrain_ticket,
    )
    from avalanche_plugins.transport.metric import TransportKeyMetric

__version__ = "0.2.0"

_EXPORTS = {
    "ArchitectureDrivenShiftMetric": "avalanche_plugins.ads.metric",
    "ClassifierAlignmentPlugin": "avalanche_plugins.layer_adaptive.alignment_plugin",
    "CycleAccuracyMetric": "avalanche_plugins.structural.metrics",
    "FixedMaskPlugin": "avalanche_plugins.structural.plugins",
    "GrowPlugin": "avalanche_plugins.structural.plugins",
    "LayerAdaptiveEWCPlugin": "avalanche_plugins.layer_adaptive.ewc_plugin",
    "LayerAdaptiveLRPlugin": "avalanche_plugins.layer_adaptive.lr_plugin",
    "LayerSensitivityMetric": "avalanche_plugins.layer_adaptive.sensitivity_metric",
    "NewbornGradientMetric": "avalanche_plugins.structural.metrics",
    "OptimizationReadinessMetric": "avalanche_plugins.readiness.metric",
    "PrunePlugin": "avalanche_plugins.structural.plugins",
    "TaskILAccuracyMetric": "avalanche_plugins._avalanche.task_il",
    "TidyCSVLogger": "avalanche_plugins._avalanche.tidy_logger",
    "TransportKeyMetric": "avalanche_plugins.transport.metric",
    "retrain_ticket": "avalanche_plugins.structural.plugins",
    "fix_checkpoint_pickling": "avalanche_plugins._avalanche.compat",
    "fix_replaced_model_optimizer": "avalanche_plugins._avalanche.compat",
    "fix_synaptic_intelligence_on_cpu": "avalanche_plugins._avalanche.compat",
    "fix_text_loggers": "avalanche_plugins._avalanche.compat",
    "fix_wandb_logger": "avalanche_plugins._avalanche.compat",
    "quiet_evaluator": "avalanche_plugins._avalanche.evaluation",
    "save_checkpoint": "avalanche_plugins._avalanche.compat",
    "stream_accuracy": "avalanche_plugins._avalanche.evaluation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'avalanche_plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
