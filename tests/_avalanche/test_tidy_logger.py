"""Every logger, read back: the tidy CSV, TensorBoard's event files, the text logs (with
``fix_text_loggers``) and an offline W&B run (with ``fix_wandb_logger``).

One run feeds the CSV, TensorBoard, Text and Interactive loggers: Split digits, three training
experiences, the test stream evaluated after the first two (accuracy matrix, forgetting, BWT) and
not after the last (a train-only end). Metrics: Avalanche's accuracy, loss, forgetting and BWT,
``LayerSensitivityMetric`` (scalars, a dict, a PIL figure) and a probe emitting at the start and
the end of each training experience (a number, a dict, a raw matplotlib figure).
"""

from __future__ import annotations

import csv
import io
import pickle
import re
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from avalanche.evaluation.metric_results import AlternativeValues, MetricValue, TensorImage
from avalanche.evaluation.metrics import (
    accuracy_metrics,
    bwt_metrics,
    forgetting_metrics,
    loss_metrics,
)
from avalanche.logging import InteractiveLogger, TensorboardLogger, TextLogger
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.supervised import Naive
from matplotlib.figure import Figure
from PIL import Image
from torch import nn

from avalanche_plugins import (
    LayerSensitivityMetric,
    TidyCSVLogger,
    fix_text_loggers,
    fix_wandb_logger,
)
from avalanche_plugins._avalanche.recording import RecordingMetric
from avalanche_plugins._avalanche.tidy_logger import COLUMNS, parse_metric_name
from tests.cases import build_model
from tests.fixtures import digits_stream

CONTEXT = {"scenario": "digits", "seed": 3}


class Probe(RecordingMetric):
    """``ProbeStart`` = the experience id before training it; ``Probe`` (id + 0.5), ``ProbeDict``
    and ``ProbeFigure`` (a raw ``matplotlib`` figure) after."""

    def before_training_exp(self, strategy):
        return self.emit(strategy, {"ProbeStart": strategy.experience.current_experience})

    def after_training_exp(self, strategy):
        exp = strategy.experience.current_experience
        fig = Figure(figsize=(2, 2))
        fig.subplots().plot([0, 1], [0, exp])
        return self.emit(strategy, {"Probe": exp + 0.5, "ProbeDict": {"a": exp, "b": -exp}, "ProbeFigure": fig})


def _strategy(loggers, metrics=()):
    stream = digits_stream()
    torch.manual_seed(0)
    model = build_model("mlp", stream.input_shape, stream.n_classes, hidden=(32, 16))
    evaluator = EvaluationPlugin(*metrics, loggers=loggers)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1, eval_mb_size=256,
                     evaluator=evaluator)
    return strategy, stream


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("loggers")
    with pytest.MonkeyPatch.context() as patch:
        for cls, name in ((TextLogger, "after_training_exp"), (TextLogger, "after_training"),
                          (InteractiveLogger, "after_training_exp")):
            patch.setattr(cls, name, getattr(cls, name))  # restored after this module
        fix_text_loggers()
        fix_text_loggers()  # idempotent: a second call must not wrap the first
        tidy = TidyCSVLogger(root / "metrics.csv", context=CONTEXT)
        tensorboard = TensorboardLogger(tb_log_dir=str(root / "tb"))
        text, interactive = TextLogger(io.StringIO()), InteractiveLogger()
        interactive.file = io.StringIO()  # its printout; the progress bar stays on stdout
        metrics = [accuracy_metrics(experience=True, stream=True), loss_metrics(experience=True),
                   forgetting_metrics(experience=True, stream=True), bwt_metrics(experience=True, stream=True),
                   LayerSensitivityMetric(n_samples=64), Probe()]
        strategy, stream = _strategy([tidy, tensorboard, text, interactive], metrics)
        for i, experience in enumerate(stream.benchmark.train_stream[:3]):
            strategy.train(experience)
            if i < 2:
                strategy.eval(stream.benchmark.test_stream[:2])
        tidy.close()
        tensorboard.writer.close()
    return {"root": root, "all": strategy.evaluator.get_all_metrics(), "text": text.file.getvalue(),
            "interactive": interactive.file.getvalue()}


