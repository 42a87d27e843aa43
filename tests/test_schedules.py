"""Layer weight schedules."""

import numpy as np
import pytest

from avalanche_plugins.layer_adaptive import geometric_fit, layer_weights


def test_schedules_closed_forms():
    assert layer_weights("uniform", 4).tolist() == [1.0] * 4
    assert np.allclose(layer_weights("geometric", 4, alpha=0.5), [1, 2, 4, 8])
    s = np.array([9.0, 3.0, 1.0, 2.0])
    measured = layer_weights("measured", 4, spectrum=s)
    assert np.allclose(measured, s / s.mean()) and measured.mean() == pytest.approx(1.0)
    smoothed = layer_weights("smoothed", 4, spectrum=s)
    fit = geometric_fit(s)
    assert np.allclose(smoothed[1:] / smoothed[:-1], 1 / fit.alpha)  # exactly geometric
    assert smoothed.mean() == pytest.approx(1.0)


def test_measured_clips_non_positive_curvature_with_warning():
    with pytest.warns(RuntimeWarning, match="clipping"):
        w = layer_weights("measured", 3, spectrum=[2.0, -1.0, 1.0])
    assert (w > 0).all() and w[1] < 1e-5


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(schedule="cosine", n_layers=3), "schedule must be one of"),
    (dict(schedule="geometric", n_layers=3), "alpha is required"),
    (dict(schedule="geometric", n_layers=3, alpha=0.0), "alpha must be"),
    (dict(schedule="measured", n_layers=3), "needs the measured spectrum"),
    (dict(schedule="measured", n_layers=3, spectrum=[1.0, 2.0]), "3 values"),
    (dict(schedule="measured", n_layers=2, spectrum=[1.0, float("nan")]), "non-finite"),
    (dict(schedule="uniform", n_layers=0), "n_layers"),
])
def test_bad_input(kwargs, message):
    schedule = kwargs.pop("schedule")
    n_layers = kwargs.pop("n_layers")
    with pytest.raises(ValueError, match=message):
        layer_weights(schedule, n_layers, **kwargs)
