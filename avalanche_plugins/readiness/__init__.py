"""Optimization Readiness (OR): a label-aware predictor of plasticity, its ground truth, and baselines.

"Predicting Plasticity in Deep Continual Learning" (arXiv 2605.09044) asks how much a checkpoint θ can
still learn a target task T. Its answer uses the target's mean loss ``L(θ)``, the full-data
gradient ``g = ∇L(θ)`` and the minibatch gradient ``ĝ_B`` (mean over a minibatch of ``B`` samples):

.. math::

    S = \\frac{\\lVert g \\rVert^2}{L}, \\qquad
    R = \\frac{\\lVert g \\rVert^2}{\\mathbb{E}_B \\lVert \\hat g_B \\rVert^2}, \\qquad
    \\mathrm{OR} = S \\cdot R = \\frac{\\lVert g \\rVert^4}{L \\, \\mathbb{E}_B \\lVert \\hat g_B \\rVert^2}

and proves, for a β-smooth loss and a step ``η < R/β`` (``α = ηβ/R``), that the expected relative
loss decrease of one SGD step ``G^(1) = (L(θ) − E L(θ_1)) / L(θ)`` is at least ``α(1−α)/β · OR``.

This package holds the parts that need only PyTorch (one module per concept: ``readiness``,
``gain``, ``baselines``, ``ranking``; everything is importable from here):

* :func:`optimization_readiness` — ``S``, ``R`` and ``OR`` with two estimators of the second moment;
* :func:`k_step_gain` — the ground truth ``G^(k)`` from many vectorised k-step SGD/Adam runs;
* label-agnostic baselines: :func:`effective_rank`, :func:`energy_rank`,
  :func:`representation_ranks`, :func:`active_unit_fraction`, :func:`entk_energy_rank`,
  :func:`hessian_energy_rank` (hidden features from :func:`hidden_features`), and the
  loss-of-plasticity literature's diagnostics :func:`srank` (Kumar et al. 2021),
  :func:`feature_rank` (Lyle et al. 2022), :func:`dormant_unit_fraction` (Sokar et al. 2023),
  :func:`average_weight_magnitude` (Dohare et al. 2024), read in the directions of
  :data:`PLASTICITY_DIAGNOSTICS`;
* ranking agreement: :func:`pairwise_ranking_accuracy`, :func:`spearman`, :func:`kendall_tau`;
* beyond the paper (issue 33), :mod:`avalanche_plugins.readiness.lookahead`:
  ``lookahead_readiness`` (a few short minibatch or full-batch runs) and ``curvature_readiness``
  (the one-step quadratic model along the gradient).

Conventions shared by every function here:

* The model is evaluated in eval mode (dropout off, BatchNorm on its running statistics) and its
  mode is restored; parameters are read with ``torch.func.functional_call``, so nothing is written
  to ``.grad``, the parameters are never changed and torch's global RNG is never used (random
  draws use a ``torch.Generator`` seeded with ``seed``).
* "Parameters" are the model's trainable ones (``requires_grad=True``); frozen parameters and
  buffers are held fixed.
* ``loss_fn(outputs, targets)`` is mean- or sum-reduced over the samples of a batch; every quantity
  is of the per-sample mean loss (the paper's definitions; a sum-reduced batch loss is divided by
  its sample count, :func:`avalanche_plugins.core.reductions.mean_loss`), so ``reduction="sum"``
  gives the mean's numbers when the per-sample losses agree; ``"none"`` and callables whose
  reduction cannot be read are refused. Per-sample quantities call it on a batch of
  one (``x.unsqueeze(0)``), as :func:`avalanche_plugins.layer_adaptive.fisher.empirical_fisher` does.
* Avalanche multi-task models (``MultiTaskModule``) receive ``task_labels``; samples are grouped by
  task so that every forward pass uses a single ``int`` label (Avalanche's fast path, which is also
  the only one ``torch.func`` transforms can trace). Without labels every sample gets task 0.
"""

from avalanche_plugins.readiness.baselines import (
    PLASTICITY_DIAGNOSTICS,
    active_unit_fraction,
    average_weight_magnitude,
    dormant_unit_fraction,
    effective_rank,
    energy_rank,
    entk_energy_rank,
    feature_rank,
    hessian_energy_rank,
    hidden_features,
    representation_ranks,
    srank,
)
from avalanche_plugins.readiness.gain import OPTIMIZERS, GainResult, k_step_gain
from avalanche_plugins.readiness.readiness import (
    ESTIMATORS,
    ReadinessResult,
    optimization_readiness,
)

__all__ = [
    "ESTIMATORS",
    "OPTIMIZERS",
    "ReadinessResult",
    "GainResult",
    "optimization_readiness",
    "k_step_gain",
    "effective_rank",
    "energy_rank",
    "hidden_features",
    "representation_ranks",
    "active_unit_fraction",
    "entk_energy_rank",
    "hessian_energy_rank",
    "srank",
    "feature_rank",
    "dormant_unit_fraction",
    "average_weight_magnitude",
    "PLASTICITY_DIAGNOSTICS",
]
