"""Does Optimization Readiness (OR) rank checkpoints by how much they can still learn?

Method, outputs, reconstructions and costs: docs/benchmarks.md, "benchmarks.plasticity_ranking".
"""

from benchmarks.plasticity_ranking.learner import MinibatchLearner, OnlineLearner
from benchmarks.plasticity_ranking.main import main, run_benchmark
from benchmarks.plasticity_ranking.ranking import noise_ceiling, pooled_analysis, pra_rows
from benchmarks.plasticity_ranking.scoring import last_hidden_features, regime, score_checkpoint
from benchmarks.plasticity_ranking.settings import (
    BASELINES,
    METRICS,
    STRATA,
    Setting,
    declining_settings,
    default_settings,
)
from benchmarks.plasticity_ranking.tasks import TaskSource

__all__ = ["BASELINES", "METRICS", "STRATA", "MinibatchLearner", "OnlineLearner", "Setting", "TaskSource",
           "declining_settings", "default_settings", "last_hidden_features", "main",
           "noise_ceiling", "pooled_analysis", "pra_rows", "regime", "run_benchmark", "score_checkpoint"]
