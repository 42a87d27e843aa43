"""The study runner from a user's point of view: failed runs named and never scored, the paper
columns (FWT, task-IL accuracy, accuracy matrices, time, diagnostics time, peak memory), a
``check`` that lists every error of a config at once, user modules beside the config, and a job
cache that reruns exactly the jobs an edited user module touches."""

from __future__ import annotations

import csv
import json
import re
import textwrap

import numpy as np
import pytest

from avalanche_plugins.study import ConfigError, load_study, run_study
from avalanche_plugins.study.cli import run_command
from tests import REPO_ROOT

USER_MODULE = '''
import torch
from torch import nn
from avalanche.core import SupervisedPlugin


def tiny_mlp(input_shape, n_classes, width=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()), width), nn.ReLU(),
                         nn.Linear(width, n_classes))


def needs_rgb(input_shape, n_classes):
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(n_classes))


class BoomPlugin(SupervisedPlugin):
    """Fails after the first experience (a diagnostic with a bug)."""

    def after_training_exp(self, strategy, **kwargs):
        raise ValueError("boom")


class ScalePlugin(SupervisedPlugin):
    def __init__(self, factor: float = 1.0):
        super().__init__()
        self.factor = factor
'''


def _write_study(folder, body: str, module: str = "runner_models"):
    (folder / f"{module}.py").write_text(USER_MODULE)
    path = folder / "study.yaml"
    path.write_text(textwrap.dedent(body).replace("MODULE", module))
    return path


BASE = """
seeds: 1
scenarios: [{name: digits2, benchmark: split_digits, n_experiences: 2}]
model: {name: "MODULE:tiny_mlp"}
training: {lr: 0.05, epochs: 1, batch_size: 64}
"""


@pytest.fixture(scope="module")
def failing_study(tmp_path_factory):
    """Naive next to a run that diverges and one whose plugin raises, every metric attached."""
    folder = tmp_path_factory.mktemp("failing")
    path = _write_study(folder, BASE + textwrap.dedent("""
    strategies:
      - Naive
      - {name: Exploding, class: Naive, training: {lr: 1.0e+8}}
      - {name: Buggy, plugins: [{name: "MODULE:BoomPlugin"}]}
    metrics:
      - {name: OptimizationReadinessMetric, kwargs: {n_samples: 64, n_batches: 4}}
      - {name: ArchitectureDrivenShiftMetric, kwargs: {calibration_size: 16}}
    """), module="failing_models")
    result = run_study(path, out=folder / "out", progress=False)
    return result, folder / "out"


def test_a_diverged_run_is_named_and_never_scored(failing_study):
    result, out = failing_study
    exploding = next(r for r in result.rows if r.strategy == "Exploding").as_dict()
    assert exploding["status"] == "diverged"
    assert re.fullmatch(r"diverged at experience 0, epoch 0, iteration \d+ \((loss|model output|gradient norm) = "
                        r"(nan|inf|-inf)\)", exploding["error"]), exploding["error"]
    assert np.isnan(exploding["acc"])
    entry = next(e for e in result.summary if e["strategy"] == "Exploding")
    assert entry["all_failed"] and entry["acc"]["n"] == 0
    row = next(line for line in result.tables["markdown"].splitlines() if line.startswith("| Exploding†"))
    assert row.count("failed") >= 5 and "0." not in row  # no number for a cell whose every seed failed
    assert "Exploding: seed 0 failed and is not scored" in result.tables["markdown"]
    naive_best = next(line for line in result.tables["markdown"].splitlines() if line.startswith("| Naive"))
    assert "**" in naive_best  # the failed runs are not "best" in any column
    assert "| digits2 | Exploding | default | 0 | diverged at experience 0" in (out / "tables.md").read_text()
    report = (out / "report.md").read_text()
    assert "## Failed runs" in report and "Buggy" in report
    assert "Failed runs: not scored" in (out / "tables.tex").read_text()


def test_a_plugin_exception_names_class_callback_and_experience(failing_study):
    result, _ = failing_study
    buggy = next(r for r in result.rows if r.strategy == "Buggy").as_dict()
    assert buggy["status"] == "callback"
    assert buggy["error"] == "BoomPlugin.after_training_exp at experience 0: ValueError: boom"


