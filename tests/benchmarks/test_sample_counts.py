"""benchmarks.sample_counts: the distance of a sample count's values to the whole experience's."""

import math

import pytest

from benchmarks.sample_counts import ALL, compare, count_kwargs, report


def _run(seed, k, values, seconds):
    return {"seed": seed, "eval_samples": k, "train_s": 10.0, "metric_s": seconds, "values": values}


def test_compare_measures_each_run_against_its_seeds_whole_experience():
    full = {("CycleAccuracy", "", "0", "5"): 0.50, ("TAA", "", "0", "5"): 0.40}
    half = {("CycleAccuracy", "", "0", "5"): 0.53, ("TAA", "", "0", "5"): 0.39}
    rows = compare([_run(0, ALL, full, 2.0), _run(0, 500, half, 0.5)], "CycleAccuracyMetric")
    assert rows[0]["CycleAccuracy_max"] == 0.0 and rows[0]["share"] == 0.2
    assert rows[1]["CycleAccuracy_mean"] == pytest.approx(0.03) and rows[1]["TAA_max"] == pytest.approx(0.01)
    assert rows[1]["share"] == 0.05 and rows[1]["missing"] == 0
    text = report({"command": "cmd", "config": {"metric": "CycleAccuracyMetric"}, "runs": rows})
    line = next(line for line in text.splitlines() if line.startswith("| 500 |"))
    assert "5.0 %" in line and f"{math.sqrt(0.25 / 500):.4f} (500 samples)" in line


def test_estimator_counts_are_compared_relative_to_the_larger_reference_count():
    ref = {("OptimizationReadiness", "", "0", "5"): 2.0, ("ORLoss", "", "0", "5"): 1.0}
    small = {("OptimizationReadiness", "", "0", "5"): 2.5, ("ORLoss", "", "0", "5"): 9.0}
    metric = "OptimizationReadinessMetric"
    rows = compare([_run(0, 1024, ref, 4.0), _run(0, 64, small, 0.5)], metric)
    # relative to the reference: |2.5 - 2| / 2, and ORLoss is not an OR value
    assert rows[1]["OptimizationReadiness_mean"] == pytest.approx(0.25) and rows[0]["OptimizationReadiness_max"] == 0.0
    text = report({"command": "cmd", "config": {"metric": metric}, "runs": rows})
    assert "| 1024 (reference) |" in text and "rel. diff." in text and "std. error" not in text


def test_count_kwargs_set_each_metrics_own_keyword():
    assert count_kwargs("OptimizationReadinessMetric", 64) == {"n_samples": 64, "n_batches": 32}
    assert count_kwargs("TransportKeyMetric", ALL) == {"eval_samples": None}
