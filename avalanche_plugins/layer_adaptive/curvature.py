"""One entry point for the per-layer curvature ``s_ℓ``: exact Hessian blocks or Fisher blocks.

=========== ======================================================== ============================
method      what ``s_ℓ`` is                                          cost
=========== ======================================================== ============================
``fisher``  top eigenvalue of the Fisher (Gauss–Newton) block, exact one per-sample-gradient pass
            from the Gram of per-sample gradients                    per group of layers
``hessian`` top eigenvalue of the Hessian block, block Lanczos       one block product per layer
            to a relative residual ``tol``                           and Lanczos step
=========== ======================================================== ============================

``fisher`` is the default of every adapter (far cheaper on large models); the agreement of the two
on models where both run, and both against curvlinops, are in ``docs/RESULTS.md``.
"""

from __future__ import annotations

import torch
from torch import nn

from avalanche_plugins.core.checks import check_choice
from avalanche_plugins.layer_adaptive.fisher_blocks import layer_fisher_eigenvalues
from avalanche_plugins.layer_adaptive.hessian import LayerSpectrum, layer_top_eigenvalues

__all__ = ["CURVATURE_METHODS", "DEFAULT_SAMPLES", "layer_curvature"]

CURVATURE_METHODS = ("fisher", "hessian")
# samples the adapters measure on by default. The Fisher blocks' cost grows with samples² (passes ×
# samples per pass): 128 debiased samples cost about a quarter epoch on a ResNet-18 and err more than
# the exact blocks on 64 samples, 256 match them (benchmarks.curvature_agreement, docs/RESULTS.md)
DEFAULT_SAMPLES = {"fisher": 128, "hessian": 256}


def layer_curvature(model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor, *,
                    method: str = "fisher", **options) -> LayerSpectrum:
    """``s_ℓ`` of every layer by ``method``; ``options`` go to
    :func:`~avalanche_plugins.layer_adaptive.fisher_blocks.layer_fisher_eigenvalues` (``fisher``) or
    :func:`~avalanche_plugins.layer_adaptive.hessian.layer_top_eigenvalues` (``hessian``).

    Example:
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        >>> x, y = torch.randn(64, 3), torch.randint(0, 2, (64,))
        >>> [layer_curvature(net, nn.CrossEntropyLoss(), x, y, method=m).method for m in CURVATURE_METHODS]
        ['fisher', 'hessian']
    """
    check_choice("method", method, CURVATURE_METHODS)
    estimator = layer_fisher_eigenvalues if method == "fisher" else layer_top_eigenvalues
    return estimator(model, loss_fn, inputs, targets, **options)
