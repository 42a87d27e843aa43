"""``avalanche_plugins.study``: config validation, a tiny study checked against independent statistics,
resuming from the cache, the CLI, and the demo study in its quick form."""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from avalanche_plugins.study import ConfigError, load_study, run_study
from avalanche_plugins.study.catalog.registry import source_hash
from avalanche_plugins.study.report.stats import holm, summarize_study
from tests import REPO_ROOT

ROOT = REPO_ROOT

# A user's own module: a model and a benchmark factory the project never heard of.
USER_MODULE = textwrap.dedent('''
    import torch
    from torch import nn

    from avalanche_plugins.study.catalog.datasets import make_stream


    def tiny_mlp(input_shape, n_classes, width=16):
        inputs = int(torch.tensor(input_shape).prod())
        return nn.Sequential(nn.Flatten(), nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, n_classes))


    def two_digit_tasks(seed=0, validation=False, n_experiences=2):
        return make_stream("digits", "split", n_experiences=n_experiences, seed=seed, validation=validation)
''')


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user_code")
    (folder / "study_user_code.py").write_text(USER_MODULE)
    sys.path.insert(0, str(folder))
    yield "study_user_code"
    sys.path.remove(str(folder))
    sys.modules.pop("study_user_code", None)


def tiny_config(module: str) -> dict:
    return {
        "name": "tiny",
        "seeds": 2,
        "reference": "Naive",
        "scenarios": [{"name": "two_tasks", "benchmark": f"{module}:two_digit_tasks", "kwargs": {"n_experiences": 2}}],
        "model": {"name": f"{module}:tiny_mlp", "kwargs": {"width": 16}},
        "training": {"lr": 0.05, "epochs": 1, "batch_size": 64},
        "strategies": [
            {"name": "Naive"},
            {"name": "LwF", "kwargs": {"temperature": 2.0, "alpha": 1.0}, "grid": {"alpha": [0.1, 3.0]}},
        ],
        "metrics": [{"name": "OptimizationReadinessMetric", "kwargs": {"n_samples": 64, "n_batches": 8}},
                    {"name": "loss_metrics", "kwargs": {"experience": True}}],
    }


# ------------------------------------------------------------------------------------------------
# validation


def _base() -> dict:
    return {"scenarios": ["split_digits"],
            "strategies": ["Naive", {"name": "Replay", "kwargs": {"mem_size": 50}},
                           {"name": "EWC", "kwargs": {"ewc_lambda": 10.0}}]}


def _with(path: str, value) -> dict:
    config = _base()
    target = config
    keys = path.split("/")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target.setdefault(key, {})
    target[keys[-1]] = value
    return config


