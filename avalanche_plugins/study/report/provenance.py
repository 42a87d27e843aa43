"""What a study ran on, per scenario, for ``results.json`` and ``report.md``.

Every scenario of a study has its own data, so provenance is recorded per scenario (never from one
``--data-root``):

* a built-in scenario: its dataset, ``data_root`` and the SHA-256 of every file read there (the
  scikit-learn version for the bundled digits), from
  :func:`~avalanche_plugins.study.catalog.datasets.data_fingerprint`;
* a user's benchmark factory (``package.module:callable``): its dotted name, its kwargs and a hash
  of its module's source;
* both: the setting the runs saw (class-, task- or domain-incremental), the number of experiences
  and the classes of each, read from the built stream by the runner (:func:`stream_facts`; a row's
  ``stream``).

The software (Python, torch, avalanche-lib, this package, ...) is recorded by
:func:`~avalanche_plugins.study.report.files.versions`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from avalanche_plugins.study.catalog.datasets import (
    stream_facts,  # re-exported: the facts a row carries
)
from avalanche_plugins.study.contracts.rows import RunRow

__all__ = ["SETTINGS", "describe_scenario", "provenance_lines", "rows_facts", "scenario_provenance", "setting_lines",
           "stream_facts", "study_provenance"]

SETTINGS = ("class-incremental", "task-incremental", "domain-incremental")


def scenario_provenance(scenario, facts: Mapping | None, *, dataset: str | None,
                        source_hash: str | None = None) -> dict:
    """Provenance of one scenario: its ``ScenarioSpec`` (benchmark, data_root, kwargs), ``dataset``
    the built-in dataset it reads (``None`` for a factory, whose module hashes to ``source_hash``),
    and ``facts`` (:func:`stream_facts`) from one of its runs (``None``: no run built it)."""
    from avalanche_plugins.study.catalog.datasets import data_fingerprint

    out: dict = {"benchmark": scenario.benchmark}
    if dataset is None:
        out["factory"] = {"name": scenario.benchmark, "kwargs": dict(scenario.kwargs or {}),
                          "module_sha256": source_hash}
    else:  # bundled data by its package's version; files by their checksums (missing ones named)
        out["data"] = data_fingerprint(scenario.data_root, dataset)
    if facts:
        out.update({k: facts[k] for k in ("setting", "experiences", "classes_per_experience", "classes",
                                          "task_labels") if k in facts})
    else:
        out["setting"] = None  # every run of the scenario failed before its stream was built
    return out


def describe_scenario(name: str, entry: Mapping) -> str:
    """One line: ``split_digits: class-incremental, 5 experiences × 2 classes, scikit-learn digits``."""
    if not entry.get("setting"):
        return f"{name}: setting unknown (no run built the stream)"
    per = entry.get("classes_per_experience") or []
    shape = (f"{entry['experiences']} experiences × {per[0]} classes" if per and len(set(per)) == 1
             else f"{entry['experiences']} experiences of {', '.join(map(str, per))} classes")
    return f"{name}: {entry['setting']}, {shape}, {_source(entry)}"


def _source(entry: Mapping) -> str:
    if "factory" in entry:
        factory = entry["factory"]
        return f"`{factory['name']}` (kwargs {factory['kwargs']}, module source sha256 {factory['module_sha256']})"
    data = entry["data"]
    if "scikit-learn" in data:
        return f"{data['name']} (scikit-learn {data['scikit-learn']})"
    return f"{data.get('name', data.get('dataset'))} under `{data.get('root')}`"


def provenance_lines(saved: Mapping) -> list[str]:
    """The ``## Provenance`` section of ``report.md``: command, code, versions, and per scenario
    its setting, experiences, classes and data (every file checksum)."""
    lines = ["## Provenance", ""]
    command = saved.get("command")
    lines.append(f"- Command: `{command}`" if command else "- Command: none (run from Python: `run_study`)")
    source = f" (source hash {saved['source_version']})" if saved.get("source_version") else ""
    lines.append(f"- Code: {saved.get('code_version')}{source}")
    found = saved.get("versions") or {}
    if found:
        lines.append("- Versions: " + ", ".join(f"{k} {v}" for k, v in found.items() if v is not None))
    for name, entry in (saved.get("data") or {}).items():
        if not isinstance(entry, Mapping) or "benchmark" not in entry:
            continue
        lines.append(f"- Scenario {describe_scenario(name, entry)}")
        for rel, digest in ((entry.get("data") or {}).get("sha256") or {}).items():
            lines.append(f"  - `{rel}`: sha256 `{digest}`")
    return [*lines, ""]


def rows_facts(rows: Sequence[RunRow | Mapping], scenario: str) -> dict | None:
    """The stream facts of the first run of ``scenario`` that built its stream (rows typed or their JSON form)."""
    return next((r.stream for r in map(RunRow.of, rows) if r.scenario == scenario and r.stream), None)


def study_provenance(scenarios: Sequence, sources: Mapping, rows: Sequence[RunRow | Mapping]) -> dict:
    """``{scenario name: provenance}`` of a study's scenarios (:func:`scenario_provenance`), the
    setting and classes read from ``rows`` (its runs), a factory's module hash from ``sources``
    (``{module: source hash}``, the study's)."""
    from avalanche_plugins.study.catalog.scenarios import dataset_of

    out = {}
    for scenario in scenarios:
        benchmark = scenario.benchmark
        factory = scenario.is_factory
        out[scenario.name] = scenario_provenance(
            scenario, rows_facts(rows, scenario.name),
            dataset=None if factory else dataset_of(benchmark)[0],
            source_hash=sources.get(benchmark.partition(":")[0]) if factory else None)
    return out


def setting_lines(saved: Mapping) -> list[str]:
    """What ACC means in each scenario of a saved study (task- or class-incremental, ...)."""
    meaning = {"class-incremental": "one shared head, argmax over every class, no task label at test time",
               "task-incremental": "the task label given at test time, one head per experience",
               "domain-incremental": "the same classes in every experience, one shared head"}
    lines = []
    for name, entry in (saved.get("data") or {}).items():
        if isinstance(entry, Mapping) and entry.get("setting") in meaning:
            lines.append(f"- {describe_scenario(name, entry)}: ACC is {entry['setting']} accuracy: "
                         f"{meaning[entry['setting']]}")
    return lines
