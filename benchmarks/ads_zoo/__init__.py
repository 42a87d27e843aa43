"""Does Architecture-Driven Shift (ADS) rank architectures by how far their old-task logits move?

For every architecture of a zoo of MLPs and tiny ViTs (:mod:`~benchmarks.ads_zoo.zoo`) and every
scenario: train on the old task, predict the shift (ADS and naive predictors), train on the new task
and measure the realised old-task logit shift and ECE. Reports Spearman, Kendall, direction
consistency over one-edit pairs, ECE correlations and the cost ratio; writes results.json/csv,
report.md and ads_scatter.png under ``--out``; every (scenario, architecture, seed) is a cached job
of ``OUT/jobs.jsonl``. Method: docs/benchmarks.md, "benchmarks.ads_zoo", and docs/ads.md.
"""

from benchmarks.ads_zoo.main import main
from benchmarks.ads_zoo.scoring import analyse
from benchmarks.ads_zoo.zoo import quick_zoo

__all__ = ["analyse", "main", "quick_zoo"]
