"""An Avalanche logger that writes every metric value as one row of a tidy ("long") CSV.

Avalanche's ``CSVLogger`` keeps only accuracy, loss and forgetting; this logger keeps everything
that reaches ``EvaluationPlugin``: Avalanche's metrics and this package's, scalars, dicts, tensors
and images. Names ``Name/phase_phase/stream_stream[/TaskNNN][/ExpNNN][/rest]`` are split into
columns; values are written when the callback that emitted them ends and flushed at once, so a
crash keeps every row written before it.
"""

from __future__ import annotations

import csv
import io
import numbers
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from avalanche.core import SupervisedMetaLearningPlugin
from avalanche.evaluation.metric_results import AlternativeValues, MetricValue, TensorImage
from avalanche.logging import BaseLogger
from matplotlib.figure import Figure
from PIL.Image import Image

from avalanche_plugins._avalanche.boundaries import evaluated_experience_id
from avalanche_plugins._avalanche.distributed import check_logger_rank
from avalanche_plugins._avalanche.figures import as_image

__all__ = ["TidyCSVLogger", "parse_metric_name"]

COLUMNS = ("phase", "stream", "training_experience", "experience", "task", "metric", "key", "value",
           "file", "step", "callback")
_TASK = re.compile(r"Task(\d+)")
_EXP = re.compile(r"Exp(\d+)")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def parse_metric_name(name: str) -> dict:
    """The fields of an Avalanche metric name (``metric_name`` and Avalanche's template).

    ``Name/phase_phase/stream_stream[/TaskNNN][/ExpNNN][/rest]`` gives ``metric``, ``phase``,
    ``stream``, ``task`` and ``experience`` (ints or None) and ``key`` (``rest``, e.g. a class id or
    a stage, "" when absent). A name without a ``*_phase`` segment is all ``metric``.

    >>> parse_metric_name("Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp002")["experience"]
    2
    >>> parse_metric_name("TransportKeyAcc/eval_phase/test_stream/Exp001/stage1")["key"]
    'stage1'
    """
    parts = name.split("/")
    phase_at = next((i for i, p in enumerate(parts) if p.endswith("_phase")), None)
    fields = {"metric": name, "phase": "", "stream": "", "task": None, "experience": None, "key": ""}
    if phase_at is None:
        return fields
    fields["metric"] = "/".join(parts[:phase_at])
    fields["phase"] = parts[phase_at][: -len("_phase")]
    rest = parts[phase_at + 1:]
    if rest and rest[0].endswith("_stream"):
        fields["stream"] = rest.pop(0)[: -len("_stream")]
    for field, pattern in (("task", _TASK), ("experience", _EXP)):
        match = pattern.fullmatch(rest[0]) if rest else None
        if match:
            fields[field] = int(match.group(1))
            rest.pop(0)
    fields["key"] = "/".join(rest)
    return fields


