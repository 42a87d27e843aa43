"""Grow vs Prune: unit-level structural plasticity on a class-incremental stream with tiny replay.

Method, outputs and options: docs/benchmarks.md, "benchmarks.grow_prune"; ``--help``.
"""

from benchmarks.grow_prune.learner import DelayedEditClock, make_plugin
from benchmarks.grow_prune.main import main
from benchmarks.grow_prune.report import share_run_configs
from benchmarks.grow_prune.settings import make_model, settings_for, uses_leaky

__all__ = ["DelayedEditClock", "main", "make_model", "make_plugin", "settings_for", "share_run_configs",
           "uses_leaky"]