def _is_image(value):
    return isinstance(value, (Image.Image, Figure))


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _avalanche_name(row):
    """The Avalanche name a CSV row came from (inverse of the logger's split)."""
    parts = [row["metric"], f"{row['phase']}_phase", f"{row['stream']}_stream"]
    parts += [f"Task{int(row['task']):03}"] if row["task"] else []
    parts += [f"Exp{int(row['experience']):03}"] if row["experience"] else []
    return "/".join(parts)


# --------------------------------------------------------------------------------------------
# tidy CSV


def test_tidy_csv_holds_every_value_every_metric_emitted(run):
    rows = _read_csv(run["root"] / "metrics.csv")
    assert tuple(rows[0]) == (*CONTEXT, *COLUMNS)
    assert all(row["scenario"] == "digits" and row["seed"] == "3" for row in rows)

    expected, written = [], []
    for name, (steps, values) in run["all"].items():
        for step, value in zip(steps, values):
            items = value.items() if isinstance(value, dict) else [("", value)]
            expected += [(name, str(k), step, "png" if _is_image(v) else float(v)) for k, v in items]
    for row in rows:
        value = "png" if row["file"].endswith(".png") and not row["value"] else float(row["value"])
        written.append((_avalanche_name(row), row["key"], int(row["step"]), value))
    assert sorted(written, key=repr) == sorted(expected, key=repr)

    metrics = {row["metric"] for row in rows}
    assert {"Top1_Acc_Exp", "Top1_Acc_Stream", "Loss_Exp", "ExperienceForgetting", "StreamForgetting",
            "ExperienceBWT", "StreamBWT", "LayerSensitivity", "LayerSensitivityKappa",
            "LayerSensitivityProfile", "ProbeStart", "Probe", "ProbeDict", "ProbeFigure"} <= metrics

    # Accuracy matrix: (trained through, evaluated on) for the two evaluations.
    accuracy = {(row["training_experience"], row["experience"]) for row in rows if row["metric"] == "Top1_Acc_Exp"}
    assert accuracy == {("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")}
    forgetting = [row for row in rows if row["metric"] == "ExperienceForgetting"]
    assert [(r["training_experience"], r["experience"]) for r in forgetting] == [("1", "0")]

    # Values emitted before and after training an experience belong to it, with their callback.
    for row in rows:
        if row["metric"] in ("ProbeStart", "Probe"):
            assert row["training_experience"] == row["experience"]
            assert float(row["value"]) == int(row["experience"]) + (0.5 if row["metric"] == "Probe" else 0)
            assert row["callback"] == ("before_training_exp" if row["metric"] == "ProbeStart" else "after_training_exp")
    assert {row["experience"] for row in rows if row["metric"] == "Probe"} == {"0", "1", "2"}

    # Images: PNG files next to the CSV, paths relative to its folder.
    files = [row["file"] for row in rows if row["file"]]
    assert len(files) == 6 and len(set(files)) == 6
    for file in files:
        assert file.startswith("metrics_images/")
        with Image.open(run["root"] / file) as image:
            assert image.format == "PNG" and image.width > 50


def _metric_value(name, value, x=7):
    return MetricValue(None, name, value, x)