@pytest.mark.parametrize(("path", "value", "message"), [
    ("strategies/2/kwargs/ewc_lambda", "x", "strategies[2].kwargs.ewc_lambda: expected a number, got 'x'"),
    ("strategies/2/kwargs/lambda_ewc", 1.0, "strategies[2].kwargs.lambda_ewc: EWC has no argument 'lambda_ewc'"),
    ("strategies/2/kwargs/model", 1.0, "strategies[2].kwargs.model: set by the study itself"),
    ("strategies/1/name", "Replayy", "strategies[1].name: unknown Avalanche strategy 'Replayy'"),
    ("strategies/1/colour", "red", "strategies[1].colour: unknown key"),
    ("strategies/2/grid", {"ewc_lambda": [1.0, "big"]}, "strategies[2].grid.ewc_lambda[1]: expected a number, got 'big'"),
    ("strategies/2/grid", {"EWCPlugin.ewc_lambda": [1.0]}, "strategies[2].grid.EWCPlugin.ewc_lambda: 'EWCPlugin' is neither"),
    ("strategies/2/grid", {"training.lr": [0.1, -1]}, "strategies[2].grid.training.lr[1]: expected a positive number, got -1"),
    ("seeds", 0, "seeds: expected an integer >= 1, got 0"),
    ("reference", "SI", "reference: 'SI' is not a strategy name"),
    ("colour", "red", "colour: unknown key"),
    ("training/epochs", 1.5, "training.epochs: expected an integer >= 1, got 1.5"),
    ("training/optimizer", "lbfgs", "training.optimizer: expected one of sgd, adam, adamw"),
    ("model", {"name": "mlp", "kwargs": {"hidden": "wide"}}, "model.kwargs.hidden: expected a list, got 'wide'"),
    ("model", "no_such_module:net", "model.name: cannot import module 'no_such_module'"),
    ("metrics", [{"name": "OptimizationReadinessMetric", "kwargs": {"n_samples": "all"}}],
     "metrics[0].kwargs.n_samples: expected an integer, got 'all'"),
    ("metrics", ["AccuracyMetrics"], "metrics[0].name: unknown metric 'AccuracyMetrics'"),
    ("metrics", ["accuracy_metrics"], "metrics[0].name: accuracy_metrics is attached to every run already"),
    ("loggers", ["mlflow"], "loggers[0]: expected one of tensorboard, wandb, text"),
    ("scenarios", [{"benchmark": "split_imagenet"}], "scenarios[0].benchmark: expected one of split_digits"),
    ("scenarios", [{"benchmark": "split_digits", "n_experiences": "five"}], "scenarios[0].n_experiences: expected an integer"),
])
def test_invalid_config_names_the_key(path, value, message):
    with pytest.raises(ConfigError) as error:
        load_study(_with(path, value))
    assert str(error.value).startswith(message), str(error.value)


def test_required_strategy_argument_is_named():
    config = _base()
    config["strategies"].append({"name": "AGEM", "kwargs": {"sample_size": 16}})
    with pytest.raises(ConfigError, match=r"^strategies\[3\]\.kwargs: AGEM needs patterns_per_exp$"):
        load_study(config)


def test_data_root_fills_scenarios_that_name_none():
    config = {"scenarios": [{"benchmark": "split_mnist", "data_root": None}, {"benchmark": "permuted_mnist",
                                                                              "data_root": "mine"}],
              "strategies": ["Naive"]}
    assert [s.data_root for s in load_study(config, data_root="given").scenarios] == ["given", "mine"]


def test_yaml_and_toml_give_the_same_study(tmp_path):
    (tmp_path / "s.yaml").write_text(textwrap.dedent("""
        name: same
        scenarios: [split_digits]
        strategies:
          - name: EWC
            kwargs: {ewc_lambda: 10.0}
            grid: {ewc_lambda: [1.0, 10.0]}
    """))
    (tmp_path / "s.toml").write_text(textwrap.dedent("""
        name = "same"
        scenarios = ["split_digits"]
        [[strategies]]
        name = "EWC"
        kwargs = {ewc_lambda = 10.0}
        grid = {ewc_lambda = [1.0, 10.0]}
    """))
    yaml_study, toml_study = load_study(tmp_path / "s.yaml"), load_study(tmp_path / "s.toml")
    assert yaml_study.as_dict() == toml_study.as_dict()
    assert yaml_study.strategies[0].spec.grid_values() == {"ewc_lambda": [1.0, 10.0]}
    grid = yaml_study.strategies[0].spec.grid[0]  # the grid key parsed once, by the loader
    assert (grid.kind, grid.index, grid.argument, grid.values) == ("strategy", None, "ewc_lambda", (1.0, 10.0))


def test_holm_and_paired_tests_match_a_hand_computation():
    # three strategies against a reference over 3 seeds: differences chosen by hand
    acc = {"Ref": [0.50, 0.60, 0.70], "A": [0.60, 0.71, 0.79], "B": [0.52, 0.60, 0.73], "C": [0.40, 0.52, 0.55]}
    rows = [{"scenario": "s", "strategy": name, "setting": "default", "seed": seed, "acc": v, "forgetting": 0.1 * seed,
             "bwt": -0.1 * seed} for name, values in acc.items() for seed, v in enumerate(values)]
    summary = summarize_study(rows, "Ref", list(acc))
    raw = {name: stats.ttest_rel(acc[name], acc["Ref"]).pvalue for name in "ABC"}
    order = sorted(raw, key=raw.get)  # Holm by hand: (m - rank) * p, running maximum, capped at 1
    expected, running = {}, 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (3 - rank) * raw[name]))
        expected[name] = running
    for entry in summary[1:]:
        test = entry["tests"]["acc"]
        assert test["p"] == pytest.approx(raw[entry["strategy"]])
        assert test["p_holm"] == pytest.approx(expected[entry["strategy"]])
    assert holm([0.01, float("nan"), 0.04]) == pytest.approx([0.02, float("nan"), 0.04], nan_ok=True)
    assert summary[0]["tests"] == {}  # the reference is not tested against itself


