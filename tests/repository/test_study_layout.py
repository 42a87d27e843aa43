"""The study package's shape (issue 42): one folder per part, each with one import rule stated in
its docstring; only ``api`` joins ``describe``, ``run`` and ``report``; docs/study.md's layout table
lists every folder, its modules and its rule."""

from __future__ import annotations

import ast
import re

import pytest

from tests import REPO_ROOT
from tests.repository.test_layering import MODULES, _find_cycle, _internal_graph, _runtime_imports


def test_the_study_package_is_layered():
    # describe (config), build, run and report apart: only the CLI parses a command line, the validator
    # builds and runs nothing, the runner knows neither the validator nor the CLI, and no import circle
    study = {name: path for name, path in MODULES.items() if name.startswith("avalanche_plugins.study")}
    parsing = sorted(name for name, path in study.items() if "argparse" in _runtime_imports(path))
    assert parsing == ["avalanche_plugins.study.cli"]
    graph = {name: {d for d in deps if d in study} for name, deps in _internal_graph().items() if name in study}
    assert not graph["avalanche_plugins.study.describe.config"] & {"avalanche_plugins.study.run.build",
                                                         "avalanche_plugins.study.run.job"}
    assert not graph["avalanche_plugins.study.run.job"] & {"avalanche_plugins.study.describe.config",
                                                         "avalanche_plugins.study.cli"}
    assert _find_cycle(graph) is None


STUDY = REPO_ROOT / "avalanche_plugins" / "study"
# folder -> the other folders of the study it may import (README "Comparative studies", docs/development.md)
STUDY_FOLDERS = {
    "catalog": set(),  # what a study can name (datasets, zoo, scenarios, diagnostics, names): the ground
    "jobs": set(),  # generic job machinery (environment, code, cache, executors, protocol): knows no study
    "contracts": {"catalog"},  # the typed values the parts hand one another (specs, grid, rows, scores)
    "describe": {"contracts", "catalog", "jobs"},  # a config → a validated, typed Study
    "run": {"contracts", "catalog", "jobs"},  # one job: build, train, evaluate, its row
    "report": {"contracts", "catalog", "jobs"},  # saved rows → statistics, tables, figures, report, files
}
PARTS = ("describe", "run", "report")
STUDY_TOP = {"", "api", "cli", "reproduce", "__main__"}  # api: plan → run → choose → write; cli, reproduce call it


def _study_imports() -> dict[str, set[str]]:
    """``{study module (relative name): study modules it imports}``, from the package's import graph."""
    prefix = "avalanche_plugins.study"
    strip = lambda name: name[len(prefix) + 1:] if name != prefix else ""  # noqa: E731
    return {strip(name): {strip(dep) for dep in deps if dep.startswith(prefix)}
            for name, deps in _internal_graph().items() if name.startswith(prefix)}


def _folder(module: str) -> str | None:
    return module.split(".")[0] if "." in module or module in STUDY_FOLDERS else None


def test_every_study_module_is_in_a_folder_whose_docstring_states_its_rule():
    graph = _study_imports()
    assert {m for m in graph if _folder(m) is None} == STUDY_TOP
    assert {_folder(m) for m in graph} - {None} == set(STUDY_FOLDERS)
    for folder in STUDY_FOLDERS:
        doc = ast.get_docstring(ast.parse((STUDY / folder / "__init__.py").read_text()))
        assert doc and "The rule of this folder" in doc, f"study/{folder}/__init__.py does not state its rule"


def _violations(graph: dict[str, set[str]], folder: str) -> list[str]:
    """The imports of ``folder``'s modules its rule (:data:`STUDY_FOLDERS`) forbids."""
    allowed = {folder, *STUDY_FOLDERS[folder]}
    return [f"{module} ({folder}) imports {dep or 'avalanche_plugins.study'} ({_folder(dep) or 'the top'}): "
            f"{folder} may import {sorted(STUDY_FOLDERS[folder])}"
            for module, deps in graph.items() if _folder(module) == folder
            for dep in deps if _folder(dep) not in allowed]


@pytest.mark.parametrize("folder", sorted(STUDY_FOLDERS))
def test_each_study_folder_imports_only_the_folders_its_rule_allows(folder):
    graph = _study_imports()
    assert not _violations(graph, folder)
    # the rule can fail: the folder's first module importing the top (api) or a folder it may not
    module = min(m for m in graph if _folder(m) == folder)
    forbidden = min(set(STUDY_FOLDERS) - {folder, *STUDY_FOLDERS[folder]}, default="api")
    other = "api" if forbidden == "api" else min(m for m in graph if _folder(m) == forbidden)
    assert _violations({**graph, module: graph[module] | {other}}, folder)


def test_describe_run_and_report_import_none_of_one_another_and_only_api_imports_all_three():
    graph = _study_imports()
    assert all(not set(PARTS) & STUDY_FOLDERS[part] for part in PARTS)
    joins = {m for m, deps in graph.items() if {_folder(d) for d in deps} >= set(PARTS)}
    assert joins == {"api"}, joins


def test_the_study_reference_lists_each_folder_with_its_modules_and_its_rule():
    # docs/study.md's layout table is the README's promise: the folders, what they hold, what they may import
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^\| `(\w+)/` \| (.*?) \| (.*?) \|$", (REPO_ROOT / "docs" / "study.md").read_text(), flags=re.M)}
    assert set(rows) == set(STUDY_FOLDERS)
    for folder, (holds, may_import) in rows.items():
        modules = {p.stem for p in (STUDY / folder).glob("*.py") if p.stem != "__init__"}
        assert modules <= set(re.findall(r"`(\w+)`", holds)), f"docs/study.md: {folder}/ holds {sorted(modules)}"
        allowed = set(re.findall(r"\w+", may_import)) - {"nothing", "else"}
        assert allowed == STUDY_FOLDERS[folder], f"docs/study.md: {folder}/ may import {sorted(STUDY_FOLDERS[folder])}"