def test_tidy_csv_value_types_names_and_flushing(tmp_path):
    logger = TidyCSVLogger(tmp_path / "out" / "m.csv", max_elements=4)
    pil = Image.new("RGB", (6, 5), "red")
    with pytest.warns(UserWarning) as caught:
        logger.log_metrics([
            _metric_value("A/eval_phase/test_stream/Task001/Exp002", np.float32(0.25)),
            _metric_value("B/train_phase/train_stream/Exp000", torch.tensor(3.0)),
            _metric_value("C/eval_phase/test_stream", torch.tensor([[1, 2], [3, 4]])),
            _metric_value("D/train_phase/train_stream/Task000", True),
            _metric_value("E/eval_phase/test_stream/Exp001/stage1", {"x": 1.5}),
            _metric_value("Custom", "note"),
            _metric_value("F/eval_phase/test_stream", AlternativeValues(pil, 0.5)),
            _metric_value("G/eval_phase/test_stream", TensorImage(torch.rand(3, 4, 5))),
            _metric_value("WeightCheckpoint/train_phase/train_stream/Exp000", b"weights"),
            _metric_value("H/eval_phase/test_stream", torch.zeros(5)),
            _metric_value("I/eval_phase/test_stream", None),
        ])
        logger.after_eval_exp(None, [])  # EvaluationPlugin calls the callback after log_metrics
    assert sorted(str(w.message) for w in caught) == [
        "TidyCSVLogger: H: skipped tensors of 5 > max_elements=4 elements",
        "TidyCSVLogger: WeightCheckpoint: skipped values of type bytes"]

    rows = _read_csv(tmp_path / "out" / "m.csv")  # flushed, not closed: what a crash would leave
    got = {(r["metric"], r["key"]): r for r in rows}
    assert len(rows) == 11
    a = got["A", ""]
    assert (a["phase"], a["stream"], a["task"], a["experience"], a["value"], a["step"], a["callback"]) == \
        ("eval", "test", "1", "2", "0.25", "7", "after_eval_exp")
    assert got["B", ""]["value"] == "3.0" and got["B", ""]["task"] == ""
    assert [got["C", k]["value"] for k in ("0,0", "0,1", "1,0", "1,1")] == ["1", "2", "3", "4"]
    assert got["D", ""]["value"] == "1"
    assert got["E", "stage1/x"]["value"] == "1.5" and got["E", "stage1/x"]["experience"] == "1"
    assert got["Custom", ""]["value"] == "note" and got["Custom", ""]["phase"] == ""
    for name, size in (("F", (6, 5)), ("G", (5, 4))):
        row = got[name, ""]
        assert row["value"] == "" and row["file"].startswith("m_images/")
        with Image.open(tmp_path / "out" / row["file"]) as image:
            assert image.size == size
    assert got["F", ""]["file"] != got["G", ""]["file"]
    logger.close()
    logger.close()


def test_parse_metric_name_splits_avalanche_names():
    assert parse_metric_name("Top1_ClassAcc_Exp/eval_phase/test_stream/Task000/Exp003/7") == {
        "metric": "Top1_ClassAcc_Exp", "phase": "eval", "stream": "test", "task": 0, "experience": 3, "key": "7"}
    assert parse_metric_name("StreamBWT/eval_phase/test_stream") == {
        "metric": "StreamBWT", "phase": "eval", "stream": "test", "task": None, "experience": None, "key": ""}


def test_tidy_csv_rejects_bad_arguments(tmp_path):
    for kwargs, message in (({"context": ["scenario"]}, "context: expected a mapping"),
                            ({"context": {"metric": "x"}}, "context: column names"),
                            ({"context": {"seed": [0]}}, "context: value of 'seed'"),
                            ({"max_elements": 0}, "max_elements: expected a positive int")):
        with pytest.raises(ValueError, match=message):
            TidyCSVLogger(tmp_path / "m.csv", **kwargs)
    with pytest.raises(ValueError, match="path: expected a CSV file path"):
        TidyCSVLogger(tmp_path)
    TidyCSVLogger(tmp_path / "m.csv", context={"seed": 0}).close()
    with pytest.raises(ValueError, match="append: .* has columns"):
        TidyCSVLogger(tmp_path / "m.csv", context={"strategy": "EWC"}, append=True)


def test_tidy_csv_appends_and_survives_pickling(tmp_path):
    logger = TidyCSVLogger(tmp_path / "m.csv", context={"seed": 0})
    logger.log_metrics([_metric_value("A/train_phase/train_stream", 1.0, x=1)])
    logger.after_training_exp(None, [])
    restored = pickle.loads(pickle.dumps(logger))  # what an Avalanche checkpoint does
    logger.close()
    restored.log_metrics([_metric_value("A/train_phase/train_stream", 2.0, x=2)])
    restored.close()
    again = TidyCSVLogger(tmp_path / "m.csv", context={"seed": 0}, append=True)
    again.log_metrics([_metric_value("A/train_phase/train_stream", 3.0, x=3)])
    again.close()
    rows = _read_csv(tmp_path / "m.csv")
    assert [(r["value"], r["step"], r["seed"]) for r in rows] == [("1.0", "1", "0"), ("2.0", "2", "0"), ("3.0", "3", "0")]


# --------------------------------------------------------------------------------------------
# TensorBoard


