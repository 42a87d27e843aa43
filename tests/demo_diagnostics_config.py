"""The cut-down demo job whose diagnostic values ``tests/data/demo_diagnostics_reference.json`` holds.

The demo's settings (``studies/demo.yaml``: Split digits, the recipes' MLP, every diagnostic at
the demo's arguments) written out in full (no recipe lookup, so later recipe edits leave the
reference alone), one seed, one epoch: Naive at lr 0.01 and Grow at lr 0.05, as the shipped
recipes had them when the reference was recorded (issue 41, before the diagnostics were made
cheaper). ``python -m tests.demo_diagnostics_config`` rewrites the reference: only ever from code
whose values are the ones to keep.
"""

from __future__ import annotations

import json
from pathlib import Path

REFERENCE = Path(__file__).parent / "data" / "demo_diagnostics_reference.json"
UNLOGGED = ("Top1_", "Forgetting", "BWT", "TAA")  # Avalanche's own scores: not diagnostics
CONFIG = {
    "name": "demo_diagnostics_reference",
    "seeds": 1,
    "reference": "Naive",
    "scenarios": [{"name": "split_digits", "benchmark": "split_digits", "n_experiences": 5}],
    "model": {"name": "mlp", "kwargs": {"hidden": [100, 100]}},
    "training": {"optimizer": "sgd", "lr": 0.05, "epochs": 1, "batch_size": 32, "eval_batch_size": 512},
    "strategies": [
        {"name": "Naive", "training": {"lr": 0.01}},
        {"name": "Grow", "class": "Naive", "plugins": [{"name": "GrowPlugin", "kwargs": {
            "target_compactness": 0.5, "seed_compactness": 0.2, "grow_fraction_per_cycle": 0.2,
            "outgoing": "zero", "track_newborn": True}}]},
    ],
    "metrics": [
        "LayerSensitivityMetric",
        {"name": "OptimizationReadinessMetric", "kwargs": {"n_samples": 256}},
        {"name": "ArchitectureDrivenShiftMetric", "kwargs": {"calibration_size": 128}},
        {"name": "TransportKeyMetric", "kwargs": {"stages": "auto", "experiences": [0], "n_anchors": 50}},
        "CycleAccuracyMetric",
        "NewbornGradientMetric",
    ],
}


def diagnostic_values(rows) -> dict[str, float]:
    """``{"phase/training_experience/experience/metric/key": value}`` of a run's logged
    diagnostics (its tidy rows, Avalanche's accuracy, forgetting and BWT left out)."""
    out = {}
    for row in rows:
        if any(part in row["metric"] for part in UNLOGGED) or row["value"] in ("", None):
            continue
        label = "/".join(str(row[k]) for k in ("phase", "training_experience", "experience", "metric", "key"))
        if label in out:
            raise AssertionError(f"{label} logged twice")
        out[label] = float(row["value"])
    return out


def run_reference_jobs() -> dict[str, dict[str, float]]:
    """Run each strategy of :data:`CONFIG` in this process; ``{strategy: diagnostic values}``."""
    from avalanche_plugins.study.api import load_study, plan_test_jobs
    from avalanche_plugins.study.run.job import run_job

    study = load_study(CONFIG)
    out = {}
    for job in plan_test_jobs(study, {}):
        row = run_job(job)
        if row["status"] != "ok":
            raise AssertionError(f"{job.run_name}: {row['status']}: {row.get('error')}")
        out[job.strategy.name] = diagnostic_values(row["metrics"])
    return out


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    REFERENCE.write_text(json.dumps(run_reference_jobs(), indent=0, sort_keys=True) + "\n")
    print(REFERENCE)
