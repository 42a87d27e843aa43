"""Does Optimization Readiness (OR) rank checkpoints by how much they can still learn?

Learners are trained online on a continual stream (``scr``: Slowly-Changing Regression,
:mod:`benchmarks.scr`; ``pmnist``: Permuted MNIST / digits; the declining streams ``randlabel``
and ``binary``); every checkpoint is scored by OR, its factors, the label-agnostic baselines, the
plasticity diagnostics and our variants, against the true k-step gain ``G^(k)``. Tables: pairwise
ranking accuracy (PRA) per run, stratified by dead/live regime, the validation-size ablation, cost
ratios, the pooled analysis and noise ceiling. Writes results.json/csv, report.md, or_vs_gain.png
(and decline.png) under ``--out``; every (learner, seed) run is a cached job of ``OUT/jobs.jsonl``.
``--report RESULTS --keep DIR --keep-name NAME`` writes the kept form. Method, reconstructions and
costs: docs/benchmarks.md, "benchmarks.plasticity_ranking".
"""

from benchmarks.plasticity_ranking.learner import MinibatchLearner, OnlineLearner
from benchmarks.plasticity_ranking.main import main, run_benchmark
from benchmarks.plasticity_ranking.ranking import noise_ceiling, pooled_analysis, pra_rows
from benchmarks.plasticity_ranking.scoring import (
    continuing_adam_gain,
    last_hidden_features,
    regime,
    score_checkpoint,
)
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
           "continuing_adam_gain", "declining_settings", "default_settings", "last_hidden_features", "main",
           "noise_ceiling", "pooled_analysis", "pra_rows", "regime", "run_benchmark", "score_checkpoint"]
