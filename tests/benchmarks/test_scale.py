"""``benchmarks.scale``: the log-log slope fit, the per-process runner (timeout, memory cap, errors
become rows) and a smoke run of the tiniest configuration."""

import csv
import json
import math
import time

import pytest
import torch

from benchmarks import scale
from benchmarks.scale.measure import Config, Job, rss_gb
from benchmarks.scale.report import MAIN_COLUMNS, loglog_slope, slopes
from benchmarks.scale.runner import ProcessExecutor


def test_loglog_slope_recovers_known_exponents():
    n = [1e3, 3e3, 1e4, 1e5]
    assert loglog_slope(n, [5e-9 * x**2 for x in n]) == pytest.approx(2.0)
    assert loglog_slope(n, [0.3 * x for x in n]) == pytest.approx(1.0)
    assert loglog_slope(n, [7.0] * 4) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(loglog_slope([1e3, 1e3], [1.0, 2.0]))  # one distinct size: no slope
    assert math.isnan(loglog_slope([1e3, 1e4], [1.0, None]))  # failed measurements are left out


def test_slopes_per_family_and_estimator():
    rows = [{"model": f"mlp-{p}", "family": "mlp", "params": p, "estimator": "ads", "status": "ok",
             "time_s": 1e-10 * p**2, "peak_rss_gb": 1e-3 * p**0.5} for p in (1e4, 1e5, 1e6)]
    rows.append({"model": "resnet8", "family": "resnet", "params": 8e4, "estimator": "ads", "status": "timeout",
                 "time_s": None, "peak_rss_gb": 3.0})
    (entry,) = slopes(rows)
    assert entry["time_slope_mlp"] == pytest.approx(2.0)
    assert entry["rss_slope_mlp"] == pytest.approx(0.5)
    assert math.isnan(entry["time_slope_resnet"]) and entry["n_resnet"] == 0


def _sleep(job, report=None):
    report({"params": 7})
    time.sleep(60)


def _fail(job, report=None):
    raise ValueError("bad input: expected something else")