# ------------------------------------------------------------------------------------------------
# a tiny study end to end


@pytest.fixture(scope="module")
def tiny_study(user_module, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_study")
    result = run_study(tiny_config(user_module), out=out, progress=False)
    return result, out


def _runs_from_csv(path: Path) -> dict:
    """Accuracy matrices per (strategy, seed) of the test runs, read from the tidy CSV alone."""
    cells: dict = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["split"] == "test" and row["metric"] == "Top1_Acc_Exp" and row["phase"] == "eval":
                run = cells.setdefault((row["strategy"], int(row["seed"])), {})
                run[int(row["training_experience"]), int(row["experience"])] = float(row["value"])
    out = {}
    for key, run in cells.items():
        n = 1 + max(i for i, _ in run)
        out[key] = np.array([[run[i, j] for j in range(n)] for i in range(n)])
    return out


def test_tiny_study_writes_csv_tables_figures_and_report(tiny_study):
    result, out = tiny_study
    for name in ("metrics.csv", "results.json", "tables.md", "tables.tex", "report.md", "jobs.jsonl"):
        assert (out / name).is_file(), name
    figures = {p.name for p in (out / "figures").iterdir()}
    assert {"accuracy_matrix_two_tasks.png", "accuracy_stream_two_tasks.png", "readiness_two_tasks.png"} <= figures
    report = result.report.read_text()
    assert "![accuracy matrix two tasks](figures/accuracy_matrix_two_tasks.png)" in report
    assert result.tables["markdown"] in report
    with open(out / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames[:5] == ["scenario", "strategy", "setting", "seed", "split"]
        rows = list(reader)
    names = {r["metric"] for r in rows if r["split"] == "test"}
    assert {"Top1_Acc_Exp", "StreamForgetting", "StreamBWT", "OptimizationReadiness", "Loss_Exp"} <= names
    assert {r["split"] for r in rows} == {"validation", "test"}
    assert len(result.rows) == 4 and {(r.strategy, r.seed) for r in result.rows} == {
        ("Naive", 0), ("Naive", 1), ("LwF", 0), ("LwF", 1)}
    assert "\\begin{tabular}" in result.tables["latex"] and "\\textbf{" in result.tables["latex"]
    factory = json.loads((out / "results.json").read_text())["data"]["two_tasks"]  # a user's factory: named, hashed
    assert factory["factory"] == {"name": result.study.scenarios[0].benchmark, "kwargs": {"n_experiences": 2},
                                  "module_sha256": source_hash(result.study.scenarios[0].benchmark.split(":")[0])}
    assert (factory["setting"], factory["experiences"], factory["classes_per_experience"]) == \
        ("class-incremental", 2, [5, 5])


def test_tiny_study_statistics_match_an_independent_computation(tiny_study):
    result, out = tiny_study
    matrices = _runs_from_csv(out / "metrics.csv")
    scores = {}
    for key, acc in matrices.items():
        final = acc[-1]
        scores[key] = {"acc": final.mean(), "forgetting": acc[0, 0] - final[0], "bwt": final[0] - acc[0, 0]}
    # Avalanche's own StreamBWT after the last experience is the same backward transfer
    with open(out / "metrics.csv", newline="") as f:
        stream_bwt = {(r["strategy"], int(r["seed"])): float(r["value"]) for r in csv.DictReader(f)
                      if r["split"] == "test" and r["metric"] == "StreamBWT"}
    for key in scores:
        assert stream_bwt[key] == pytest.approx(scores[key]["bwt"], abs=1e-9)
    for entry in result.summary:
        for metric in ("acc", "forgetting", "bwt"):
            values = np.array([scores[entry["strategy"], seed][metric] for seed in (0, 1)])
            a, b = values  # two seeds: the 4 bootstrap resamples have means a, (a+b)/2, (a+b)/2, b
            low, high = np.quantile([a, (a + b) / 2, (a + b) / 2, b], [0.025, 0.975])
            assert min(a, b) <= low <= high <= max(a, b)
            got = entry[metric]
            assert got["mean"] == pytest.approx(values.mean())
            assert got["std"] == pytest.approx(values.std(ddof=1))
            assert (got["ci_low"], got["ci_high"]) == pytest.approx((low, high))
        cell = f"{entry['acc']['mean']:.3f} ± {entry['acc']['std']:.3f} [{entry['acc']['ci_low']:.3f}, {entry['acc']['ci_high']:.3f}]"
        assert cell in result.tables["markdown"]
    lwf = next(e for e in result.summary if e["strategy"] == "LwF")
    assert math.isnan(lwf["tests"]["acc"]["p_holm"]) and "needs >= 3" in lwf["tests"]["acc"]["reason"]
    assert "No p-values: a paired test needs at least 3 seeds (this table has 2)." in result.tables["markdown"]
    assert "| p ACC" not in result.tables["markdown"]
    best = max(result.summary, key=lambda e: e["acc"]["mean"])
    assert f"| {best['strategy']} | {best['setting']} | **" in result.tables["markdown"]


def test_tiny_study_tunes_on_validation_and_tests_the_chosen_setting(tiny_study):
    result, _ = tiny_study
    tuning = [r.as_dict() for r in result.tuning if r.strategy == "LwF"]
    assert sorted(r["setting"] for r in tuning) == ["alpha=0.1", "alpha=3"]
    assert all(r["split"] == "validation" and r["seed"] == 0 for r in tuning)
    winner = max(tuning, key=lambda r: r["acc"])
    assert result.chosen["two_tasks"]["LwF"].label == winner["setting"]
    assert {r.setting for r in result.rows if r.strategy == "LwF"} == {winner["setting"]}


def test_rerun_reuses_the_cache(tiny_study, user_module):
    result, out = tiny_study
    lines = (out / "jobs.jsonl").read_text().count("\n")
    again = run_study(tiny_config(user_module), out=out, progress=False)
    assert (out / "jobs.jsonl").read_text().count("\n") == lines
    assert again.rows == result.rows


def test_saved_study_reads_the_tiny_study_back_into_typed_rows(tiny_study):
    from avalanche_plugins.study.contracts.rows import Choice, SavedStudy

    result, out = tiny_study
    saved = SavedStudy.load(out)
    assert json.dumps([r.as_dict() for r in saved.runs]) == json.dumps([r.as_dict() for r in result.rows])
    assert json.dumps([r.as_dict() for r in saved.tuning]) == json.dumps([r.as_dict() for r in result.tuning])
    assert isinstance(saved.chosen["two_tasks"]["LwF"], Choice)
    assert saved.chosen == result.chosen
    # the JSON form of a finished run is what it always was: these keys, in this order
    assert list(json.loads((out / "results.json").read_text())["runs"][0]) == [
        "scenario", "strategy", "setting", "seed", "split", "acc", "acc_til", "forgetting", "bwt", "fwt", "wall_s",
        "train_s", "diagnostics_s", "figures_s", "callback_s", "peak_memory_mb", "accuracy_matrix", "til_matrix",
        "baseline_accuracy", "stream", "status"]
    assert list(result.tuning[0].as_dict())[-2:] == ["status", "setting_values"]


def test_cli_report_reprints_a_saved_study(tiny_study, capsys):
    from avalanche_plugins.study.cli import run_command as main

    _, out = tiny_study
    main(["report", str(out / "results.json")])
    printed = capsys.readouterr().out
    assert "| Naive | default |" in printed and "Chosen on the validation split (seed 0)" in printed


def test_cli_rejects_a_bad_config_with_the_key(tmp_path, capsys):
    from avalanche_plugins.study.cli import run_command as main

    (tmp_path / "bad.yaml").write_text("scenarios: [split_digits]\nstrategies: [{name: EWC, kwargs: {ewc_lambda: x}}]\n")
    with pytest.raises(SystemExit):
        main(["run", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "o")])
    assert "strategies[0].kwargs.ewc_lambda: expected a number, got 'x'" in capsys.readouterr().err


@pytest.mark.slow  # starting Ray here takes 20-40 s
def test_ray_study_gives_the_local_rows(tiny_study, user_module, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    result, local_out = tiny_study
    folder = str(Path(sys.modules[user_module].__file__).parent)  # the user's module, on Ray's workers too
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (folder, os.environ.get("PYTHONPATH")))))
    remote = run_study(tiny_config(user_module), out=tmp_path, executor="ray", workers=2, progress=False,
                       skip={"Naive"}, isolate=False)  # reused Ray workers: the rows, not the memory, are compared

    def numbers(rows):
        costs = ("wall_s", "train_s", "diagnostics_s", "figures_s", "callback_s", "peak_memory_mb",  # measured
                 "node_ip")  # where it ran
        return [{k: v for k, v in r.as_dict().items() if k not in costs} for r in rows]

    assert numbers(remote.rows) == numbers([r for r in result.rows if r.strategy == "LwF"])
    assert numbers(remote.tuning) == numbers(result.tuning)
    assert _metric_rows(tmp_path) == [r for r in _metric_rows(local_out) if r["strategy"] == "LwF"]


