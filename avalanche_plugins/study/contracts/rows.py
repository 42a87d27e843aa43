"""Typed results: a run's row, the setting chosen for a cell, and a saved study read back.

Every run of a study gives one :class:`RunRow`: its context (scenario, strategy, setting label,
seed, split), its scores (``SCORES``), its costs (seconds, peak
memory, per-callback seconds), its accuracy matrices, the tidy metric rows it logged, the facts
of the stream it saw, its status and, for a failed run, its error. Every tuned cell gives a
:class:`Choice` (the winning grid setting) or a :class:`TuningFailed` (every setting failed).

The JSON form (``results.json``, ``jobs.jsonl``, what crosses to a worker and back) stays the
plain dict it always was: :meth:`RunRow.as_dict` writes exactly today's keys in today's order and
:meth:`RunRow.from_dict` reads any row written so far (keys it does not know are kept in
``extra``: ``node_ip`` of a Ray run, a shipped run's ``files``), so ``from_dict(d).as_dict() == d``.
A field left ``None`` is a key the row does not have (a tuning failure has no scores or costs; a
finished run has no ``error``). :meth:`SavedStudy.load` reads a ``results.json`` into these types.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

__all__ = ["COST_KEYS", "Choice", "RunRow", "SavedStudy", "TuningFailed", "choice_from_dict", "choices_as_dict",
           "choices_from_dict"]

SCORES = ("acc", "acc_til", "forgetting", "bwt", "fwt")  # a run's scores (exported by stats: stats.SCORES)
CONTEXT_KEYS = ("scenario", "strategy", "setting", "seed", "split")  # the tidy CSV's context columns
# what a run cost, in the order a finished run's row has them (a failed run's row has callback_s last)
COST_KEYS = ("wall_s", "train_s", "diagnostics_s", "figures_s", "callback_s", "peak_memory_mb")
_MATRIX_KEYS = ("accuracy_matrix", "til_matrix", "baseline_accuracy", "metrics", "stream")


@dataclass(frozen=True)
class RunRow:
    """One run's row (module docstring); ``None``: the row has no such key.

    Example:
        >>> row = RunRow("digits", "Naive", "default", 0, "test", scores={"acc": 0.5}, status="ok")
        >>> row.as_dict()
        {'scenario': 'digits', 'strategy': 'Naive', 'setting': 'default', 'seed': 0, 'split': 'test', 'acc': 0.5, 'status': 'ok'}
        >>> RunRow.from_dict(row.as_dict()) == row, row.ok, row.score("bwt")
        (True, True, nan)
    """

    scenario: str | None = None
    strategy: str | None = None
    setting: str | None = None  # the setting's label
    seed: int | None = None
    split: str | None = None  # "validation" (tuning) or "test"
    scores: Mapping[str, float] = field(default_factory=dict)  # acc, acc_til, forgetting, bwt, fwt
    costs: Mapping[str, object] = field(default_factory=dict)  # COST_KEYS, in the row's own order
    accuracy_matrix: list | None = None
    til_matrix: list | None = None
    baseline_accuracy: list | None = None
    metrics: list | None = None  # the tidy rows every metric logged (left out of results.json's runs)
    stream: dict | None = None  # the facts of the stream the run saw (catalog.datasets.stream_facts)
    status: str | None = None  # "ok", "diverged", "callback", "error", "tuning" (its grid failed)
    error: str | None = None
    extra: Mapping[str, object] = field(default_factory=dict)  # keys this type does not know, kept in order
    setting_values: dict | None = None  # a tuning run's grid setting ({grid key: value})

    @property
    def cell(self) -> tuple:
        """``(scenario, strategy)``: the cell of the study the run belongs to."""
        return self.scenario, self.strategy

    @property
    def ok(self) -> bool:
        """Whether the run finished (status ``ok``, or none recorded, and no error): it is scored."""
        return (self.status or "ok") == "ok" and not self.error

    def score(self, name: str) -> float:
        """A score or a cost of the run by name (``acc``, ``train_s``, ...); NaN where it has none."""
        value = self.scores.get(name, self.costs.get(name))
        return float("nan") if value is None else value

    @property
    def acc(self) -> float:
        """The run's final average accuracy (NaN where it has none)."""
        return self.score("acc")

    def without_metrics(self) -> RunRow:
        """The row as ``results.json`` keeps it: the tidy metric rows left out (they are in ``metrics.csv``)."""
        return replace(self, metrics=None)

    def as_dict(self) -> dict:
        """The JSON form: context, scores, costs, matrices, tidy rows, stream, status, error (status
        and error before the matrices in a row without scores or costs), the unknown keys, the
        tuning setting; a ``None`` field is left out."""
        outcome = ("status", "error")
        # a row that never ran (a cell whose tuning failed: no scores, no costs) has always named its outcome first
        order = (*outcome, *_MATRIX_KEYS) if not self.scores and not self.costs else (*_MATRIX_KEYS, *outcome)
        out = {key: getattr(self, key) for key in CONTEXT_KEYS if getattr(self, key) is not None}
        out.update(self.scores)
        out.update(self.costs)
        out.update({key: getattr(self, key) for key in order if getattr(self, key) is not None})
        out.update(self.extra)
        if self.setting_values is not None:
            out["setting_values"] = self.setting_values
        return out

    @classmethod
    def from_dict(cls, row: Mapping) -> RunRow:
        """A row from its JSON form (any row a study has written: keys it does not know go to ``extra``)."""
        known = {f.name for f in fields(cls)} - {"scores", "costs", "extra"}
        return cls(scores={k: v for k, v in row.items() if k in SCORES},
                   costs={k: v for k, v in row.items() if k in COST_KEYS},
                   extra={k: v for k, v in row.items() if k not in known and k not in SCORES and k not in COST_KEYS},
                   **{k: v for k, v in row.items() if k in known})

    @classmethod
    def of(cls, row: RunRow | Mapping) -> RunRow:
        """``row`` as a :class:`RunRow` (a dict is read with :meth:`from_dict`)."""
        return row if isinstance(row, RunRow) else cls.from_dict(row)


