"""Does Optimization Readiness (OR) rank checkpoints by how much they can still learn?

What it measures. Learners are trained online (batch 1, one pass per task) on a continual stream;
every ``checkpoint_every`` tasks the state (``state_dict`` + optimizer state) is saved and scored
against the *next* task: OR (``avalanche_plugins.readiness.optimization_readiness``, both the
paper's ``"sampled"`` estimator — 128 minibatches of size 4 — and the exact ``"per_sample"`` one),
its factors S and R, and the label-agnostic baselines (effective rank and 99 % energy rank of the
last hidden layer's features, eNTK energy rank, Hessian energy rank, active-unit fraction). The
ground truth is ``G^(k)`` (``k_step_gain``: the mean relative validation-loss decrease after
``k`` steps, 128 independent runs) for each k and each ground-truth optimizer. Within each run
(one seed of one learner) the pairwise ranking accuracy (PRA) of every metric against every
``G^(k)`` is computed over its checkpoints; tables give mean ± s.e. over runs, for all checkpoints
and stratified by regime ("dead": the last hidden layer has no active unit on the probe inputs;
"live": otherwise) — on SCR the dead regime alone can produce a high headline (a checkpoint whose
last hidden layer is dead only learns through the output bias, and every metric then tracks how far
the target mean moved). Also: the validation-size ablation (OR from 16 minibatches of size 1
on 100 / 10 / 1 / 0.1 % of the validation set for SCR, 100 / 10 / 1 % for P-MNIST), cost ratios
measured in the same run (ground truth ``G^(10)``, ``G^(100)`` vs OR; per-sample vs sampled OR) and
a plot of OR and the true gain along each run.

Benchmarks (source: "Predicting Plasticity in Deep Continual Learning", arXiv 2605.09044; the
benchmark definitions follow the loss-of-plasticity code of Dohare et al., "Loss of plasticity in
deep continual learning", Nature 2024):

* ``scr``: Slowly-Changing Regression (:mod:`benchmarks.scr`), variants ``bit_flip`` and
  ``resample``; learner MLP 20 → 5 (→ 5) → 1 (1 and 2 hidden layers, ReLU), Adam lr 0.01,
  batch 1, MSE. Task = period. Validation set = an independent draw of the same period.
* ``pmnist``: Permuted MNIST from ``--data-root`` (Permuted scikit-learn digits, 8×8, when absent):
  3×100 ReLU MLP, SGD lr 0.003, batch 1, one pass per task, cross-entropy, pixels in [0, 1] (the
  harness arrays are standardised; they are mapped back to [0, 1] with the training set's min and
  max, which for MNIST/digits is exactly the inverse of the affine standardisation). Task 0 is
  unpermuted, later tasks use seeded random pixel permutations. Training: a fixed subset of
  ``examples_per_task`` training images, reshuffled each task; validation: a fixed subset of
  held-out (test-split) images under the target task's permutation (nothing is tuned on it).

Streams that lose plasticity (issue 33; :func:`~benchmarks.plasticity_ranking.settings.declining_settings`):

* ``randlabel``: random-label MNIST with ``benchmarks.grow_prune``'s protocol (the first 1,000
  training images, standardised; fresh uniform labels every task; loss and accuracy on the task's
  own images); MLP 256-256, SGD lr 0.01 with momentum 0.9, batch 64, 10 epochs per task
  (:class:`~benchmarks.plasticity_ranking.learner.MinibatchLearner`), a checkpoint after every task
  (``--tasks``, default 20), the current-task accuracy recorded (the decline curve). Ground truth
  SGD lr 0.01, batch 4, 128 runs (64 for ``G^(100)``; ``--n-runs`` sets all).
* ``binary``: a continual-ImageNet-style stream (Dohare et al. 2024): every task a random pair of
  classes, binary labels, held-out images of the pair as validation; same learner.

Every checkpoint is also scored by the field's plasticity diagnostics (srank, feature rank,
τ-dormant units, average weight magnitude; lower-is-more-plastic ones negated before ranking) and
by our variants (:mod:`avalanche_plugins.readiness.lookahead`: ``lookahead`` LA^(10) from 8 runs
of the first ground truth's optimizer, ``lookahead_gd`` from 10 full-batch steps on the probes,
``quadratic_gain`` Q(η)). The report adds, per benchmark and ground truth, every score against OR
(paired t-tests over runs), the verdict per k and our variants against the best ingredient;
``--report RESULTS --keep DIR --keep-name NAME`` writes the kept form (compact JSON, tables,
decline figure).

Reconstructions and choices (not fixed by the sources available here):

* **Training loop.** A hand-written NumPy loop (forward, backward and the Adam/SGD update written
  out for Linear+ReLU MLPs, operating in place on the model's parameters) instead of Avalanche's
  strategy loop: measured here on SCR (20-5-5-1, Adam, batch 1, one torch thread, busy 2-core
  machine), Avalanche's ``Naive`` strategy trained at ≈ 440 steps/s and this loop at ≈ 6,000–12,000
  steps/s, and the full run needs millions of steps. :func:`benchmarks.scr.scr_benchmark` still provides the Avalanche stream for
  users who want to run Avalanche strategies on SCR. The update matches ``torch.optim.Adam`` /
  ``torch.optim.SGD`` (tested), and checkpoints store the optimizer state in
  ``torch.optim`` ``state_dict`` format.
* **Ground truth.** ``G^(k)`` for ``k ∈ {1, 10, 100}`` (``{1, 10}`` with ``--quick``), 128 runs,
  minibatches of ``gain_batch = 4`` (the batch of OR's reliability term R, so that the quantity
  OR bounds is the one measured) from the target task's training examples, loss measured on its
  validation set. Ground-truth optimizers: ``adam_fresh`` (fresh Adam state; SCR lr 0.01, P-MNIST
  lr 0.001) and ``sgd`` (SCR lr 0.01, P-MNIST lr 0.003). A diverging run gives a non-finite gain,
  mapped to −1e300 (the worst possible gain) before ranking. On SCR (Adam learner) also
  ``adam_continue``: Adam continuing from the checkpoint's own moments and step count (lr 0.01), by
  :func:`continuing_adam_gain` (``k_step_gain`` with ``adam_state``); it uses the same
  minibatches as ``adam_fresh``. On P-MNIST the learner is plain SGD (stateless), so its
  "continuing" ground truth is the ``sgd`` column.
* **Layer of the representation ranks.** Effective rank / energy rank use the last hidden layer
  (the representation read by the head); the eNTK and Hessian ranks use all parameters (Hessian:
  exact for the tiny SCR nets, Gauss–Newton on the probe set otherwise, as
  ``hessian_energy_rank`` decides). Probes: the first ``n_probe`` validation samples
  (``n_probe_jacobian`` for the Jacobian-based ranks).
* **PRA** = ``pairwise_ranking_accuracy`` (pairs with equal true gain skipped, metric ties ½); a
  stratum with fewer than 2 checkpoints or no untied pair gives no value for that run.
* **Aggregation.** "mean ± s.e." is over runs (seeds × learner variants of a benchmark).
* **Threads.** torch runs single-threaded (``--threads 1``, the default): every tensor is tiny,
  and on a busy 2-core machine the default thread pool made the vectorised ground truth ~15× slower.

Cost of the full run (measured per checkpoint on a 2-core machine that was also running another
job, so roughly halve it unloaded): SCR ≈ 5 s per checkpoint (three ground truths × k ≤ 100 on
10,000 validation examples) plus ≈ 140 s of training (150 periods × 10,000 steps) per run, i.e.
≈ 5 min per run, 4 learners × 3 seeds ≈ 1 h; P-MNIST (MNIST subset, 10,000 images per task,
2,000 validation images) ≈ 40 s per checkpoint plus ≈ 4 min of training, ≈ 25 min per seed.
Every (learner, seed) run is one job of the shared executor (:mod:`avalanche_plugins.study.jobs`):
``--workers N`` runs them in parallel and an interrupted run resumes from ``OUT/jobs.jsonl``;
``--only`` / ``--skip`` select learners. ``--quick``: 3 SCR learners and Permuted digits, one
seed, k ∈ {1, 10} (G^(100) timed once per run for the cost ratio).

``--report RESULTS_JSON`` re-prints every table of a saved run, including the pooled analysis
(:mod:`~benchmarks.plasticity_ranking.ranking`): per-run PRA next to PRA pooled over all runs of a
benchmark, and the ground truth's noise ceiling.

Modules: :mod:`~benchmarks.plasticity_ranking.settings` (learners and protocol),
:mod:`~benchmarks.plasticity_ranking.tasks` (task source), :mod:`~benchmarks.plasticity_ranking.learner`
(the online training loop), :mod:`~benchmarks.plasticity_ranking.scoring` (one checkpoint's metrics
and ground truths), :mod:`~benchmarks.plasticity_ranking.run` (one run = one job),
:mod:`~benchmarks.plasticity_ranking.ranking` (PRA, headlines, costs, pooled analysis),
:mod:`~benchmarks.plasticity_ranking.report` (tables, plot), :mod:`~benchmarks.plasticity_ranking.main`
(command line).
"""

from benchmarks.plasticity_ranking.learner import MinibatchLearner, OnlineLearner
from benchmarks.plasticity_ranking.main import main, run_benchmark
from benchmarks.plasticity_ranking.ranking import (
    noise_ceiling,
    pooled_analysis,
    pra_rows,
    pra_table,
)
from benchmarks.plasticity_ranking.report import report
from benchmarks.plasticity_ranking.run import Job, run_job, run_setting
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
    setting_from_dict,
)
from benchmarks.plasticity_ranking.tasks import TaskSource, load_unit_arrays

__all__ = ["BASELINES", "METRICS", "STRATA", "Job", "MinibatchLearner", "OnlineLearner", "Setting", "TaskSource",
           "continuing_adam_gain", "declining_settings", "default_settings", "last_hidden_features", "load_unit_arrays", "main", "noise_ceiling", "pooled_analysis",
           "pra_rows", "pra_table", "regime", "report", "run_benchmark", "run_job", "run_setting", "score_checkpoint",
           "setting_from_dict"]
