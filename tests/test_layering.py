"""The package's architecture rules, enforced on the source tree.

* Only modules named ``*plugin*.py`` / ``*metric*.py``, the ``_avalanche`` package and the study
  runner ``study/`` import ``avalanche`` (the estimators need only PyTorch).
* Nothing in ``avalanche_plugins`` imports ``benchmarks``.
* No import cycles between the package's modules (imports under ``if TYPE_CHECKING:`` excluded:
  they never run).
* Importing any estimator module leaves ``avalanche`` out of ``sys.modules``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "avalanche_plugins"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _may_import_avalanche(path: Path) -> bool:
    parts = path.relative_to(PACKAGE).parts
    return "plugin" in path.stem or "metric" in path.stem or parts[0] in ("_avalanche", "study")


def _runtime_imports(path: Path) -> set[str]:
    """Absolute names imported by ``path`` (module- or function-level), TYPE_CHECKING blocks excluded."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skipped.update(id(n) for n in ast.walk(node))
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
ESTIMATORS = sorted(name for name, path in MODULES.items() if not _may_import_avalanche(path))


def test_the_tree_has_the_documented_subpackages():
    expected = {"core", "layer_adaptive", "readiness", "ads", "transport", "structural", "_avalanche"}
    assert expected <= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_only_adapters_import_avalanche_and_nothing_imports_benchmarks(name):
    path = MODULES[name]
    imported = _runtime_imports(path)
    tops = {n.split(".")[0] for n in imported}
    assert "benchmarks" not in tops, f"{name} imports benchmarks"
    if not _may_import_avalanche(path):
        assert "avalanche" not in tops, f"{name} imports avalanche but is not a *plugin*/*metric* module"


def _internal_graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        deps = set()
        for imported in _runtime_imports(path):
            # "pkg.mod.name" may be a module or a name in a module: keep the longest module prefix
            parts = imported.split(".")
            for k in range(len(parts), 0, -1):
                candidate = ".".join(parts[:k])
                if candidate in MODULES:
                    deps.add(candidate)
                    break
        deps.discard(name)
        graph[name] = deps
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph[node]):
            # a package __init__ importing its own submodules is not a cycle with them
            if node == dep.rsplit(".", 1)[0] or dep == node.rsplit(".", 1)[0]:
                continue
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycles():
    assert _find_cycle(_internal_graph()) is None


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}) == ["a.x", "a.y", "a.z", "a.x"]
    assert _find_cycle({"a.x": {"a.y"}, "a.y": set()}) is None


def test_importing_every_estimator_module_leaves_avalanche_out():
    code = ("import importlib, sys\n"
            f"for name in {ESTIMATORS!r}:\n"
            "    importlib.import_module(name)\n"
            "loaded = sorted(m for m in sys.modules if m == 'avalanche' or m.startswith('avalanche.'))\n"
            "assert not loaded, loaded[:5]\n"
            "assert 'matplotlib' not in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_top_level_names_load_lazily():
    code = ("import sys, avalanche_plugins\n"
            "assert 'avalanche' not in sys.modules\n"
            "from avalanche_plugins import LayerAdaptiveEWCPlugin\n"
            "assert 'avalanche' in sys.modules and LayerAdaptiveEWCPlugin.__name__ == 'LayerAdaptiveEWCPlugin'\n"
            "assert sorted(avalanche_plugins.__all__) == avalanche_plugins.__all__\n"
            "for name in avalanche_plugins.__all__:\n"
            "    getattr(avalanche_plugins, name)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_unknown_top_level_name_raises_attribute_error():
    import avalanche_plugins

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        avalanche_plugins.Nope  # noqa: B018