@dataclass(frozen=True)
class Choice:
    """The grid setting chosen for one (scenario, strategy) on the validation split: its values
    (``{grid key: value}``, ``{}`` without a grid), its label and its validation accuracy."""

    setting: dict
    label: str
    val_acc: float

    failed = None  # a Choice did not fail (TuningFailed.failed says why one did)

    def as_dict(self) -> dict:
        return {"setting": self.setting, "label": self.label, "val_acc": self.val_acc}


@dataclass(frozen=True)
class TuningFailed:
    """A (scenario, strategy) whose every grid setting failed on the validation split: ``failed``
    says why; nothing of it runs on the test stream.

    Example:
        >>> TuningFailed("every grid setting failed").as_dict()
        {'setting': {}, 'label': '—', 'val_acc': nan, 'failed': 'every grid setting failed'}
    """

    failed: str
    setting = property(lambda self: {})
    label = "—"
    val_acc = math.nan

    def as_dict(self) -> dict:
        return {"setting": {}, "label": self.label, "val_acc": self.val_acc, "failed": self.failed}


def choice_from_dict(entry: Mapping) -> Choice | TuningFailed:
    """A chosen setting from its JSON form (``{"setting", "label", "val_acc"}``, ``"failed"`` if it failed)."""
    if "failed" in entry:
        return TuningFailed(entry["failed"])
    return Choice(dict(entry.get("setting", {})), entry.get("label", ""), entry.get("val_acc", math.nan))


def choices_from_dict(chosen: Mapping) -> dict[str, dict[str, Choice | TuningFailed]]:
    """``{scenario: {strategy: Choice | TuningFailed}}`` from the JSON form (typed entries kept)."""
    return {scenario: {strategy: entry if isinstance(entry, (Choice, TuningFailed)) else choice_from_dict(entry)
                       for strategy, entry in strategies.items()} for scenario, strategies in chosen.items()}


def choices_as_dict(chosen: Mapping) -> dict:
    """The JSON form of ``{scenario: {strategy: Choice | TuningFailed}}``."""
    return {scenario: {strategy: choice_from_dict(entry).as_dict() if isinstance(entry, Mapping) else entry.as_dict()
                       for strategy, entry in strategies.items()} for scenario, strategies in chosen.items()}


@dataclass(frozen=True)
class SavedStudy:
    """A study's ``results.json`` read back: its test ``runs`` and ``tuning`` runs as
    :class:`RunRow` s, ``chosen`` as :class:`Choice` / :class:`TuningFailed`, the ``summary``,
    ``tables`` and ``config`` as saved, and the whole file in ``saved`` (what the report reads)."""

    name: str
    runs: tuple[RunRow, ...]
    tuning: tuple[RunRow, ...]
    chosen: dict
    summary: list
    tables: dict
    config: dict
    saved: dict = field(repr=False)

    @classmethod
    def from_dict(cls, saved: Mapping) -> SavedStudy:
        """The typed form of a loaded ``results.json``."""
        return cls(saved.get("study", ""), tuple(RunRow.from_dict(r) for r in saved.get("runs", [])),
                   tuple(RunRow.from_dict(r) for r in saved.get("tuning", [])),
                   choices_from_dict(saved.get("chosen", {})), list(saved.get("summary", [])),
                   dict(saved.get("tables", {})), dict(saved.get("config", {})), dict(saved))

    @classmethod
    def load(cls, path) -> SavedStudy:
        """Read a study's ``results.json`` (the file, or the study's out folder holding it)."""
        import json

        path = Path(path)
        if path.is_dir():
            path = path / "results.json"
        if not path.is_file():
            raise FileNotFoundError(f"no results.json at {str(path)!r}")
        return cls.from_dict(json.loads(path.read_text()))