def test_tensorboard_event_files_hold_scalars_dicts_and_figures(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run["root"] / "tb"), size_guidance={"scalars": 0, "images": 0}).Reload()
    scalars, images = set(events.Tags()["scalars"]), set(events.Tags()["images"])
    for name, (steps, values) in run["all"].items():
        for step, value in zip(steps, values):
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for key, v in items:
                tag = name if key is None else f"{name}/{key}"
                if _is_image(v):
                    assert tag in images, tag
                    assert step in [e.step for e in events.Images(tag)]
                else:
                    assert tag in scalars, tag
                    logged = {e.step: e.value for e in events.Scalars(tag)}
                    assert logged[step] == pytest.approx(float(v), rel=1e-6, abs=1e-7), tag
    families = {tag.split("/")[0] for tag in scalars | images}
    assert {"Top1_Acc_Exp", "ExperienceForgetting", "StreamBWT", "LayerSensitivity", "LayerSensitivityProfile",
            "Probe", "ProbeDict", "ProbeFigure"} <= families
    profile = events.Images("LayerSensitivityProfile/train_phase/train_stream/Task000/Exp002")[0]
    assert profile.width > 50 and profile.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------------
# Text / Interactive

HEADER = re.compile(r"(?:-- Starting (training|eval) on experience|> (Training|Eval) on experience) (\d+)")
VALUE = re.compile(r"^\t(\S+?)/(train|eval)_phase/\S*?/Exp(\d{3})\S* = ")


def test_text_logger_prints_each_value_under_its_experience_the_last_included(run):
    current, seen = None, set()
    for line in run["text"].splitlines():
        header = HEADER.search(line)
        if header:
            current = ((header.group(1) or header.group(2)).lower(), int(header.group(3)))
            continue
        value = VALUE.match(line)
        if value:
            phase = "training" if value.group(2) == "train" else "eval"
            assert current == (phase, int(value.group(3))), line
            seen.add(line.split(" = ")[0].strip())
    per_experience = {name for name in run["all"] if "/Exp" in name}
    assert {n for n in seen} >= {n for n in per_experience if not isinstance(run["all"][n][1][0], dict)}
    assert "Probe/train_phase/train_stream/Task000/Exp002" in seen  # after the last, train-only experience


def test_interactive_logger_prints_training_values_after_their_experience(run):
    blocks = re.split(r"^> Training on experience (\d+) \(Task 0\) from train stream ended\.$",
                      run["interactive"], flags=re.M)
    assert [int(b) for b in blocks[1::2]] == [0, 1, 2]
    for exp, block in zip(blocks[1::2], blocks[2::2]):
        block = block.split("-- >>")[0]  # up to the end of the training phase
        names = re.findall(r"^\t(\S+) = ", block, flags=re.M)
        assert names and all(f"/Exp{int(exp):03}" in n for n in names), block
        assert f"Probe/train_phase/train_stream/Task000/Exp{int(exp):03}" in names


# --------------------------------------------------------------------------------------------
# W&B (offline)


