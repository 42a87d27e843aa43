"""Per-layer strength schedules ``w_ℓ`` for layer-adaptive regularisation (λ_ℓ = λ · w_ℓ).

* ``uniform``: ``w_ℓ = 1`` (standard EWC).
* ``geometric``: ``w_ℓ = α^{-(ℓ-1)}``; α > 1 protects early layers more, α < 1 deep layers more.
* ``measured``: ``w_ℓ ∝ s_ℓ`` (top Hessian-block eigenvalues), normalised to mean 1 over layers
  (the same total budget as uniform). Non-positive ``s_ℓ`` (a block with no positive curvature,
  only possible away from a minimum) is clipped to ``1e-6 · max s`` with a warning: moving such a
  layer does not increase the quadratic loss model, so it gets (almost) no protection.
* ``smoothed``: the least-squares geometric fit of the measured profile
  (:func:`avalanche_plugins.layer_adaptive.hessian.geometric_fit`), same normalisation. The paper found the literal
  ``measured`` schedule noisy and the one-parameter fit robust.

Fallback: when ``measured`` has no positive ``s_ℓ``, or ``smoothed`` fewer than two (dead ReLU
layers, a model far from a minimum), the weights are uniform for that experience, with a
``RuntimeWarning``; the run goes on.
"""

from __future__ import annotations

import warnings

import numpy as np

from avalanche_plugins.core.checks import check_choice, check_int, check_positive
from avalanche_plugins.layer_adaptive.hessian import geometric_fit

__all__ = ["SCHEDULES", "layer_weights"]

SCHEDULES = ("uniform", "geometric", "measured", "smoothed")


def layer_weights(schedule: str, n_layers: int, *, alpha: float | None = None, spectrum=None) -> np.ndarray:
    """Weights ``w_ℓ`` for ℓ = 1..n_layers.

    Args:
        schedule: one of :data:`SCHEDULES`.
        n_layers: number of layers.
        alpha: ratio of the geometric schedule (> 0), required for ``geometric``.
        spectrum: the measured ``s_ℓ`` (length ``n_layers``), required for ``measured``/``smoothed``.

    Example:
        >>> layer_weights("geometric", 3, alpha=2.0).tolist()
        [1.0, 0.5, 0.25]
        >>> layer_weights("measured", 2, spectrum=[3.0, 1.0]).tolist()
        [1.5, 0.5]
    """
    check_choice("schedule", schedule, SCHEDULES)
    check_int("n_layers", n_layers)
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
    if schedule == "measured":
        floor = 1e-6 * s.max()
        if (s < floor).any():
            warnings.warn(f"clipping non-positive layer curvature {s.tolist()} to {floor:.3g}", RuntimeWarning,
                          stacklevel=2)
        w = np.maximum(s, floor)
    else:
        w = geometric_fit(s).profile(n_layers)
    return w / w.mean()
