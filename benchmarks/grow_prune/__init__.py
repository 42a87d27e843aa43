"""Grow vs Prune: unit-level structural plasticity on a class-incremental stream with tiny replay.

"On the Stability of Growth in Structural Plasticity" (arXiv 2605.15435). Dense vs
Prune (IMP with rewinding to init) vs Grow (activation-scored recruitment) vs Grow with each
insertion intervention, at target compactness c (fraction of hidden units kept), on:

* an MLP with two masked hidden layers and an unmasked 10-way head, Split digits / Split MNIST
  (class-incremental, shared head, ``ReplayPlugin`` with a few samples per class), SGD lr 0.01
  with momentum 0.9 (``--optimizer adam``: Adam lr 1e-3). A masked unit receives no gradient, so
  without weight decay its momentum / Adam moments are exactly 0 and ``keep`` / ``zero``
  coincide; ``fresh`` differs only under Adam (the unit's own step count in the bias correction
  instead of the tensor's);
* the same MLP on IID data (one experience; cycles within it, ``cycle_scope="experience"``);
* a small CNN (masked conv channels, BatchNorm) on the split stream.

Per run: final ACC (cumulative test accuracy after the last experience), TAA (mean cycle accuracy,
one cycle per epoch), the retrained ticket's ACC and TAA (:func:`retrain_ticket`: final mask,
fresh init, same stream) and, for Grow, the newborn/incumbent gradient ratio (mean over growth
cycles). Cost: time per training epoch of the masked model (fixed mask at c) over the same dense
model, measured in the same process. ``--quick``: one seed, c = 30 %, fewer methods.

Every (setting, method, compactness, seed) run and every timing measurement is one job of
:func:`avalanche_plugins.study.jobs.run_jobs`: finished jobs are appended to ``OUT/jobs.jsonl`` and reused
when the same command is run again, so an interrupted run resumes where it stopped. To fit a
budget: ``--settings`` (a subset of the settings by name), ``--epochs`` / ``--iid-epochs`` (epochs
per experience of the split / IID settings), ``--cnn-methods`` / ``--iid-methods`` (fewer methods
on the CNN / IID settings).

Run ``python -m benchmarks.grow_prune --help``.
"""

from benchmarks.grow_prune.job import Job, run_job
from benchmarks.grow_prune.learner import DelayedEditClock, make_plugin, run_one, steps_to_parity
from benchmarks.grow_prune.main import main
from benchmarks.grow_prune.report import (
           analysis,
           compact_row,
           report,
           share_run_configs,
           verdict_tables,
)
from benchmarks.grow_prune.settings import METHODS, Setting, make_model, settings_for, uses_leaky

__all__ = ["METHODS", "DelayedEditClock", "Job", "Setting", "analysis", "compact_row", "main", "make_model", "make_plugin",
           "report", "run_job", "run_one", "settings_for", "share_run_configs", "steps_to_parity", "uses_leaky",
           "verdict_tables"]