def _allocate(job, report=None):
    import torch

    return {"n": torch.empty(int(2e9) // 4).numel()}  # 2 GB more than the cap allows


def _run(fn, **kwargs):
    executor = ProcessExecutor(start_method="fork", **kwargs)
    return dict(executor.map_unordered(fn, [Job("mlp-256", "ads", 0, Config())]))


def test_runner_records_timeout_error_and_memory_cap_as_rows():
    start = time.perf_counter()
    (row,) = _run(_sleep, timeout_of=lambda job: 0.5).values()
    assert row["status"] == "timeout" and "timed out" in row["message"] and row["timeout_s"] == 0.5
    assert row["params"] == 7  # what the child reported before it was killed
    assert time.perf_counter() - start < 20
    (row,) = _run(_fail, timeout_of=lambda job: 30).values()
    assert row["status"] == "error" and "ValueError: bad input" in row["message"]
    (row,) = _run(_allocate, timeout_of=lambda job: 30, max_rss_gb=rss_gb() + 0.5).values()
    assert row["status"] == "out_of_memory" and "GB failed" in row["message"]


def test_bad_arguments_name_the_flag(capsys):
    with pytest.raises(SystemExit):
        scale.main(["--models", "resnet50"])
    assert "--models must be a subset" in capsys.readouterr().err
    with pytest.raises(ValueError, match="start_method"):
        ProcessExecutor(timeout_of=lambda job: 1, start_method="thread")


def test_tiniest_run_writes_table_csv_plot_and_report(tmp_path):
    # fork: children start in milliseconds from this process (a few seconds in all, so not slow)
    out = scale.main(["--quick", "--models", "mlp-256", "--estimators", "epoch,key_channel,unit_masks",
                      "--skip", "unit_masks", "--start-method", "fork", "--no-progress", "--out", str(tmp_path)])
    rows = out["rows"]
    assert [r["estimator"] for r in rows] == ["epoch", "key_channel"]  # --skip left unit_masks out
    assert all(r["status"] == "ok" and r["time_s"] > 0 and r["peak_rss_gb"] > 0 for r in rows)
    epoch, key = rows
    assert epoch["ratio"] == pytest.approx(1.0)  # the reference row is the 5,000-image epoch itself
    assert key["ratio"] == pytest.approx(key["time_s"] / key["epoch5000_s"])
    header = next(line for line in out["report"].splitlines() if line.startswith("| model |"))
    assert [c.strip() for c in header.strip("|").split("|")] == list(MAIN_COLUMNS)
    with open(tmp_path / "results.csv") as f:
        columns = next(csv.reader(f))
    assert {"model", "params", "estimator", "setting", "time_s", "ratio", "peak_rss_gb", "status"} <= set(columns)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["command"].startswith("python -m benchmarks.scale --quick")
    assert (tmp_path / "scale.png").exists()
    assert scale.main(["--report", str(tmp_path / "results.json")])["report"] + "\n" == \
        (tmp_path / "report.md").read_text()


def test_mnist_shaped_resnet18_runs_the_expected_fisher_on_its_own_inputs(tmp_path, capsys):
    # the 1-channel torchvision ResNet-18 check of issue 15: MNIST-shaped tensors and --fisher-samples
    from benchmarks.scale.measure import data_for, synthetic

    x, y = synthetic(Job("resnet18-mnist", "epoch", 3, Config()), 5)
    assert x.shape == (5, 1, 28, 28) and int(y.max()) < 10
    x_cifar, _ = synthetic(Job("resnet8", "epoch", 3, Config()), 5, 1)
    assert x_cifar.shape == (5, 3, 32, 32) and torch.equal(x_cifar, torch.randn(5, 3, 32, 32,
                                                                              generator=torch.Generator().manual_seed(4)))
    out = scale.main(["--quick", "--models", "resnet18-mnist", "--estimators", "epoch,fisher_expected",
                      "--fisher-samples", "2", "--start-method", "fork", "--no-progress",
                      "--out", str(tmp_path)])
    epoch, fisher = out["rows"]
    assert epoch["status"] == fisher["status"] == "ok" and fisher["samples"] == 2
    assert fisher["family"] == "resnet-mnist" and fisher["setting"] == "2 samples, defaults"
    saved = json.loads((tmp_path / "results.json").read_text())
    assert list(saved["timeouts_s"]) == ["resnet18-mnist/fisher_expected"]
    assert saved["data"] == {"name": "synthetic MNIST-shaped tensors", "shape": [1, 28, 28], "classes": 10,
                             "seeded": True}
    assert data_for(["mlp-256", "resnet8"]) == {"name": "synthetic CIFAR-shaped tensors",  # as before
                                                      "shape": [3, 32, 32], "classes": 100, "seeded": True}
    assert [d["name"] for d in data_for(["resnet8", "resnet18-mnist"])["inputs"]] == \
        ["synthetic CIFAR-shaped tensors", "synthetic MNIST-shaped tensors"]
    for flag in ("--fisher-samples", "--timeout"):
        with pytest.raises(SystemExit):
            scale.main([flag, "0"])
        assert f"argument {flag}: must be" in capsys.readouterr().err


def test_ads_measurement_uses_the_metric_defaults():
    # the targets table times "ADS at the metric's defaults": keep the two in step
    import inspect

    from avalanche_plugins import ArchitectureDrivenShiftMetric

    default = inspect.signature(ArchitectureDrivenShiftMetric).parameters["calibration_size"].default
    assert Config().ads_samples == default


def test_estimators_yaml_describes_every_measurement_in_run_order():
    # one table says what each measurement is (what, setting, expected cost, target); the code is ESTIMATORS
    from benchmarks.scale.measure import ESTIMATORS, INFO, MODELS, setting_for

    assert list(INFO) == list(ESTIMATORS)
    fields = {"what", "setting", "expected_epochs", "timeout_epochs", "target", "memory_target"}
    for name, info in INFO.items():
        assert {"what", "setting", "expected_epochs"} <= set(info) <= fields, name
        assert len(info.get("target", [None, None, ""])) == 3, name
        for model in MODELS:
            for cfg in (Config(), Config(quick=True)):
                assert "{" not in setting_for(Job(model, name, 0, cfg))
    assert setting_for(Job("resnet18", "masked_epoch", 0, Config())) == "50 % units masked, 128 images"
    assert setting_for(Job("resnet8", "key_channel", 0, Config(anchors=50))) == \
        "50 anchors at layer2 (activations + fit)"
    assert setting_for(Job("mlp-256", "curvature_hessian", 0, Config())) == "32 samples, max_iter 10"
    # a saved run's report still reads a measurement estimators.yaml no longer has: no target, 4 GB bound
    from benchmarks.scale.report import targets_table

    row = {"model": "resnet18", "family": "resnet", "estimator": "renamed", "status": "ok", "time_s": 1.0,
           "ratio": 0.5, "peak_rss_gb": 5.0, "params": 11e6}
    assert targets_table([row]).splitlines()[-1].endswith("| ≤ 4 GB | no: memory |")
