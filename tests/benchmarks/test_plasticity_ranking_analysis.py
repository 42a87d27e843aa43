"""The pooled analysis of plasticity_ranking (part of its ``--report``): pooled PRA and the noise
ceiling."""

import numpy as np
import pytest

from benchmarks.plasticity_ranking import METRICS, noise_ceiling, pooled_analysis
from benchmarks.plasticity_ranking.ranking import pooled_table


def fake_runs(rng):
    runs = []
    for setting, offset in (("scr/a", 0.0), ("scr/b", 1.0)):
        cks = []
        for _ in range(6):
            gain = offset + rng.uniform()
            record = {m: rng.uniform() for m in METRICS}
            record["or"] = gain  # a perfect predictor within and across runs
            record["strength"] = gain - offset  # perfect within a run, blind to the run offset
            record.update(gain_sgd_k1=gain, gain_sgd_k1_stderr=0.0)
            cks.append(record)
        runs.append({"setting": setting, "seed": 0, "checkpoints": cks})
    return runs


def test_pooled_and_per_run_pra_and_ceiling():
    result = pooled_analysis(fake_runs(np.random.default_rng(0)))["scr"]["sgd_k1"]
    assert result["or"] == {"per_run": 1.0, "pooled": 1.0}
    assert result["strength"]["per_run"] == 1.0
    assert result["strength"]["pooled"] < 0.8  # pooling exposes the missing between-run scale
    assert result["ceiling_pooled"] == 1.0 and result["n_checkpoints"] == 12 and result["n_runs"] == 2
    table = pooled_table(pooled_analysis(fake_runs(np.random.default_rng(0))), "scr", ["sgd_k1"])
    assert "| or | 1.000 | 1.000 |" in table and "| noise ceiling | 1.000 | 1.000 |" in table


def test_noise_ceiling_matches_a_monte_carlo_estimate():
    rng = np.random.default_rng(1)
    gains, se = np.array([0.0, 0.05, 0.3]), np.array([0.05, 0.05, 0.05])
    hits = []
    for _ in range(20000):
        noisy = gains + rng.normal(0, se)
        hits.append(np.mean([(noisy[i] < noisy[j]) for i, j in ((0, 1), (0, 2), (1, 2))]))
    assert noise_ceiling(gains, se) == pytest.approx(np.mean(hits), abs=0.01)
    # the limits of docs/benchmarks.md, "Pooled analysis": no noise, and a near tie
    assert round(noise_ceiling([0.1, 0.2, 0.3], [0.0, 0.0, 0.0]), 3) == 1.0
    assert round(noise_ceiling([0.1, 0.1 + 1e-9], [0.05, 0.05]), 2) == 0.5
