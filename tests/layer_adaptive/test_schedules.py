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


# --------------------------------------------------------------------------------------------
# dead (s_l = 0) and extreme layers


def _spectrum(names, top):
    from avalanche_plugins.layer_adaptive.hessian import LayerSpectrum

    n = len(names)
    return LayerSpectrum(names=list(names), top=np.asarray(top, dtype=float), dominant=np.asarray(top, dtype=float),
                         iterations=[1] * n, converged=[True] * n, last_relative_change=[0.0] * n)


def test_profile_leaves_dead_layers_out_of_kappa_and_alpha_hat_with_a_warning():
    from avalanche_plugins.layer_adaptive.profile import layer_profile

    with pytest.warns(RuntimeWarning, match=r"dead layer.*\['features\.3'\]"):
        profile = layer_profile(0, _spectrum(["features.0", "features.3", "head"], [8.0, 0.0, 2.0]))
    assert profile.dead_layers == ["features.3"]
    assert profile.kappa == 4.0  # 8 / 2: the live layers only, finite
    assert profile.alpha_hat == pytest.approx(2.0)  # the fit at the live layers' depths 0 and 2: 8 -> 2
    assert profile.spectrum == [8.0, 0.0, 2.0]  # s_l as measured
    with pytest.warns(RuntimeWarning, match="dead layer"):
        one_live = layer_profile(1, _spectrum(["a", "b"], [0.0, 3.0]))
    assert one_live.kappa == 1.0 and one_live.alpha_hat is None
    with pytest.warns(RuntimeWarning, match="dead layer"):
        none_live = layer_profile(2, _spectrum(["a", "b"], [0.0, -1.0]))
    assert none_live.kappa is None and none_live.alpha_hat is None and none_live.dead_layers == ["a", "b"]


def test_profile_of_a_really_dead_layer_is_finite():
    import warnings

    import torch
    from torch import nn

    from avalanche_plugins.layer_adaptive import layer_curvature
    from avalanche_plugins.layer_adaptive.profile import layer_profile

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():
        net[2].bias.fill_(-100.0)  # every unit after layer "2" is dead: layers "0" and "2" get no gradient
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    for method in ("fisher", "hessian"):
        spectrum = layer_curvature(net, nn.CrossEntropyLoss(), x, y, method=method)
        assert spectrum.top[0] == 0 and spectrum.top[1] == 0 and spectrum.top[2] > 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            profile = layer_profile(0, spectrum)
        assert any("['0', '2']" in str(w.message) for w in caught)
        assert profile.kappa == 1.0 and np.isfinite(profile.kappa)


def test_smoothed_gives_dead_layers_the_fitted_weight_and_clips_extreme_fits():
    with pytest.warns(RuntimeWarning, match=r"dead layers \['b'\]"):
        w = layer_weights("smoothed", 3, spectrum=[4.0, 0.0, 1.0], names=["a", "b", "c"])
    assert w / w[0] == pytest.approx([1.0, 0.5, 0.25]) and w.mean() == pytest.approx(1.0)
    s = 10.0 ** -np.arange(0, 30, 3)  # kappa 1e27 over 10 layers
    with pytest.warns(RuntimeWarning, match="max_ratio"):
        w = layer_weights("smoothed", 10, spectrum=s)
    assert np.isfinite(w).all() and w.max() / w.min() == pytest.approx(1e6)
    assert w.mean() == pytest.approx(1.0)


def test_measured_gives_dead_and_extreme_layers_the_minimum_weight():
    with pytest.warns(RuntimeWarning, match=r"\['layer 2', 'layer 3'\]"):
        w = layer_weights("measured", 4, spectrum=[1.0, 0.0, 1e-22, 0.5])
    assert w[1] == w[2] == w.min() and w.max() / w.min() == pytest.approx(1e6)
    with pytest.raises(ValueError, match="max_ratio must be >= 1"):
        layer_weights("measured", 2, spectrum=[1.0, 2.0], max_ratio=0.5)