def test_paper_columns(failing_study):
    result, out = failing_study
    naive = next(r for r in result.rows if r.strategy == "Naive").as_dict()
    acc = np.array(naive["accuracy_matrix"])
    b = naive["baseline_accuracy"]
    assert naive["fwt"] == pytest.approx(acc[0, 1] - b[1])  # FWT = mean_{j>=1} R[j-1, j] - b_j, T = 2
    til = np.array(naive["til_matrix"])
    assert til.shape == (2, 2) and np.all(til >= acc - 1e-12)  # masking to the task's classes never hurts
    assert naive["acc_til"] == pytest.approx(til[-1].mean())
    assert naive["peak_memory_mb"] > 50 and naive["train_s"] > 0
    assert naive["diagnostics_s"] == pytest.approx(sum(naive["callback_s"][k] for k in
                                                       ("OptimizationReadinessMetric", "ArchitectureDrivenShiftMetric")))
    header = result.tables["markdown"].split("| strategy |", 1)[1].split("\n", 1)[0]
    for title in ("ACC ↑", "ACC task-IL ↑", "BWT ↑", "Forgetting ↓", "FWT ↑", "time (s)", "diagnostics (s)",
                  "peak memory (MB)"):
        assert title in header
    tables = (out / "tables.md").read_text()
    assert "#### digits2 / Naive (default)" in tables and "| exp 1 |" in tables and "| forgetting |" in tables
    assert f"| exp 0 | {acc[0, 0]:.3f} | {acc[0, 1]:.3f} |" in tables
    saved = json.loads((out / "results.json").read_text())
    assert {r["status"] for r in saved["runs"]} == {"ok", "diverged", "callback"}


