"""The demo's diagnostics log the values they logged before they were made cheaper (issue 41).

``tests/data/demo_diagnostics_reference.json`` holds every diagnostic value a cut-down demo job
logged (``tests/demo_diagnostics_config.py``: Naive and Grow, one seed, one epoch, every metric of
the demo at its arguments), recorded from the code before issue 41's changes. Rerunning the same
jobs must log the same labels and the same values up to float rounding: the estimators compute in
float32 (eps ≈ 1.2e-7); reordering a sum of n float32 terms (a different chunking or a shared
pass) moves it by about sqrt(n)·eps relative, so a relative tolerance of 1e-4 (n up to a few
thousand terms, a few reductions deep) and an absolute one of 1e-6 (values that are differences
near 0) hold every rounding change and no change of method: the smallest real change (one of 91
test samples classified differently) moves an accuracy by 1.1e-2.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.demo_diagnostics_config import REFERENCE, run_reference_jobs

REL, ABS = 1e-4, 1e-6


@pytest.fixture(scope="module")
def rerun():
    return run_reference_jobs()


@pytest.mark.parametrize("strategy", ["Naive", "Grow"])
def test_every_logged_diagnostic_equals_the_reference(rerun, strategy):
    expected = json.loads(REFERENCE.read_text())[strategy]
    got = rerun[strategy]
    assert sorted(got) == sorted(expected)
    off = {label: (got[label], value) for label, value in expected.items()
           if not math.isclose(got[label], value, rel_tol=REL, abs_tol=ABS)}
    assert not off, f"{len(off)} of {len(expected)} values moved: {dict(list(off.items())[:10])}"


def test_the_reference_covers_every_metric_of_the_demo():
    reference = json.loads(REFERENCE.read_text())
    metrics = {label.split("/")[3] for values in reference.values() for label in values}
    for name in ("OptimizationReadiness", "ADS", "ADSRealisedShift", "TransportKeyAcc", "LayerSensitivityKappa",
                 "LayerSensitivityAlphaHat", "CycleAccuracy", "NewbornGradientRatio"):
        assert name in metrics, name
