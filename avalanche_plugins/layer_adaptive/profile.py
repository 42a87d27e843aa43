"""The per-layer curvature profile of one experience: s_ℓ, κ and the geometric fit α̂.

.. math:: κ = \\frac{\\max_ℓ s_ℓ}{\\min_ℓ s_ℓ}, \\qquad s_ℓ ≈ c \\, α̂^{-(ℓ-1)} \\;(\\text{least squares in } \\log s_ℓ)

:class:`LayerProfile` is the record the sensitivity metric keeps per experience; the EWC plugin
extends it with the strengths it applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from avalanche_plugins.layer_adaptive.hessian import LayerSpectrum

__all__ = ["LayerProfile", "layer_profile"]


@dataclass
class LayerProfile:
    """Curvature measured at the end of one experience (``spectrum`` None when not measured)."""

    experience: int
    layer_names: list[str]
    spectrum: list[float] | None = None  # s_ℓ
    kappa: float | None = None
    alpha_hat: float | None = None
    fit_r2: float | None = None
    seconds: dict = field(default_factory=dict)


def layer_profile(experience: int, spectrum: LayerSpectrum, *, seconds: dict | None = None) -> LayerProfile:
    """A :class:`LayerProfile` from a :class:`~avalanche_plugins.layer_adaptive.hessian.LayerSpectrum`,
    with κ and the geometric fit filled in (α̂ None when no fit exists, e.g. one layer).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from avalanche_plugins.layer_adaptive.hessian import layer_top_eigenvalues
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        >>> spec = layer_top_eigenvalues(net, nn.CrossEntropyLoss(), torch.randn(16, 3), torch.randint(0, 2, (16,)))
        >>> p = layer_profile(0, spec)
        >>> p.layer_names, p.kappa == max(p.spectrum) / min(p.spectrum)
        (['0', '2'], True)
    """
    profile = LayerProfile(experience=experience, layer_names=list(spectrum.names), spectrum=spectrum.top.tolist(),
                           kappa=spectrum.kappa, seconds=dict(seconds or {}))
    try:
        fit = spectrum.fit()
        profile.alpha_hat, profile.fit_r2 = fit.alpha, fit.r2
    except ValueError:
        pass
    return profile