# ------------------------------------------------------------------------------------------------
# the demo study (what `make demo` runs), quick form


def test_shipped_studies_are_valid():
    paths = sorted((ROOT / "studies").glob("*.yaml"))
    assert {p.stem for p in paths} >= {"demo", "split_cifar100_resnet18", "permuted_mnist_baselines"}
    for path in paths:
        for quick in (False, True):
            study = load_study(path, quick=quick)
            assert study.strategies and study.scenarios, path.name


@pytest.mark.slow
def test_demo_study_quick(tmp_path, capsys):
    from avalanche_plugins.study.cli import run_command as main

    result = main(["run", str(ROOT / "studies" / "demo.yaml"), "--quick", "--out", str(tmp_path), "--no-progress"])
    printed = capsys.readouterr().out
    for name in ("Naive", "EWC", "Replay", "LayerAdaptiveEWC", "Grow"):
        assert f"| {name} |" in printed
    figures = {p.name.rsplit("_split_digits", 1)[0] for p in (tmp_path / "figures").iterdir()}
    assert figures == {"accuracy_matrix", "accuracy_stream", "readiness", "ads", "transport", "curvature", "structural"}
    names = {m["metric"] for m in _metric_rows(tmp_path)}
    assert len(result.rows) == 5
    assert {"LayerSensitivity", "OptimizationReadiness", "ADS", "ADSRealisedShift", "TransportKeyRecovery",
            "CycleAccuracy", "NewbornGradientRatio", "Compactness"} <= names
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["chosen"] == {}  # every strategy runs at its shipped recipe: nothing to tune
    assert "split_digits / LayerAdaptiveEWC: recipe `split_digits/LayerAdaptiveEWC_smoothed`" in \
        (tmp_path / "report.md").read_text()


