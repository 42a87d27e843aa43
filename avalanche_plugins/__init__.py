"""Research plugins and metrics for Avalanche continual learning."""

__version__ = "0.1.0"
