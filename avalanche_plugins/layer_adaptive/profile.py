"""The per-layer curvature profile of one experience: s_ℓ, κ and the geometric fit α̂.

.. math:: κ = \\frac{\\max_{ℓ \\,\\text{live}} s_ℓ}{\\min_{ℓ \\,\\text{live}} s_ℓ}, \\qquad
          s_ℓ ≈ c \\, α̂^{-(ℓ-1)} \\;(\\text{least squares in } \\log s_ℓ \\text{ over the live layers})

Dead layers, ``s_ℓ <= 0`` (zero gradient, e.g. dead ReLUs or a layer whose output is multiplied by
0; for Hessian blocks also a block with no positive curvature), have no meaningful ratio: they are
listed in ``LayerProfile.dead_layers``, named in a ``RuntimeWarning``, kept in ``spectrum`` (their
``s_ℓ`` as measured) and left out of κ and α̂ (ℓ stays the layer's depth in the fit), so κ and α̂
are finite or None, never inf or NaN: κ is None only when every layer is dead, α̂ when fewer than
two layers are live.

:class:`LayerProfile` is the record the sensitivity metric keeps per experience; the EWC plugin
extends it with the strengths it applied.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from avalanche_plugins.layer_adaptive.hessian import LayerSpectrum, condition_number, geometric_fit

__all__ = ["LayerProfile", "dead_layers", "layer_profile"]


@dataclass
class LayerProfile:
    """Curvature measured at the end of one experience (``spectrum`` None when not measured).

    ``kappa`` and ``alpha_hat`` are over the live layers; ``dead_layers`` names the others
    (module docstring)."""

    experience: int
    layer_names: list[str]
    spectrum: list[float] | None = None  # s_ℓ
    kappa: float | None = None
    alpha_hat: float | None = None
    fit_r2: float | None = None
    seconds: dict = field(default_factory=dict)
    dead_layers: list[str] = field(default_factory=list)


def dead_layers(names, values) -> list[str]:
    """The names of the layers with ``s_ℓ <= 0`` (dead: no curvature to take a ratio of).

    >>> dead_layers(["a", "b", "c"], [2.0, 0.0, 1.0])
    ['b']
    """
    s = np.asarray(values, dtype=float)
    return [name for name, v in zip(names, s) if not v > 0]


def layer_profile(experience: int, spectrum: LayerSpectrum, *, seconds: dict | None = None) -> LayerProfile:
    """A :class:`LayerProfile` from a :class:`~avalanche_plugins.layer_adaptive.hessian.LayerSpectrum`,
    with κ and the geometric fit over the live layers filled in (α̂ None when no fit exists, e.g. one
    live layer; κ None when no layer is live). Dead layers (``s_ℓ <= 0``) are listed in
    ``dead_layers`` and named in a ``RuntimeWarning``.

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
    names, top = list(spectrum.names), np.asarray(spectrum.top, dtype=float)
    dead = dead_layers(names, top)
    live = top[top > 0]
    profile = LayerProfile(experience=experience, layer_names=names, spectrum=top.tolist(),
                           kappa=condition_number(live) if len(live) else None, seconds=dict(seconds or {}),
                           dead_layers=dead)
    if dead:
        warnings.warn(f"layer curvature after experience {experience}: {len(dead)} dead layer(s) with s_l <= 0 "
                      f"left out of kappa and alpha_hat: {dead}", RuntimeWarning, stacklevel=2)
    if len(live) >= 2:
        fit = geometric_fit(top)  # over the live layers, at their depths
        if math.isfinite(fit.alpha) and math.isfinite(fit.r2):
            profile.alpha_hat, profile.fit_r2 = fit.alpha, fit.r2
    return profile