class TidyCSVLogger(BaseLogger):
    """Every metric value as a row of ``path``: ``*context, phase, stream, training_experience,
    experience, task, metric, key, value, file, step, callback``.

    * ``phase``/``stream``/``task``/``experience``/``metric``/``key`` come from the value's name
      (:func:`parse_metric_name`); for a dict value ``key`` is the dict key (one row per key).
    * ``training_experience``: the experience being trained, or last trained, when the value was
      emitted (empty before any training): with ``experience`` it indexes accuracy matrices. On an
      online stream (``split_online_stream``) it is the original experience of the sub-experience.
    * ``value``: numbers as numbers (bools as 0/1, one-element tensors as their item); tensors and
      arrays give one row per element, ``key`` the index (``"2,3"``), up to ``max_elements``
      elements (larger ones are skipped with a warning); strings are written as they are.
    * Images (``PIL`` images, ``matplotlib`` figures, ``TensorImage``) are saved as PNGs in the
      folder ``<csv stem>_images`` next to the CSV; ``file`` holds the path relative to the CSV's
      folder and ``value`` is empty. ``images=False`` skips them (no row). ``defer_images=True``
      writes the image files when the logger closes (the rows at once): a metric's
      :class:`~avalanche_plugins._avalanche.figures.DeferredFigure` is then drawn after training,
      not inside the callback that logged it; only for a logger that is surely closed (the study's).
    * ``step``: the value's x position (Avalanche's: training iterations); ``callback``: the
      strategy callback that emitted it.
    * ``context``: fixed columns written first on every row (e.g. scenario, strategy, seed).

    Values of other types (model checkpoints as ``bytes``, arbitrary objects) are skipped with one
    warning per metric. ``append=True`` continues an existing file with the same columns. Rows are
    flushed at the end of every strategy callback; :meth:`close` (or ``with``) closes the file.

    Checkpoints (Avalanche's ``save_checkpoint`` / ``maybe_load_checkpoint``): the file is opened
    (and, without ``append``, truncated) at the first row written, not at construction, so the fresh
    logger a restarted process builds before loading its checkpoint leaves the earlier rows alone,
    and closing it without rows never truncates. The pickled logger records the file's size at the
    checkpoint; the restored one cuts the file back to that size (dropping the rows, and the image
    files they name, that the interrupted process wrote after its last checkpoint: the resumed run
    writes them again) and appends. The CSV of an interrupted and resumed run is therefore the
    uninterrupted run's, row for row.

    Under Avalanche's distributed training, build it on the main process only (every rank's values
    are the same): on another rank it raises ``DistributedTrainingError`` saying so.

    Example::

        from avalanche.evaluation.metrics import accuracy_metrics, forgetting_metrics
        from avalanche.training.plugins import EvaluationPlugin
        from avalanche_plugins import TidyCSVLogger, LayerSensitivityMetric

        tidy = TidyCSVLogger("runs/metrics.csv", context={"strategy": "Naive", "seed": 0})
        evaluator = EvaluationPlugin(accuracy_metrics(experience=True, stream=True),
                                     forgetting_metrics(experience=True), LayerSensitivityMetric(),
                                     loggers=[tidy])
        ...  # train and evaluate
        tidy.close()
        rows = pandas.read_csv("runs/metrics.csv")
    """

    def __init__(self, path, *, context: Mapping | None = None, images: bool = True,
                 append: bool = False, max_elements: int = 10_000, defer_images: bool = False):
        check_logger_rank("TidyCSVLogger")  # under torchrun: rank 0 only, with our message (Avalanche's names no fix)
        super().__init__()
        if not isinstance(path, (str, os.PathLike)) or os.path.isdir(path):
            raise ValueError(f"path: expected a CSV file path, got {path!r}")
        context = {} if context is None else context
        if not isinstance(context, Mapping):
            raise ValueError(f"context: expected a mapping of column names to values, got {type(context).__name__}")
        for column, value in context.items():
            if not isinstance(column, str) or not column or column in COLUMNS:
                raise ValueError(f"context: column names must be non-empty strings other than {COLUMNS}, got {column!r}")
            if not isinstance(value, (str, numbers.Number, type(None))):
                raise ValueError(f"context: value of {column!r} must be a string, a number or None, "
                                 f"got {type(value).__name__}")
        if not isinstance(max_elements, int) or max_elements < 1:
            raise ValueError(f"max_elements: expected a positive int, got {max_elements!r}")
        self.path = Path(path)
        self.context = dict(context)
        self.columns = (*self.context, *COLUMNS)
        self.images = bool(images)
        self.defer_images = bool(defer_images)
        self._images_to_write: list = []  # (path, image) of defer_images, written by close()
        self.max_elements = max_elements
        self.image_dir = self.path.with_name(f"{self.path.stem}_images")
        self._pending: list[dict] = []
        self._training_experience = None
        self._warned: set = set()
        self._file = self._writer = None
        self._append = bool(append)
        if self._append:
            self._check_header()  # a mismatch fails now, not at the first row

    # ----------------------------------------------------------------------------------------
    # file

    def _check_header(self) -> bool:
        """Whether ``path`` holds rows to continue (an error when its columns differ)."""
        if not (self.path.is_file() and self.path.stat().st_size > 0):
            return False
        with open(self.path, newline="") as f:
            header = tuple(next(csv.reader(f), ()))
        if header != self.columns:
            raise ValueError(f"append: {self.path} has columns {header}, this logger writes {self.columns}")
        return True

    def _open(self) -> None:
        """Open the file at the first write: appending (``append=True``, or restored from a
        checkpoint) or a new file with its header."""
        if self._file is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existing = self._append and self._check_header()
        self._file = open(self.path, "a" if existing else "w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns)
        if not existing:
            self._writer.writeheader()
            self._file.flush()
        self._append = True  # from now on this logger continues its own file

    def _rewind(self, offset: int) -> None:
        """Cut the file back to ``offset`` bytes (its size at the checkpoint): rows written after
        the checkpoint by the interrupted run are dropped, with the image files they name, since
        the resumed run writes them again."""
        size = self.path.stat().st_size if self.path.is_file() else 0
        if size < offset:
            warnings.warn(f"TidyCSVLogger: {self.path} holds {size} bytes, the checkpoint recorded {offset}: "
                          "rows written before the checkpoint were lost (was the file overwritten, e.g. by a "
                          "logger created with append=False that wrote rows before the checkpoint was "
                          "loaded?); continuing after what is left", stacklevel=3)
            return
        with open(self.path, "rb") as f:
            f.seek(offset)
            tail = f.read().decode("utf-8", errors="replace")
        images = self.image_dir.resolve()
        for row in csv.DictReader(io.StringIO(tail, newline=""), fieldnames=self.columns):
            file = (self.path.parent / row["file"]).resolve() if row.get("file") else None
            if file is not None and file.parent == images:
                file.unlink(missing_ok=True)
        os.truncate(self.path, offset)

    def flush(self, callback: str = "") -> None:
        """Write the pending rows (tagged with ``callback``) and flush the file."""
        if not self._pending:
            return
        self._open()
        for row in self._pending:  # the callback's state: a before_training_exp value gets its experience
            row["training_experience"] = self._training_experience
            row["callback"] = callback
            self._writer.writerow(row)
        self._pending = []
        self._file.flush()

    def close(self) -> None:
        """Write pending rows and close the file (idempotent). A logger that never wrote a row
        leaves an existing file as it is (creating it, header only, when there is none)."""
        self._write_deferred_images()
        if self._file is None and self._pending == [] and self._check_header():
            return
        self._open()
        if not self._file.closed:
            self.flush()
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):  # checkpoints pickle the loggers: the file's size now, reopened on load
        state = self.__dict__.copy()
        opened = self._file is not None
        state["_offset"] = (self._file.tell() if not self._file.closed else self.path.stat().st_size) if opened else None
        state["_file"] = state["_writer"] = None
        return state

    def __setstate__(self, state):
        offset = state.pop("_offset", None)
        self.__dict__.update(state)
        self._file = self._writer = None
        if offset is not None:  # rows were written before the checkpoint: continue after them
            self._rewind(offset)
            self._append = True
            self._open()

    # ----------------------------------------------------------------------------------------
    # values

    def log_metrics(self, metric_values: list[MetricValue]) -> None:
        for mval in metric_values:
            fields = parse_metric_name(mval.name)
            if isinstance(mval.value, dict):  # one row per key, the key in its own column
                for key, value in mval.value.items():
                    self._add(mval.name, {**fields, "key": "/".join(filter(None, (fields["key"], str(key))))},
                              value, mval.x_plot)
            else:
                self._add(mval.name, fields, mval.value, mval.x_plot)

    def log_single_metric(self, name, value, x_plot) -> None:
        self._add(name, parse_metric_name(name), value, x_plot)

    def _add(self, name: str, fields: dict, value, step) -> None:
        if isinstance(value, AlternativeValues):
            value = value.best_supported_value(numbers.Number, torch.Tensor, np.ndarray, str, Image,
                                               Figure, TensorImage)
        if value is None:
            return
        row = {**self.context, **fields, "step": step, "value": None, "file": None}
        if isinstance(value, (torch.Tensor, np.ndarray)):
            self._add_array(name, row, value)
        elif isinstance(value, bool):
            self._pending.append({**row, "value": int(value)})
        elif isinstance(value, numbers.Number):
            self._pending.append({**row, "value": value.item() if hasattr(value, "item") else value})
        elif isinstance(value, str):
            self._pending.append({**row, "value": value})
        elif isinstance(value, (Image, Figure, TensorImage)):
            if self.images:
                self._pending.append({**row, "file": self._save_image(name, fields["key"], value, step)})
        else:
            self._warn(name, f"skipped values of type {type(value).__name__}")

    def _add_array(self, name: str, row: dict, value) -> None:
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        if array.size == 1:
            self._pending.append({**row, "value": array.reshape(()).item()})
        elif array.size > self.max_elements:
            self._warn(name, f"skipped tensors of {array.size} > max_elements={self.max_elements} elements")
        else:
            for index in np.ndindex(array.shape):
                key = "/".join(filter(None, (row["key"], ",".join(map(str, index)))))
                self._pending.append({**row, "key": key, "value": array[index].item()})

    def _save_image(self, name: str, key: str, value, step) -> str:
        self.image_dir.mkdir(parents=True, exist_ok=True)
        stem = _UNSAFE.sub("_", f"{name}/{key}" if key else name).strip("_")
        target = self.image_dir / f"{stem}_step{step}.png"
        n = 1
        pending = {path for path, _ in self._images_to_write}
        while target.exists() or target in pending:
            target = self.image_dir / f"{stem}_step{step}_{n}.png"
            n += 1
        if self.defer_images:
            self._images_to_write.append((target, value))
        else:
            as_image(value).save(target, format="png")
        return target.relative_to(self.path.parent).as_posix()

    def _write_deferred_images(self) -> None:
        for target, value in self._images_to_write:
            as_image(value).save(target, format="png")
        self._images_to_write = []

    def _warn(self, name: str, message: str) -> None:
        metric = parse_metric_name(name)["metric"]
        if (metric, message) not in self._warned:
            self._warned.add((metric, message))
            warnings.warn(f"TidyCSVLogger: {metric}: {message}", stacklevel=3)

    # ----------------------------------------------------------------------------------------
    # callbacks (EvaluationPlugin calls log_metrics, then the logger's callback of the same name)

    def _on_callback(self, callback: str, strategy) -> None:
        if callback == "before_training_exp":
            experience = getattr(strategy, "experience", None)
            self._training_experience = None if experience is None else evaluated_experience_id(experience)
        self.flush(callback)


def _callback(name: str):
    def callback(self, strategy, metric_values=None, **kwargs):
        self._on_callback(name, strategy)

    callback.__name__ = callback.__qualname__ = name
    return callback


for _name in dir(SupervisedMetaLearningPlugin):
    if _name.startswith(("before_", "after_")):
        setattr(TidyCSVLogger, _name, _callback(_name))
del _name
