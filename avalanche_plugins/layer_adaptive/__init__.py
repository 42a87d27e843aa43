"""Layer-adaptive regularisation: EWC whose strength varies per layer with the curvature of the
layer's Hessian block.

* :mod:`~avalanche_plugins.layer_adaptive.curvature` — ``layer_curvature``, the one entry point for
  s_ℓ by either method below;
* :mod:`~avalanche_plugins.layer_adaptive.fisher_blocks` — top eigenvalue of each layer's Fisher
  (Gauss–Newton) block, exact from the Gram of per-sample gradients (the default);
* :mod:`~avalanche_plugins.layer_adaptive.hessian` — top eigenvalue s_ℓ of each layer's Hessian
  block by block Lanczos, κ, the geometric fit α̂;
* :mod:`~avalanche_plugins.layer_adaptive.fisher` — diagonal Fisher estimators;
* :mod:`~avalanche_plugins.layer_adaptive.options` — ``CurvatureOptions``, ``FisherOptions``: the
  plugins' measurement keywords as validated groups;
* :mod:`~avalanche_plugins.layer_adaptive.schedules` — λ_ℓ schedules (uniform, geometric,
  measured, smoothed);
* :mod:`~avalanche_plugins.layer_adaptive.ewc_plugin`, :mod:`~avalanche_plugins.layer_adaptive.lr_plugin`,
  :mod:`~avalanche_plugins.layer_adaptive.sensitivity_metric` — the Avalanche adapters (import
  ``avalanche``; not re-exported here).
"""

from avalanche_plugins.layer_adaptive.curvature import (
    CURVATURE_METHODS,
    DEFAULT_SAMPLES,
    layer_curvature,
)
from avalanche_plugins.layer_adaptive.fisher import (
    FISHER_KINDS,
    batched_fisher,
    empirical_fisher,
    expected_fisher,
    fisher_diagonal,
)
from avalanche_plugins.layer_adaptive.fisher_blocks import FISHER_LABELS, layer_fisher_eigenvalues
from avalanche_plugins.layer_adaptive.hessian import (
    GeometricFit,
    LayerSpectrum,
    condition_number,
    geometric_fit,
    layer_top_eigenvalues,
)
from avalanche_plugins.layer_adaptive.options import CurvatureOptions, FisherOptions
from avalanche_plugins.layer_adaptive.schedules import SCHEDULES, layer_weights

__all__ = ["CURVATURE_METHODS", "DEFAULT_SAMPLES", "FISHER_KINDS", "FISHER_LABELS", "SCHEDULES", "CurvatureOptions",
           "FisherOptions", "GeometricFit", "LayerSpectrum", "batched_fisher", "condition_number",
           "empirical_fisher", "expected_fisher", "fisher_diagonal", "geometric_fit", "layer_curvature", "layer_fisher_eigenvalues", "layer_top_eigenvalues",
           "layer_weights"]
