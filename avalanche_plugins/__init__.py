"""Research plugins and metrics for Avalanche continual learning."""

from avalanche_plugins.layer_adaptive_ewc import LayerAdaptiveEWCPlugin
from avalanche_plugins.layer_adaptive_lr import LayerAdaptiveLRPlugin
from avalanche_plugins.layer_sensitivity import LayerSensitivityMetric
from avalanche_plugins.readiness_metric import OptimizationReadinessMetric

__all__ = [
    "LayerAdaptiveEWCPlugin",
    "LayerAdaptiveLRPlugin",
    "LayerSensitivityMetric",
    "OptimizationReadinessMetric",
]
__version__ = "0.1.0"