def _metric_rows(out: Path) -> list[dict]:
    with open(out / "metrics.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["split"] == "test"]


def test_documented_complete_config_is_valid(user_module):
    text = (ROOT / "docs" / "study.md").read_text()
    block = text.split("## The complete config", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    import yaml

    config = yaml.safe_load(block.replace("my_package.streams:make_benchmark", f"{user_module}:two_digit_tasks"))
    study = load_study(config)
    assert [s.name for s in study.strategies] == ["Naive", "EWC", "LwF", "LAE_Replay"]
    assert study.strategy("LAE_Replay").spec.grid_values() == {"LayerAdaptiveEWCPlugin.ewc_lambda": [10, 100, 1000],
                                                    "training.lr": [0.01, 0.05]}
    quick = load_study(config, quick=True)
    assert quick.seeds == 1 and quick.training.epochs == 1
    assert [s.n_experiences for s in quick.scenarios] == [2, 2, None]  # a factory keeps its own kwargs


def test_readme_study_example_is_valid(tmp_path):
    text = (ROOT / "README.md").read_text()
    block = text.split("## Comparative studies", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_models.py").write_text(
        "import math\nfrom torch import nn\n\n\ndef make_model(input_shape, n_classes, width=64):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(),\n"
        "                         nn.Linear(width, n_classes))\n")
    (tmp_path / "my_study.yaml").write_text(block)
    study = load_study(tmp_path / "my_study.yaml")
    assert [s.name for s in study.strategies] == ["Naive", "SynapticIntelligence", "LAE"]
    assert set(study.sources) == {"my_models"}


def test_loggers_write_per_run_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = {"seeds": 1, "scenarios": [{"benchmark": "split_digits", "n_experiences": 2}],
              "model": {"name": "mlp", "kwargs": {"hidden": [16]}}, "strategies": ["Naive"],
              "metrics": [{"name": "OptimizationReadinessMetric", "kwargs": {"n_samples": 64, "n_batches": 4}}],
              "loggers": ["tensorboard", "text"]}
    result = run_study(config, out=tmp_path, progress=False)
    events = EventAccumulator(str(tmp_path / "tensorboard" / "split_digits" / "Naive" / "default" / "seed0"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "OptimizationReadiness/train_phase/train_stream/Task000/Exp001" in tags
    final = events.Scalars("Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp001")[-1].value
    assert final == pytest.approx(result.rows[0].accuracy_matrix[-1][1], abs=1e-6)
    text = (tmp_path / "text" / "split_digits" / "Naive" / "default" / "seed0.txt").read_text()
    assert "Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp001" in text


def test_adding_a_dataset_is_one_catalog_entry(tmp_path):
    # the documented entry, as written in docs/study.md, makes split_/permuted_ scenarios a study can name
    import torch

    from avalanche_plugins.study.catalog import datasets as data

    text = (ROOT / "docs" / "study.md").read_text()
    block = text.split("## Adding a built-in dataset", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]

    def load_kmnist_arrays(root):
        x = torch.randn(120, 1, 28, 28, generator=torch.Generator().manual_seed(0))
        y = torch.arange(120) % 10
        return x[:100], y[:100], x[100:], y[100:]

    namespace = {"CATALOG": data.CATALOG, "Dataset": data.Dataset, "MNIST_FILES": data.MNIST_FILES,
                 "load_kmnist_arrays": load_kmnist_arrays}
    assert "kmnist" not in data.CATALOG  # the documented example is a new entry, not a built-in one
    try:
        exec(block, namespace)
        study = load_study({"scenarios": [{"benchmark": "split_kmnist", "data_root": str(tmp_path)},
                                          {"benchmark": "permuted_kmnist", "n_experiences": 2}],
                            "model": "cnn", "strategies": ["Naive"]})
        assert [s.name for s in study.scenarios] == ["split_kmnist", "permuted_kmnist"]
        with pytest.raises(ConfigError, match="split_kmnist has 10 classes, which 4 experiences"):
            load_study({"scenarios": [{"benchmark": "split_kmnist", "n_experiences": 4}], "strategies": ["Naive"]})
        stream = data.make_stream("kmnist", "split", n_experiences=5, data_root=tmp_path)
        assert stream.input_shape == (1, 28, 28) and len(stream.benchmark.train_stream) == 5
        fingerprint = data.data_fingerprint(tmp_path, "kmnist")
        assert fingerprint["name"] == "Kuzushiji-MNIST" and set(fingerprint["sha256"].values()) == {"missing"}
    finally:
        data.CATALOG.pop("kmnist", None)


# --- the study's shape (issue 42): one rule per folder; only api joins describe, run and report ---
