"""How the cost of every estimator, plugin and metric grows with model size (issue 15).

Models (100 classes, seeded synthetic tensors of CIFAR shape ``3×32×32``):

* MLP with two hidden layers of width 256 → 4096 (inputs flattened);
* CIFAR-style ResNet-8 / 18 / 34 (``avalanche_plugins.study.catalog.zoo.cifar_resnet``: torchvision's
  ``ResNet``/``BasicBlock``, 3×3 stride-1 stem, no max-pool; ResNet-8 is He et al.'s three-stage
  16/32/64 CIFAR ResNet);
* TinyViT (patch 4, 64 tokens + class token), depth 1/2/4 at width 128 and width 64/128/256 at
  depth 2.

Measurements (``--skip`` takes these names, a model name, a family, or ``MODEL/ESTIMATOR``):
``epoch`` (reference: SGD, batch 64), ``epoch_5000`` (one real 5,000-image epoch on ResNet-18,
full runs only), ``curvature_fisher`` / ``curvature_hessian`` (``layer_curvature``; the exact
Hessian only on models up to 3 M parameters, 32 samples, 10 iterations), ``fisher_expected`` /
``fisher_empirical`` (``fisher_diagonal``, 32 samples), ``readiness_sampled`` /
``readiness_per_sample`` (``optimization_readiness`` defaults, 256 samples), ``ads``
(``architecture_driven_shift`` as the metric's defaults call it: 64 old + 64 new, logit path),
``key_channel`` / ``key_cross_channel`` (closed-form ``fit_transport_key`` at the middle stage,
100 anchors), ``gauss_newton_key`` (100 anchors, 2 iterations), ``unit_masks`` (``UnitMasks``
construction), ``masked_epoch`` (50 % units masked vs the dense epoch), ``ewc_penalty``
(LayerAdaptiveEWC vs Avalanche ``EWCPlugin`` penalty per iteration, after 3 experiences).

Each measurement runs in its own process (:mod:`benchmarks.scale.runner`) with ``--threads``
torch threads (default 1), a timeout and a memory cap; a measurement that exceeds either is
recorded as such. Peak memory is the child's ``ru_maxrss`` after the estimator. Every estimator
time is also divided by "one epoch over 5,000 images" (one Split CIFAR-100 experience) =
5,000 × the per-image time of a reference SGD epoch timed in the same process right after it;
full runs also time one real 5,000-image epoch on ResNet-18 to check that extrapolation.

Outputs (``--out``): ``results.json`` / ``results.csv`` (one row per measurement), ``report.md``
(every measurement; log-log slopes of time and peak RSS against parameter count per estimator and
model family, ``numpy.polyfit``; issue 15's targets table on ResNet-18), ``scale.png``.

Duration at one thread on a 2-core machine: ``--quick`` (MLP 256/512/1024, ResNet-8, a 1-block
ViT, fewer samples) about 2–3 minutes idle (2 min of CPU; 5 min under a load average of 6). The
full run, at issue 15's ResNet-18 speed (41 ms per training image): about 50 minutes when every
estimator meets its target (ResNet-34 about 22, ResNet-18 15 with its real 5,000-image epoch),
longer while some still run into their timeouts (each may take 2 × the model's 5,000-image epoch,
between 60 s and ``--timeout``; at most about 6 h if every one did). The run prints its own
estimate once the reference epochs are timed.

Modules: :mod:`~benchmarks.scale.measure` (models, estimators, one measurement),
:mod:`~benchmarks.scale.runner` (one process per measurement: timeout, memory cap, peak RSS),
:mod:`~benchmarks.scale.report` (log-log slopes, tables, plot), :mod:`~benchmarks.scale.main`
(command line), :mod:`~benchmarks.scale.expected_fisher_mnist` (the ResNet-18 MNIST Fisher check).
"""

from benchmarks.scale.main import (
    FULL_MODELS,
    QUICK_MODELS,
    config_for,
    expected_seconds,
    main,
    timeout_for,
)

__all__ = ["FULL_MODELS", "QUICK_MODELS", "config_for", "expected_seconds", "main", "timeout_for"]
