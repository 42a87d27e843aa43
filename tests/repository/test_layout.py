"""The test suite's layout mirrors the package (as Avalanche's and curvlinops' suites do).

* ``tests/<subpackage>/test_<module>.py`` tests ``avalanche_plugins/<subpackage>/<module>.py``
  (``study/catalog``, ``study/jobs`` ... one folder per package folder); a file may add an aspect
  after the module's name (``test_masks_state.py`` tests ``structural/masks.py``'s state);
* ``tests/benchmarks/test_<module>.py`` tests ``benchmarks/<module>`` the same way;
* ``tests/integration/`` holds what crosses packages (every strategy, devices, distributed runs,
  a Ray cluster), ``tests/repository/`` the rules on the tree, the docs, the examples and the wheel;
* the suite's own helpers (``fixtures``, ``cases``, ``helpers`` ...) are modules at ``tests/``, and
  no test file lies there;
* every module ``conftest.py`` names (``NUMERICAL_MODULES``, ``RAY_MODULES``) exists, so a rename
  cannot drop a test from the second-kernel pass silently.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

import conftest
from avalanche_plugins.study.catalog import zoo
from tests import REPO_ROOT
from tests.cases import CASES, ZOO_TEST_SIZES, build_model

FREE_FOLDERS = ("integration", "repository")  # folders whose tests are named after a behaviour


def _names(folder: Path) -> set[str]:
    """Modules and subpackages of ``folder``, a leading underscore dropped (``_cli`` -> ``cli``)."""
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return {n.lstrip("_") for n in names}


def _tested_folder(tests: Path, folder: Path, package: Path, benchmarks: Path) -> Path | None:
    """The source folder a test folder mirrors (None: free folder)."""
    parts = folder.relative_to(tests).parts
    if parts[0] in FREE_FOLDERS:
        return None
    if parts[0] == "benchmarks":
        return benchmarks.joinpath(*parts[1:])
    return package.joinpath(*parts)


def layout_errors(tests: Path, package: Path, benchmarks: Path) -> list[str]:
    """Every test file or folder of ``tests`` that breaks the rules of this module's docstring."""
    errors = []
    for path in sorted(tests.rglob("test_*.py")):
        where = path.relative_to(tests).as_posix()
        if path.parent == tests:
            errors.append(f"{where}: a test file at the top of tests/ (put it in its package's folder)")
            continue
        if not (path.parent / "__init__.py").exists():
            errors.append(f"{where}: its folder has no __init__.py")
        source = _tested_folder(tests, path.parent, package, benchmarks)
        if source is None:
            continue
        if not (source / "__init__.py").exists():
            errors.append(f"{where}: {source.name}/ is not a package folder of the source tree")
            continue
        stem = path.stem.removeprefix("test_")
        if not any(stem == name or stem.startswith(f"{name}_") for name in _names(source)):
            errors.append(f"{where}: names no module of {source.relative_to(source.parents[1])}")
    return errors


def test_the_tests_mirror_the_package():
    assert layout_errors(REPO_ROOT / "tests", REPO_ROOT / "avalanche_plugins", REPO_ROOT / "benchmarks") == []


def test_the_layout_rule_fails_on_a_misplaced_or_misnamed_test(tmp_path):
    package, benchmarks, tests = tmp_path / "pkg", tmp_path / "benchmarks", tmp_path / "tests"
    for folder in (package / "core", benchmarks, tests / "core", tests / "integration", tests / "benchmarks"):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
    (package / "core" / "layers.py").write_text("")
    (benchmarks / "_cli.py").write_text("")
    good = ["core/test_layers.py", "core/test_layers_split.py", "integration/test_anything.py",
            "benchmarks/test_cli.py"]
    bad = ["test_flat.py", "core/test_named_steps.py", "nowhere/test_layers.py", "benchmarks/test_scale.py"]
    for name in good + bad:
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text("")
    errors = layout_errors(tests, package, benchmarks)
    assert {e.split(":")[0] for e in errors} == set(bad)
    nowhere = [e for e in errors if e.startswith("nowhere/")]  # no __init__.py, and no package folder
    assert len(nowhere) == 2 and "no __init__.py" in nowhere[0]


@pytest.mark.parametrize("table", ["NUMERICAL_MODULES", "RAY_MODULES"])
def test_every_module_conftest_marks_exists(table):
    missing = [m for m in getattr(conftest, table) if not (REPO_ROOT / "tests" / f"{m}.py").exists()]
    assert missing == [], f"conftest.{table} names test modules that do not exist"


def test_the_case_table_builds_the_zoos_own_classes_at_test_size():
    assert {c.zoo_name for c in CASES if c.zoo_name} == set(ZOO_TEST_SIZES)
    for name, cls in (("mlp", zoo.MLP), ("cnn", zoo.SmallCNN), ("vit", zoo.TinyViT)):
        model = build_model(name)
        assert type(model) is cls
        assert sum(p.numel() for p in model.parameters()) < 10_000  # test-sized, not MNIST-sized
    assert isinstance(build_model("mlp", multihead=True), zoo.MultiHeadNet)
    for case in CASES:
        model = case.model(seed=0)
        assert isinstance(model, nn.Module)
        assert model(case.inputs(2)).shape == (2, case.n_classes)
