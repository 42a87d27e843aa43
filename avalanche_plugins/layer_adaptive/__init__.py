"""Layer-adaptive regularisation: EWC whose strength varies per layer with the curvature of the
layer's Hessian block.

* :mod:`~avalanche_plugins.layer_adaptive.hessian` — top eigenvalue s_ℓ of each layer's Hessian
  block, κ, the geometric fit α̂;
* :mod:`~avalanche_plugins.layer_adaptive.fisher` — diagonal Fisher estimators;
* :mod:`~avalanche_plugins.layer_adaptive.schedules` — λ_ℓ schedules (uniform, geometric,
  measured, smoothed);
* :mod:`~avalanche_plugins.layer_adaptive.ewc_plugin`, :mod:`~avalanche_plugins.layer_adaptive.lr_plugin`,
  :mod:`~avalanche_plugins.layer_adaptive.sensitivity_metric` — the Avalanche adapters (import
  ``avalanche``; not re-exported here).
"""

from avalanche_plugins.layer_adaptive.fisher import (
    FISHER_KINDS,
    batched_fisher,
    empirical_fisher,
    expected_fisher,
    fisher_diagonal,
)
from avalanche_plugins.layer_adaptive.hessian import (
    GeometricFit,
    LayerSpectrum,
    condition_number,
    geometric_fit,
    layer_top_eigenvalues,
)
from avalanche_plugins.layer_adaptive.schedules import SCHEDULES, layer_weights

__all__ = ["FISHER_KINDS", "SCHEDULES", "GeometricFit", "LayerSpectrum", "batched_fisher", "condition_number",
           "empirical_fisher", "expected_fisher", "fisher_diagonal", "geometric_fit", "layer_top_eigenvalues",
           "layer_weights"]
