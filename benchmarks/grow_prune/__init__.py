"""Grow vs Prune: unit-level structural plasticity on a class-incremental stream with tiny replay.

Dense vs Prune (IMP with rewinding to init) vs Grow (activation-scored recruitment, with each
insertion intervention) at target compactness c, on MLP and CNN settings (split, IID and the
plasticity streams): final ACC, TAA, the retrained ticket's ACC / TAA, the newborn/incumbent
gradient ratio and the masked/dense time per epoch. Writes results.json/csv, report.md,
trajectory.png and newborn_course.png under ``--out``; every run is a cached job of
``OUT/jobs.jsonl``. Method and options: docs/benchmarks.md, "benchmarks.grow_prune"; run
``python -m benchmarks.grow_prune --help``.
"""

from benchmarks.grow_prune.learner import DelayedEditClock, make_plugin
from benchmarks.grow_prune.main import main
from benchmarks.grow_prune.report import share_run_configs
from benchmarks.grow_prune.settings import make_model, settings_for, uses_leaky

__all__ = ["DelayedEditClock", "main", "make_model", "make_plugin", "settings_for", "share_run_configs",
           "uses_leaky"]
