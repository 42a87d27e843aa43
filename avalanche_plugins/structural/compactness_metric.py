"""The compactness of a run's Grow / Prune / FixedMask plugin as an Avalanche metric."""

from __future__ import annotations

from avalanche.evaluation import PluginMetric
from avalanche.evaluation.metric_results import MetricValue
from avalanche.evaluation.metric_utils import get_metric_name

from avalanche_plugins._avalanche.distributed import check_distributed

__all__ = ["CompactnessMetric"]


class CompactnessMetric(PluginMetric[float]):
    """Fraction of hidden units active (``masks.compactness()``) of the given Grow / Prune /
    FixedMask plugin after every training epoch, as ``Compactness/train_phase/...`` (the study
    runner attaches one to every run with such a plugin)."""

    supports_distributed = True  # reads the plugin's masks, equal on every rank

    def __init__(self, plugin):
        super().__init__()
        self.plugin, self.value = plugin, None

    def result(self):
        return self.value

    def reset(self):
        self.value = None

    def __str__(self):
        return "Compactness"

    def before_training(self, strategy):
        check_distributed(self, strategy)

    def after_training_epoch(self, strategy):
        masks = getattr(self.plugin, "masks", None)
        if masks is None:
            return None
        self.value = float(masks.compactness())
        name = get_metric_name(self, strategy, add_experience=True, add_task=True)
        return [MetricValue(self, name, self.value, strategy.clock.train_iterations)]
