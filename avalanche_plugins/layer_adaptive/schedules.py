"""Per-layer strength schedules ``w_ℓ`` for layer-adaptive regularisation (λ_ℓ = λ · w_ℓ).

* ``uniform``: ``w_ℓ = 1`` (standard EWC).
* ``geometric``: ``w_ℓ = α^{-(ℓ-1)}``; α > 1 protects early layers more, α < 1 deep layers more.
* ``measured``: ``w_ℓ ∝ max(s_ℓ, max_k s_k / max_ratio)`` (top curvature-block eigenvalues),
  normalised to mean 1 over layers (the same total budget as uniform). Dead layers (``s_ℓ <= 0``:
  zero gradient, e.g. dead ReLUs, or for Hessian blocks away from a minimum no positive
  curvature) and extreme ones (``s_ℓ < max s / max_ratio``) get the floor, the minimum weight, with
  a ``RuntimeWarning`` naming them: moving such a layer does not increase the quadratic loss
  model, so it gets the least protection, but never exactly 0, and weights never span more than
  ``max_ratio`` (default ``1e6``).
* ``smoothed``: the least-squares geometric fit of the measured profile over the live layers
  (``s_ℓ > 0``; :func:`avalanche_plugins.layer_adaptive.hessian.geometric_fit`), evaluated at every
  depth, same normalisation. Dead layers are left out of the fit and get the weight the fit
  predicts at their depth (warning naming them); a fit steep enough to span more than
  ``max_ratio`` over the model's depth is clipped to ``max_k w_k / max_ratio`` (warning). The paper
  found the literal ``measured`` schedule noisy and the one-parameter fit robust.

Fallback: when ``measured`` has no positive ``s_ℓ``, or ``smoothed`` fewer than two (every layer
dead, a model far from a minimum), the weights are uniform for that experience, with a
``RuntimeWarning``; the run goes on. Weights are always finite and positive.
"""

from __future__ import annotations

import warnings

import numpy as np

from avalanche_plugins.core.checks import check_choice, check_int, check_positive
from avalanche_plugins.layer_adaptive.hessian import geometric_fit

__all__ = ["SCHEDULES", "layer_weights"]

SCHEDULES = ("uniform", "geometric", "measured", "smoothed")


MAX_RATIO = 1e6  # the largest max w / min w of the measured and smoothed schedules


def _named(indices, names) -> list:
    return [names[i] if names is not None else f"layer {i + 1}" for i in indices]


def layer_weights(schedule: str, n_layers: int, *, alpha: float | None = None, spectrum=None,
                  names=None, max_ratio: float = MAX_RATIO) -> np.ndarray:
    """Weights ``w_ℓ`` for ℓ = 1..n_layers (module docstring: dead and extreme layers).

    Args:
        schedule: one of :data:`SCHEDULES`.
        n_layers: number of layers.
        alpha: ratio of the geometric schedule (> 0), required for ``geometric``.
        spectrum: the measured ``s_ℓ`` (length ``n_layers``), required for ``measured``/``smoothed``.
        names: layer names for the warnings (default ``layer 1``, ``layer 2``, ...).
        max_ratio: the largest ``max w / min w`` of ``measured`` and ``smoothed`` (>= 1).

    Example:
        >>> layer_weights("geometric", 3, alpha=2.0).tolist()
        [1.0, 0.5, 0.25]
        >>> layer_weights("measured", 2, spectrum=[3.0, 1.0]).tolist()
        [1.5, 0.5]
        >>> w = layer_weights("smoothed", 3, spectrum=[4.0, 0.0, 1.0], names=["a", "b", "c"])
        >>> (w / w[0]).tolist()  # "b" is dead: it gets the fit's weight at its depth
        [1.0, 0.5, 0.25]
    """
    check_choice("schedule", schedule, SCHEDULES)
    check_int("n_layers", n_layers)
    check_positive("max_ratio", max_ratio)
    if max_ratio < 1:
        raise ValueError(f"max_ratio must be >= 1, got {max_ratio!r}")
    if names is not None and len(names) != n_layers:
        raise ValueError(f"names must have {n_layers} entries, got {len(names)}")
    depth = np.arange(n_layers, dtype=float)
    if schedule == "uniform":
        return np.ones(n_layers)
    if schedule == "geometric":
        if alpha is None:
            raise ValueError("alpha is required for the geometric schedule")
        check_positive("alpha", alpha)
        return float(alpha) ** (-depth)
    if spectrum is None:
        raise ValueError(f"the {schedule} schedule needs the measured spectrum s_ℓ")
    s = np.asarray(spectrum, dtype=float)
    if s.shape != (n_layers,):
        raise ValueError(f"spectrum must have {n_layers} values, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise ValueError(f"spectrum has non-finite values: {s.tolist()}")
    n_positive = int((s > 0).sum())
    if n_positive < (1 if schedule == "measured" else 2):
        # e.g. dead ReLU layers: nothing to scale or fit; fall back to uniform rather than end the run
        warnings.warn(f"the {schedule} schedule needs {'a positive' if schedule == 'measured' else 'two positive'} "
                      f"layer curvature value(s), got {s.tolist()}: using uniform weights for this experience",
                      RuntimeWarning, stacklevel=2)
        return np.ones(n_layers)
    dead = np.flatnonzero(s <= 0)
    if schedule == "measured":
        floor = s.max() / max_ratio
        low = np.flatnonzero(s < floor)
        if len(low):
            warnings.warn(f"the measured schedule is clipping the layer curvature of {_named(low, names)} "
                          f"({s[low].tolist()}; dead: {_named(dead, names)}) to max s / max_ratio = {floor:.3g}, "
                          "the minimum weight", RuntimeWarning, stacklevel=2)
        w = np.maximum(s, floor)
    else:
        if len(dead):
            warnings.warn(f"the smoothed schedule leaves the dead layers {_named(dead, names)} (s_l <= 0) out "
                          "of the geometric fit; they get the weight the fit predicts at their depth",
                          RuntimeWarning, stacklevel=2)
        w = geometric_fit(s).profile(n_layers)
        floor = w.max() / max_ratio
        if (w < floor).any():
            warnings.warn(f"the smoothed schedule's fit spans {w.max() / w.min():.3g} > max_ratio={max_ratio:.3g}: "
                          f"the weights of {_named(np.flatnonzero(w < floor), names)} are clipped to "
                          "max w / max_ratio", RuntimeWarning, stacklevel=2)
            w = np.maximum(w, floor)
    return w / w.mean()
