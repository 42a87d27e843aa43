"""``layer_adaptive.options``: the option groups and the flat keywords they replace."""

from __future__ import annotations


def test_option_groups_are_the_flat_keywords():
    import pickle

    import pytest

    from avalanche_plugins.layer_adaptive import CurvatureOptions, FisherOptions
    from avalanche_plugins.layer_adaptive.ewc_plugin import LayerAdaptiveEWCPlugin
    from avalanche_plugins.layer_adaptive.lr_plugin import LayerAdaptiveLRPlugin

    flat = LayerAdaptiveEWCPlugin(10.0, schedule="smoothed", curvature="hessian", spectrum_samples=32,
                                  spectrum_max_iter=7, fisher="expected", fisher_chunk_size=4, seed=3)
    grouped = LayerAdaptiveEWCPlugin(10.0, schedule="smoothed",
                                     curvature_options=CurvatureOptions("hessian", 32, spectrum_max_iter=7, seed=3),
                                     fisher_options=FisherOptions("expected", fisher_chunk_size=4))
    keys = ("curvature", "spectrum_samples", "spectrum_chunk_size", "spectrum_max_iter", "spectrum_tol", "seed",
            "fisher", "fisher_samples", "fisher_chunk_size")
    assert {k: getattr(flat, k) for k in keys} == {k: getattr(grouped, k) for k in keys}
    assert pickle.loads(pickle.dumps(grouped)).spectrum_samples == 32
    assert LayerAdaptiveLRPlugin(curvature_options=CurvatureOptions(spectrum_samples=16)).spectrum_samples == 16
    with pytest.raises(ValueError, match="give either curvature_options or the keywords spectrum_samples"):
        LayerAdaptiveEWCPlugin(1.0, spectrum_samples=8, curvature_options=CurvatureOptions())
    with pytest.raises(ValueError, match="spectrum_samples"):
        CurvatureOptions(spectrum_samples=0)
    with pytest.raises(ValueError, match="fisher"):
        FisherOptions(fisher="diagonal")