def test_check_lists_every_error_at_once(tmp_path, capsys):
    path = _write_study(tmp_path, """
    seeds: 0
    scenarios: [{benchmark: split_digits, n_experiences: 4}]
    model: {name: "MODULE:needs_rgb"}
    training: {lr: -1, optimizr: sgd}
    strategies:
      - {name: SI}
      - {name: EWC, kwargs: {ewc_lamda: 10}}
      - {name: Mine, plugins: [{name: "MODULE:ScalePlugin", kwargs: {factor: x}}]}
    metrics: [{name: OptimizationReadinessMetric, kwargs: {n_sample: 4}}]
    """)
    with pytest.raises(SystemExit) as exit_info:
        run_command(["check", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    for expected in ("seeds: expected an integer >= 1, got 0",
                     "scenarios[0].n_experiences: split_digits has 10 classes, which 4 experiences do not divide",
                     "training.lr: expected a positive number, got -1",
                     "training.optimizr: unknown key",
                     "strategies[0].name: unknown Avalanche strategy 'SI'",
                     "did you mean SynapticIntelligence?",
                     "strategies[1].kwargs.ewc_lamda: EWC has no argument 'ewc_lamda'; did you mean 'ewc_lambda'?",
                     "strategies[2].plugins[0].kwargs.factor: expected a number, got 'x'",
                     "metrics[0].kwargs.n_sample: OptimizationReadinessMetric has no argument 'n_sample'"):
        assert expected in err, (expected, err)
    assert "9 errors:" in err and "strategies[1].kwargs: EWC needs ewc_lambda" in err


def test_check_rejects_a_model_that_cannot_run_on_the_scenario(tmp_path, capsys):
    path = _write_study(tmp_path, BASE.replace("tiny_mlp", "needs_rgb") + "strategies: [Naive]\n")
    with pytest.raises(ConfigError, match=r"model: '\w+:needs_rgb' cannot be built for or run on scenarios\[0\] "
                                          r"\(digits2: input shape \(1, 8, 8\), 10 classes\): RuntimeError"):
        load_study(path)
    ok = _write_study(tmp_path, BASE + "strategies: [Naive]\n", module="ok_models")
    assert run_command(["check", str(ok)]).name == "study"
    assert "OK" in capsys.readouterr().out


def test_editing_a_user_module_reruns_the_jobs_it_touches_and_nothing_else(tmp_path):
    _write_study(tmp_path, "", module="cache_models")
    (tmp_path / "cache_plugins.py").write_text(USER_MODULE)
    path = tmp_path / "study.yaml"
    path.write_text(BASE.replace("MODULE", "cache_models") + textwrap.dedent("""
    strategies:
      - Naive
      - {name: Scaled, plugins: [{name: "cache_plugins:ScalePlugin", kwargs: {factor: 2.0}}]}
    """))
    out = tmp_path / "out"
    run_study(path, out=out, progress=False)

    def lines():
        return [json.loads(line)["job"]["strategy"]["name"] for line in (out / "jobs.jsonl").read_text().splitlines()]

    assert sorted(lines()) == ["Naive", "Scaled"]
    run_study(path, out=out, progress=False)
    assert len(lines()) == 2  # nothing changed: everything cached
    (tmp_path / "cache_plugins.py").write_text(USER_MODULE + "\n# edited\n")
    run_study(path, out=out, progress=False)
    assert sorted(lines()) == ["Naive", "Scaled", "Scaled"]  # only the job using the edited module reran


def test_a_scenario_whose_every_run_failed_still_gets_its_tables(tmp_path):
    path = _write_study(tmp_path, BASE + textwrap.dedent("""
    strategies:
      - {name: Exploding, class: Naive, training: {lr: 1.0e+8}}
    """), module="all_failed_models")
    result = run_study(path, out=tmp_path / "out", progress=False)
    assert result.rows[0].status == "diverged" and result.figures == []
    assert "| Exploding† | default | failed |" in result.tables["markdown"]
    assert "## Failed runs" in result.report.read_text()


PROVENANCE_STUDY = """
name: provenance
seeds: 1
scenarios:
  - {name: digits, benchmark: split_digits, n_experiences: 2}
  - {name: mnist_ti, benchmark: split_mnist, n_experiences: 2, task_incremental: true DATA_ROOT}
model: {name: mlp, kwargs: {hidden: [16]}}
training: {lr: 0.05, epochs: 1, batch_size: 64}
strategies: [Naive]
"""


def _provenance_run(tmp_path, name: str, yaml_root, cli_root) -> dict:
    """Run the two-scenario study (MNIST's root in the YAML or on the command line); its results.json."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(PROVENANCE_STUDY.replace(" DATA_ROOT", f", data_root: '{yaml_root}'" if yaml_root else ""))
    argv = ["run", str(path), "--out", str(tmp_path / name), "--no-progress"]
    run_command(argv + (["--data-root", str(cli_root)] if cli_root else []))
    return json.loads((tmp_path / name / "results.json").read_text())


@pytest.mark.parametrize("where", ["yaml", "command line"])
def test_provenance_is_true_for_every_scenario(tmp_path, where):
    import hashlib
    import os

    from tests.study.catalog.test_datasets import write_fake_mnist

    root = tmp_path / "data"
    write_fake_mnist(root)
    saved = _provenance_run(tmp_path, "study", root if where == "yaml" else None,
                            root if where == "command line" else None)
    digits, mnist = saved["data"]["digits"], saved["data"]["mnist_ti"]
    assert digits["data"]["name"] == "scikit-learn digits" and digits["data"]["scikit-learn"]
    assert (digits["setting"], digits["experiences"], digits["classes_per_experience"]) == \
        ("class-incremental", 2, [5, 5])
    assert mnist["data"]["name"] == "MNIST" and mnist["data"]["root"] == os.path.relpath(root)
    for rel, digest in mnist["data"]["sha256"].items():
        assert digest == hashlib.sha256((root / rel).read_bytes()).hexdigest(), rel
    assert (mnist["setting"], mnist["experiences"], mnist["classes_per_experience"]) == \
        ("task-incremental", 2, [5, 5])
    assert saved["command"].startswith("avalanche-study run ") and saved["code_version"]
    assert {"torch", "avalanche-lib", "avalanche-plugins", "python"} <= set(saved["versions"])
    report = (tmp_path / "study" / "report.md").read_text()
    assert "mnist_ti: task-incremental, 2 experiences × 5 classes, MNIST" in report
    assert "ACC is task-incremental accuracy" in report and "digits (class-incremental)" in report
    assert mnist["data"]["sha256"]["MNIST/raw/t10k-labels-idx1-ubyte"] in report


# ------------------------------------------------------------------------------------------------
# online streams (issue 31)

ONLINE = """
seeds: 1
scenarios:
  - {name: online_digits, benchmark: split_digits, n_experiences: 2,
     online: {experience_size: 64, access_task_boundaries: true}}
  - {name: online_hidden, benchmark: split_digits, n_experiences: 2, online: {experience_size: 64}}
model: {name: "MODULE:tiny_mlp"}
training: {lr: 0.05, epochs: 1, batch_size: 16}
strategies:
  - Naive
  - {name: ER_ACE, kwargs: {mem_size: 40, batch_size_mem: 8}}
  - {name: LAE, plugins: [{name: LayerAdaptiveEWCPlugin, kwargs: {ewc_lambda: 10.0, schedule: smoothed,
                                                                  spectrum_samples: 32}}]}
metrics:
  - {name: LayerSensitivityMetric, kwargs: {n_samples: 32}}
  - {name: OptimizationReadinessMetric, kwargs: {n_samples: 32, batch_size: 8, n_batches: 2}}
  - {name: ArchitectureDrivenShiftMetric, kwargs: {calibration_size: 16}}
  - {name: TransportKeyMetric, kwargs: {stages: auto, n_anchors: 20}}
  - CycleAccuracyMetric
"""


def test_an_online_study_with_every_diagnostic_measures_once_per_original_experience(tmp_path):
    from avalanche_plugins.study.run.build import build_stream
    from avalanche_plugins.study.run.job import _training_units

    study = load_study(_write_study(tmp_path, ONLINE, module="online_models"))
    online = study.scenarios[0]
    assert online.online == {"experience_size": 64, "access_task_boundaries": True}
    assert online.as_dict()["online"] == online.online and "online" not in load_study(
        _write_study(tmp_path, BASE + "strategies: [Naive]", module="offline_models")).scenarios[0].as_dict()
    stream = build_stream(online, 0, validation=False)
    units = [[len(sub.dataset) for sub in unit] for unit in _training_units(stream.benchmark.train_stream, online, 0)]
    sizes = [len(e.dataset) for e in stream.benchmark.train_stream]
    assert [sum(u) for u in units] == sizes and all(len(u) == -(-n // 64) > 1 for u, n in zip(units, sizes))

    result = run_study(study, out=tmp_path / "out", progress=False, skip=["online_hidden/Naive", "online_hidden/ER_ACE"])
    runs = {(r.scenario, r.strategy): r.as_dict() for r in result.rows}
    with open(tmp_path / "out" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "test"]
    hidden = runs.pop(("online_hidden", "LAE"))
    assert hidden["status"] == "callback" and "set online.access_task_boundaries: true" in hidden["error"]
    assert hidden["error"].startswith("LayerAdaptiveEWCPlugin.before_training_exp at experience 0")
    for (_, strategy), run in runs.items():
        assert run["status"] == "ok", run.get("error")
        assert np.isfinite(np.array(run["accuracy_matrix"])).all() and len(run["accuracy_matrix"]) == 2
        logged = {}
        for row in (r for r in rows if (r["scenario"], r["strategy"]) == ("online_digits", strategy)):
            logged.setdefault(row["metric"], []).append((int(row["training_experience"]), row["experience"]))
        # once per original experience (not per sub-experience), named by the original experience
        for metric in ("LayerSensitivityKappa", "OptimizationReadiness", "CycleAccuracy"):
            assert sorted(logged[metric]) == [(0, "0"), (1, "1")], (strategy, metric, logged[metric])
        assert logged["ADS"] == [(1, "1")], strategy
        assert logged["TransportKeyAccUpdated"] == [(1, "0")], strategy  # experience 0 keyed after experience 1
        assert sorted(c for c in logged["Top1_Acc_Exp"]) == [(0, "0"), (0, "1"), (1, "0"), (1, "1")]


@pytest.mark.parametrize(("online", "message"), [
    ({"experience_size": 0}, "scenarios[0].online.experience_size: expected an integer >= 1, got 0"),
    ({"size": 10}, "scenarios[0].online.size: unknown key; expected one of experience_size, access_task_boundaries"),
    ({"experience_size": 10, "access_task_boundaries": "yes"},
     "scenarios[0].online.access_task_boundaries: expected true or false, got 'yes'"),
])
def test_online_option_errors_name_the_key(online, message):
    with pytest.raises(ConfigError) as error:
        load_study({"scenarios": [{"benchmark": "split_digits", "online": online}], "strategies": ["Naive"]})
    assert message in str(error.value), str(error.value)


def test_an_online_scenario_never_takes_an_offline_recipe():
    config = {"scenarios": [{"benchmark": "split_digits", "online": {"experience_size": 10}}],
              "strategies": [{"name": "Replay", "recipe": True}]}
    with pytest.raises(ConfigError, match=r"no recipe for scenario 'split_digits' .*online"):
        load_study(config)


def test_the_online_baselines_have_shipped_recipes_and_the_online_study_takes_them():

    from avalanche_plugins.study.describe.recipes import load_recipes

    recipe = load_recipes()["split_digits_online"]
    assert recipe["scenario"]["online"] == {"experience_size": 10, "access_task_boundaries": True}
    assert {"Naive", "Replay", "ER_ACE", "MIR"} <= set(recipe["strategies"])
    study = load_study(REPO_ROOT / "studies" / "online_digits.yaml", quick=True)
    assert study.strategy("MIR").on("online_split_digits").recipe == "split_digits_online/MIR"


# --- no process-wide state (issue 42) -------------------------------------------------------------


def test_reading_a_config_leaves_sys_path_as_it_was_and_the_study_names_its_module_folders(tmp_path):
    import sys

    path = _write_study(tmp_path, BASE + "strategies: [Naive]", module="path_probe_models")
    before = list(sys.path)
    try:
        study = load_study(path)
        assert sys.path == before  # the config's folder was on sys.path only while its names were imported
        folder = str(tmp_path.resolve())
        assert study.modules == {"path_probe_models": folder} and study.paths == (folder,)
    finally:
        sys.modules.pop("path_probe_models", None)


def test_a_job_puts_its_import_paths_on_sys_path_only_while_it_runs():
    import sys

    from avalanche_plugins.study.contracts.specs import (
        ModelSpec,
        RunSpec,
        ScenarioSpec,
        TrainingSpec,
    )
    from avalanche_plugins.study.run.job import StudyJob, run_job

    job = StudyJob("s", ScenarioSpec("nowhere", "no_such_module_here:factory"), ModelSpec("mlp"), TrainingSpec(),
                   RunSpec("Naive", "Naive"), "default", (), (), 0, "test", paths=("/nonexistent/user/folder",))
    before = list(sys.path)
    row = run_job(job)
    assert row["status"] == "error" and "no_such_module_here" in row["error"]
    assert sys.path == before


def test_every_figure_of_a_scenario_names_its_failed_runs(tmp_path, monkeypatch):
    from avalanche_plugins.study.report import figures

    notes = []
    monkeypatch.setattr(figures, "_annotate_missing", lambda fig, note: notes.append(note))
    ok = {"scenario": "d", "strategy": "Naive", "setting": "default", "seed": 0, "split": "test",
          "accuracy_matrix": [[0.9, 0.1], [0.5, 0.8]], "status": "ok"}
    failed = {**ok, "strategy": "EWC", "accuracy_matrix": [], "status": "diverged", "error": "loss = inf"}
    paths = figures.make_figures([ok, failed], [], tmp_path, ["Naive", "EWC"])
    assert len(paths) == 2 and notes == ["missing (failed, not scored): EWC seed 0"] * 2
    notes.clear()
    figures.make_figures([ok], [], tmp_path / "clean", ["Naive"])  # nothing carried over from the last call
    assert notes == ["", ""]
