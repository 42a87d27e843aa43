"""benchmarks.diagnostics_cost: the field settings' study configs (studies/diagnostics_cost_*.yaml)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from benchmarks.diagnostics_cost import LEAN_METRICS, METRICS, setting_config

STUDIES = Path(__file__).resolve().parents[2] / "studies"


def test_the_field_studies_attach_the_demos_diagnostics_at_its_arguments():
    demo = yaml.safe_load((STUDIES / "demo.yaml").read_text())["metrics"]
    assert METRICS == [m for m in demo if m != "NewbornGradientMetric"] and len(METRICS) == 5
    for setting in ("fashion", "resnet18"):
        saved = yaml.safe_load((STUDIES / f"diagnostics_cost_{setting}.yaml").read_text())
        assert saved["metrics"] == METRICS, setting  # a standalone run is the benchmark's "with" run


@pytest.mark.parametrize("counts, metrics", [("demo", METRICS), ("lean", LEAN_METRICS)])
def test_setting_config_sets_the_epochs_image_counts_and_diagnostics(counts, metrics):
    fashion = setting_config("fashion/5", counts=counts)
    assert fashion["training"] == {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "epochs": 5,
                                   "batch_size": 128, "eval_batch_size": 1000}
    assert fashion["scenarios"] == [{"name": "split_fashion_mnist", "benchmark": "split_fashion_mnist",
                                     "n_experiences": 5}]
    assert fashion["metrics"] == metrics and setting_config("fashion/1")["training"]["epochs"] == 1
    resnet = setting_config("resnet18", SimpleNamespace(resnet_images=300, resnet_test_images=40), counts)
    assert resnet["scenarios"][0]["kwargs"] == {"images": 300, "test_images": 40}
    assert resnet["model"] == {"name": "cifar_resnet", "kwargs": {"depth": 18}} and resnet["training"]["epochs"] == 1
    assert setting_config("demo") == STUDIES / "demo.yaml"
