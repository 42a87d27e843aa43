"""Research plugins and metrics for Avalanche continual learning."""

from avalanche_plugins.layer_adaptive_ewc import LayerAdaptiveEWCPlugin

__all__ = ["LayerAdaptiveEWCPlugin"]
__version__ = "0.1.0"
