"""Research plugins and metrics for Avalanche continual learning."""

from avalanche_plugins.ads_metric import ArchitectureDrivenShiftMetric
from avalanche_plugins.layer_adaptive_ewc import LayerAdaptiveEWCPlugin
from avalanche_plugins.layer_adaptive_lr import LayerAdaptiveLRPlugin
from avalanche_plugins.layer_sensitivity import LayerSensitivityMetric
from avalanche_plugins.readiness_metric import OptimizationReadinessMetric
from avalanche_plugins.structural_metrics import CycleAccuracyMetric, NewbornGradientMetric
from avalanche_plugins.structural_plasticity import (
    FixedMaskPlugin,
    GrowPlugin,
    PrunePlugin,
    retrain_ticket,
)
from avalanche_plugins.transport_metric import TransportKeyMetric

__all__ = [
    "ArchitectureDrivenShiftMetric",
    "CycleAccuracyMetric",
    "FixedMaskPlugin",
    "GrowPlugin",
    "LayerAdaptiveEWCPlugin",
    "LayerAdaptiveLRPlugin",
    "LayerSensitivityMetric",
    "NewbornGradientMetric",
    "OptimizationReadinessMetric",
    "PrunePlugin",
    "TransportKeyMetric",
    "retrain_ticket",
]
__version__ = "0.1.0"
