"""The code a job ran: the checkout's version, the files a job imported and their hashes.

A cached row is reused only while the code it ran is unchanged (:func:`loaded_code` after the job,
under the job function's :func:`code_roots`); rows record :func:`code_version`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["PACKAGE_ROOT", "checkout_code", "code_roots", "code_version", "git_state", "loaded_code",
           "source_version"]


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``git:<commit>`` of the checkout this package runs from (an editable install), with
    ``+dirty`` when the checkout's code (:func:`checkout_code`) differs from that commit
    (:func:`git_state`), else
    ``avalanche_plugins <version>`` (an installed wheel). :func:`source_version` names the exact
    code either way."""
    root = PACKAGE_ROOT.parent
    state = git_state(root, checkout_code()) if (root / ".git").exists() and (root / "setup.cfg").exists() else None
    if state is not None:
        return state
    import avalanche_plugins

    return f"avalanche_plugins {avalanche_plugins.__version__}"


def git_state(root, code) -> str | None:
    """``git:<commit>`` of the repository at ``root``, ``+dirty`` when a ``.py`` file under the
    folders ``code`` is modified, staged or untracked there (the commit then does not name the code
    that ran); None when git cannot tell.

    Example:
        >>> git_state("/nonexistent-folder", []) is None
        True
    """
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10,
                              check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        folders = [str(Path(folder).resolve()) for folder in code]
        changed = git("status", "--porcelain", "--", *folders).splitlines() if folders else []
    except (OSError, subprocess.SubprocessError):
        return None
    if not commit:
        return None
    dirty = any(line.rstrip().endswith(".py") for line in changed)
    return f"git:{commit}" + ("+dirty" if dirty else "")


PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the avalanche_plugins folder


def checkout_code() -> list[Path]:
    """The folders of code of the checkout this package runs from: the package, and ``benchmarks/``
    beside it where there is one (an installed wheel: the package alone). What :func:`code_version`
    checks for changes and :func:`source_version` hashes, the same whatever this process imported."""
    benchmarks = PACKAGE_ROOT.parent / "benchmarks"
    return [PACKAGE_ROOT, *([benchmarks] if (benchmarks / "__init__.py").is_file() else [])]


@functools.lru_cache(maxsize=1)
def source_version() -> str:
    """Hash of the source of the checkout's code (:func:`checkout_code`: every ``.py`` file of this
    package and of the checkout's ``benchmarks/``): names the exact code, dirty or not, beside
    :func:`code_version` (the cache keys on each job's own code instead: :func:`loaded_code`)."""
    digest = hashlib.sha256()
    for root in checkout_code():
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(path.read_bytes())
    return f"src:{digest.hexdigest()[:16]}"


def code_roots(fn: Callable) -> tuple[Path, ...]:
    """The folders (or module file) whose modules count as code a job of ``fn`` can run: this
    package, and the top-level package ``fn`` is defined in (its module file where that is a
    plain module; ``functools.partial`` unwrapped), unless that is installed code or the standard
    library. Computed from ``fn`` alone, wherever it runs (a Ray node finds its own copy).

    Example:
        >>> [p.name for p in code_roots(git_state)], [p.name for p in code_roots(len)]
        (['avalanche_plugins'], ['avalanche_plugins'])
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    home = _home(sys.modules.get(module.__name__.partition(".")[0], module)) if module is not None else None
    if home is None or home == PACKAGE_ROOT or home.is_relative_to(PACKAGE_ROOT) or _installed(home):
        return (PACKAGE_ROOT,)
    return PACKAGE_ROOT, home


def _home(module) -> Path | None:
    """The folder of a package (its ``__init__.py``'s, or a namespace package's first), or a module's file."""
    file = getattr(module, "__file__", None)
    if file:
        path = Path(file).resolve()
        return path.parent if path.name == "__init__.py" else path
    folders = list(getattr(module, "__path__", None) or [])
    return Path(folders[0]).resolve() if folders else None


