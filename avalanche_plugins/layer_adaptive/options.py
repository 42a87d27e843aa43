"""Options that travel together, as small validated dataclasses (open_lth's hyper-parameter groups).

``CurvatureOptions``: how the per-layer curvature s_ℓ is measured (method, samples, vectorised
chunk, power-iteration budget, seed). ``FisherOptions``: which diagonal Fisher EWC's importances
use and its sample budget. Field names equal the plugins' flat keywords, so
``LayerAdaptiveEWCPlugin(10.0, curvature_options=CurvatureOptions(spectrum_samples=64))`` and
``LayerAdaptiveEWCPlugin(10.0, spectrum_samples=64)`` are the same plugin, and a bad value gets
the same error either way.

Example:
    >>> CurvatureOptions(curvature="hessian").spectrum_samples  # the method's default budget
    256
    >>> FisherOptions(fisher="expected", fisher_chunk_size=8)
    FisherOptions(fisher='expected', fisher_samples=None, fisher_chunk_size=8)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from avalanche_plugins.core.checks import check_choice, check_int, check_positive
from avalanche_plugins.layer_adaptive.curvature import CURVATURE_METHODS, DEFAULT_SAMPLES
from avalanche_plugins.layer_adaptive.fisher import FISHER_KINDS

__all__ = ["CurvatureOptions", "FisherOptions", "options_from"]


@dataclass(frozen=True)
class CurvatureOptions:
    """How s_ℓ is measured: ``curvature`` ``fisher`` | ``hessian``; ``spectrum_samples`` (None: 128
    for ``fisher``, 256 for ``hessian``); ``spectrum_chunk_size`` samples per vectorised call (None:
    the method's default); ``spectrum_max_iter`` / ``spectrum_tol`` the Lanczos solver's budget
    (``hessian``); ``seed`` for sample selection and start vectors."""

    curvature: str = "fisher"
    spectrum_samples: int | None = None
    spectrum_chunk_size: int | None = None
    spectrum_max_iter: int = 100
    spectrum_tol: float = 1e-3
    seed: int = 0

    def __post_init__(self):
        check_choice("curvature", self.curvature, CURVATURE_METHODS)
        if self.spectrum_samples is None:
            object.__setattr__(self, "spectrum_samples", DEFAULT_SAMPLES[self.curvature])
        check_int("spectrum_samples", self.spectrum_samples)
        if self.spectrum_chunk_size is not None:
            check_int("spectrum_chunk_size", self.spectrum_chunk_size)
        check_int("spectrum_max_iter", self.spectrum_max_iter)
        check_positive("spectrum_tol", self.spectrum_tol)
        check_int("seed", self.seed, minimum=0)


@dataclass(frozen=True)
class FisherOptions:
    """EWC's diagonal Fisher: ``fisher`` ``batched`` (Avalanche's) | ``empirical`` | ``expected``;
    ``fisher_samples`` caps the per-sample estimators' samples (None: all); ``fisher_chunk_size``
    samples per vectorised pass."""

    fisher: str = "batched"
    fisher_samples: int | None = None
    fisher_chunk_size: int = 16

    def __post_init__(self):
        check_choice("fisher", self.fisher, FISHER_KINDS)
        if self.fisher_samples is not None:
            check_int("fisher_samples", self.fisher_samples)
        check_int("fisher_chunk_size", self.fisher_chunk_size)


def options_from(cls, given, name: str, keywords: dict):
    """``given`` (an instance of ``cls``) or ``cls(**keywords)``; both at once is an error naming
    ``name`` and the flat keywords that differ from their defaults."""
    if given is None:
        return cls(**keywords)
    if not isinstance(given, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, got {type(given).__name__}")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    changed = [k for k, v in keywords.items() if v != defaults[k]]
    if changed:
        raise ValueError(f"give either {name} or the keywords {', '.join(changed)}, not both")
    return given