def _wandb_records(path: Path):
    """The records of a ``.wandb`` file, parsed with wandb's protobuf schema. wandb 0.31 ships no
    Python reader; the file is a LevelDB-style log: a 7-byte header, then 32 KiB blocks of chunks
    (``crc32 u32, length u16, type u8``; 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # the end, or a tail still being written
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _finished_wandb_records(path: Path, timeout: float = 60.0) -> list:
    """The records of a finished run. wandb-core may still be writing the file's tail (the last
    history row, then the ``exit`` record) after ``wandb.finish()`` returns: wait for ``exit``."""
    deadline = time.monotonic() + timeout
    while True:
        records = list(_wandb_records(path))
        if records and records[-1].WhichOneof("record_type") == "exit" or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


@pytest.mark.slow
def test_wandb_logger_fixed_runs_offline_and_logs_values_and_images(tmp_path, monkeypatch):
    import json

    wandb = pytest.importorskip("wandb")
    from avalanche.logging import WandBLogger

    for var, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"), ("WANDB_CONSOLE", "off"),
                       ("WANDB_DIR", tmp_path), ("WANDB_CONFIG_DIR", tmp_path / "config"),
                       ("WANDB_CACHE_DIR", tmp_path / "cache"), ("WANDB_DATA_DIR", tmp_path / "data")):
        monkeypatch.setenv(var, str(value))
    for name in ("before_run", "log_single_metric", "after_training_exp"):
        monkeypatch.setattr(WandBLogger, name, getattr(WandBLogger, name))  # restored after the test
    fix_wandb_logger()

    logger = WandBLogger(project_name="avalanche-plugins-test", run_name="loggers", dir=str(tmp_path),
                         save_code=False)
    try:
        strategy, stream = _strategy([logger], [accuracy_metrics(experience=True),
                                                LayerSensitivityMetric(n_samples=64), Probe()])
        for experience in stream.benchmark.train_stream[:2]:
            strategy.train(experience)
        strategy.eval(stream.benchmark.test_stream[:1])
        run_dir = Path(wandb.run.dir).parent
    finally:
        wandb.finish()

    history = {}
    for record in _finished_wandb_records(next(run_dir.glob("run-*.wandb"))):
        if record.WhichOneof("record_type") == "history":
            step = {"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                    for item in record.history.item}
            for key, value in step.items():
                history.setdefault(key, []).append(value)
    last = strategy.evaluator.get_last_metrics()
    kappa = "LayerSensitivityKappa/train_phase/train_stream/Task000/Exp001"
    assert history[kappa] == [pytest.approx(last[kappa])]
    head = "LayerSensitivity/train_phase/train_stream/Task000/Exp000/head"
    assert history[head] == [pytest.approx(strategy.evaluator.get_all_metrics()[head.rsplit("/", 1)[0]][1][0]["head"])]
    accuracy = "Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp000"
    assert history[accuracy] == [pytest.approx(last[accuracy])]
    assert history["TrainingExperience"] == [0, 1]
    for figure in ("LayerSensitivityProfile", "ProbeFigure"):  # PIL and raw matplotlib: PNG images
        for exp in (0, 1):
            key = f"{figure}/train_phase/train_stream/Task000/Exp{exp:03}"
            assert history[f"{key}/_type"] == ["image-file"]
            assert (run_dir / "files" / history[f"{key}/path"][0]).is_file()
    assert len(list((run_dir / "files" / "media" / "images").rglob("*.png"))) == 4  # each once


def _deferred(drawn: list):
    from avalanche_plugins._avalanche.figures import (
        DeferredFigure,
        profile_figure,
        profile_figure_size,
    )

    def draw(names, values, title):
        drawn.append(title)
        return profile_figure(names, values, title)

    names = ["layers.0", "head"]
    return DeferredFigure(draw, names, [1.0, 0.01], f"fig {len(drawn)}", figsize=profile_figure_size(names))


def test_deferred_images_are_drawn_and_written_when_the_logger_closes(tmp_path):
    drawn: list = []
    figures = [_deferred(drawn), _deferred(drawn)]
    logger = TidyCSVLogger(tmp_path / "run.csv", defer_images=True)
    for figure in figures:  # the same name and step twice: two files
        logger.log_single_metric("Profile/train_phase/train_stream/Task000", figure, 3)
    logger.flush("after_training_exp")
    with open(tmp_path / "run.csv", newline="") as f:
        files = [row["file"] for row in csv.DictReader(f)]
    assert len(set(files)) == 2 and drawn == [] and not any((tmp_path / name).exists() for name in files)
    logger.close()
    assert len(drawn) == 2
    for name, figure in zip(files, figures):
        with Image.open(tmp_path / name) as saved:
            assert saved.size == figure.size and np.array_equal(np.asarray(saved), np.asarray(figure))


def test_a_deferred_figure_is_drawn_once_and_pickles_as_its_pixels():
    drawn: list = []
    figure = _deferred(drawn)
    size = figure.size
    restored = pickle.loads(pickle.dumps(figure))  # pickling reads the pixels: drawn here, once
    assert drawn == ["fig 0"] and restored.size == size == figure.size
    assert np.array_equal(np.asarray(restored), np.asarray(figure)) and drawn == ["fig 0"]


def test_a_deferred_figure_whose_drawing_fails_stays_undrawn_and_draws_at_the_next_read():
    from avalanche_plugins._avalanche.figures import (
        DeferredFigure,
        profile_figure,
        profile_figure_size,
    )

    calls: list = []

    def flaky(names, values, title):
        calls.append(title)
        if len(calls) == 1:
            raise RuntimeError("no font")
        return profile_figure(names, values, title)

    figure = DeferredFigure(flaky, ["a"], [1.0], "t", figsize=profile_figure_size(["a"]))
    with pytest.raises(RuntimeError, match="no font"):
        figure.load()
    assert not figure.drawn
    assert figure.convert("RGB").size == figure.size and figure.drawn and len(calls) == 2