def _installed(path: Path) -> bool:
    """Whether ``path`` is installed code (under site-packages / dist-packages) or the standard library."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    return any(part in ("site-packages", "dist-packages") for part in path.parts) or path.is_relative_to(stdlib)


@functools.lru_cache(maxsize=4096)
def _file_hash(path: str, mtime_ns: int, size: int) -> str:
    """Hash of what the file's code does: its syntax tree without docstrings (comments and
    formatting are not in the tree), so editing a docstring or a comment keeps cached rows."""
    source = Path(path).read_bytes()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return hashlib.sha256(source).hexdigest()[:16]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def loaded_code(roots: Sequence[Path] = (PACKAGE_ROOT,)) -> dict[str, str]:
    """``{file: sha256 prefix}`` of every ``.py`` file under ``roots`` (a job function's
    :func:`code_roots`) that this process has imported: the code a job that ran here can have run
    (a superset where the process ran other things before). Paths are relative to the root's
    parent (``avalanche_plugins/core/calls.py``, ``benchmarks/scale/main.py``)."""
    out = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py"):
            continue
        path = Path(file).resolve()
        root = next((r for r in roots if path.is_relative_to(r)), None)
        if root is not None and path.is_file():
            stat = path.stat()
            out[str(path.relative_to(root.parent))] = _file_hash(str(path), stat.st_mtime_ns, stat.st_size)
    return dict(sorted(out.items()))


def _changed_code(code: dict[str, str], roots: Sequence[Path] = (PACKAGE_ROOT,)) -> list[str]:
    """The files of ``code`` (from :func:`loaded_code` with ``roots``) whose code here differs (or that are gone)."""
    parents = [r.parent for r in roots]
    changed = []
    for name, digest in code.items():
        path = next((p / name for p in parents if (p / name).is_file()), None)
        if path is None:
            changed.append(name)
            continue
        stat = path.stat()
        if _file_hash(str(path), stat.st_mtime_ns, stat.st_size) != digest:
            changed.append(name)
    return changed


def _code_unchanged(code: dict[str, str], roots: Sequence[Path] = (PACKAGE_ROOT,)) -> bool:
    """Whether every file of ``code`` (from :func:`loaded_code` with ``roots``) still has the hash it had."""
    return not _changed_code(code, roots)


def _refuse_other_code(row, code: dict[str, str], roots: Sequence[Path] = (PACKAGE_ROOT,)):
    """A Ray row (``node_ip``) whose node ran code that differs from the driver's becomes a failed
    run (status ``error``, naming the node and the files): its numbers are not those of this code."""
    if not (isinstance(row, dict) and "node_ip" in row):
        return row
    changed = _changed_code(code, roots)
    if not changed:
        return row
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return {**row, "status": "error",
            "error": f"node {row['node_ip']} ran other code than the driver's ({shown}); install the driver's "
                     f"version of the package on every node"}


@dataclasses.dataclass
class _Ran:
    """What a worker returns for one job: its row and the code it ran (:func:`loaded_code`)."""

    row: object
    code: dict


CODE_FIELD = "_code_ran"  # the key a dict row carries its code in, from the worker to run_jobs


def _run_recording_code(fn: Callable, job, *args, **kwargs):
    """``fn(job, ...)`` (an executor may pass more, e.g. a progress callback) with the code it ran:
    a dict row carries it under :data:`CODE_FIELD` (so an executor that reads or amends rows sees
    a row), anything else comes back as a :class:`_Ran`. The code is :func:`loaded_code` under
    ``fn``'s :func:`code_roots`, found in the process that ran it."""
    row = fn(job, *args, **kwargs)
    code = loaded_code(code_roots(fn))
    if isinstance(row, dict):
        return {**row, CODE_FIELD: code}
    return _Ran(row, code)


def _unpack(ran, roots: Sequence[Path] = (PACKAGE_ROOT,)) -> _Ran:
    """What a worker sent back, as ``_Ran(row, code)``; an executor's own row (a timeout, a
    killed child) carries no code: this process's code under ``roots`` stands in for it."""
    if isinstance(ran, _Ran):
        return ran
    if isinstance(ran, dict) and CODE_FIELD in ran:
        row = dict(ran)
        return _Ran(row, row.pop(CODE_FIELD))
    return _Ran(ran, loaded_code(roots))
