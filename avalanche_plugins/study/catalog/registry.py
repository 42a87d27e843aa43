"""Names in a study config → the Python objects they stand for, and checks of their arguments.

* strategies: a class of ``avalanche.training.supervised`` / ``avalanche.training`` (a
  ``BaseTemplate`` subclass), or ``package.module:Class``;
* plugins: this package's plugins (``avalanche_plugins``), Avalanche's
  (``avalanche.training.plugins``), or a dotted path;
* metrics: this package's metrics, Avalanche's metric helpers and classes
  (``avalanche.evaluation.metrics``: ``loss_metrics``, ``timing_metrics``, …), or a dotted path;
* models: the zoo (``avalanche_plugins.study.catalog.zoo.ZOO``) or a dotted path.

:func:`check_arguments` compares config kwargs with the callable's signature (unknown names,
missing required ones, and the types the annotations or defaults state) and raises
:class:`ConfigError` naming the config key.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import inspect
import numbers
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["ALIASES", "ConfigError", "ErrorList", "Resolver", "check_arguments", "import_paths",
           "source_hash", "check_value", "metric_factory", "model_factory",
           "parameters", "plugin_class", "resolve_dotted", "strategy_class"]


class ConfigError(ValueError):
    """A study config that cannot run. ``errors``: every problem found, each starting with the
    offending key; the message lists them all."""

    def __init__(self, errors):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        if len(self.errors) == 1:
            message = self.errors[0]
        else:
            message = f"{len(self.errors)} errors:\n" + "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(message)


class ErrorList:
    """Collects :class:`ConfigError` s so that one pass over a config reports all of them.

    Example:
        >>> found = ErrorList()
        >>> with found.attempt():
        ...     raise ConfigError("seeds: expected an integer >= 1, got 0")
        >>> with found.attempt():
        ...     raise ConfigError("model.name: unknown model 'mpl'")
        >>> print(found.error())
        2 errors:
          - seeds: expected an integer >= 1, got 0
          - model.name: unknown model 'mpl'
    """

    def __init__(self):
        self.errors: list[str] = []

    @contextlib.contextmanager
    def attempt(self):
        try:
            yield
        except ConfigError as error:
            self.errors.extend(error.errors)

    def error(self) -> ConfigError | None:
        return ConfigError(self.errors) if self.errors else None

    def raise_if_any(self) -> None:
        if self.errors:
            raise ConfigError(self.errors)


@contextlib.contextmanager
def import_paths(paths):
    """Put ``paths`` first on ``sys.path`` for the block (in their order, those not there already)
    and take those it put off again: the one place the study changes ``sys.path`` (reading a
    config's dotted names, a job importing its user modules).

    Example:
        >>> with import_paths(["/nonexistent/folder"]):
        ...     sys.path[0]
        '/nonexistent/folder'
        >>> "/nonexistent/folder" in sys.path
        False
    """
    added = [p for p in dict.fromkeys(str(p) for p in paths or ()) if p not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for path in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(path)


class Resolver:
    """Resolves a study's dotted ``module:callable`` names against ``folders`` (the config's, the
    working directory: on ``sys.path`` only while a name is imported, :func:`import_paths`) and
    records the folder each user module was imported from (``imported_from``: the folder of its
    top-level package), which the study keeps so its jobs can import the modules where they run.

    Example:
        >>> resolver = Resolver()
        >>> resolver.resolve("json:dumps", "model.name").__name__, resolver.search_paths
        ('dumps', ())
        >>> resolver.folders(["json"]) == [str(Path(__import__("json").__file__).resolve().parents[1])]  # holds json/
        True
    """

    def __init__(self, *folders):
        self.search_paths = tuple(str(Path(f).resolve()) for f in folders if f is not None)
        self.imported_from: dict[str, str] = {}  # user module → the folder it was imported from

    def resolve(self, path: str, where: str):
        """:func:`resolve_dotted` with the search folders on ``sys.path``; records the module's folder."""
        with import_paths(self.search_paths):
            obj = resolve_dotted(path, where, searched=self.search_paths)
        module_name = path.partition(":")[0]
        file = getattr(sys.modules.get(module_name), "__file__", None)
        if file:
            top = Path(file).resolve().parents[module_name.count(".") + (Path(file).name == "__init__.py")]
            self.imported_from.setdefault(module_name, str(top))
        return obj

    def folders(self, modules) -> list[str]:
        """The folders ``modules`` were imported from (in order, once each; unresolved ones left out)."""
        return list(dict.fromkeys(self.imported_from[m] for m in modules if m in self.imported_from))

    def source_hashes(self, modules) -> dict[str, str]:
        """``{module: source_hash}`` of ``modules`` (those with source files)."""
        with import_paths(self.search_paths):
            hashes = {m: source_hash(m) for m in dict.fromkeys(modules)}
        return {m: h for m, h in hashes.items() if h is not None}


def _resolve(name: str, where: str, resolver: Resolver | None):
    """A dotted name through ``resolver`` (reading a config), or :func:`resolve_dotted` (building a run)."""
    return resolver.resolve(name, where) if resolver is not None else resolve_dotted(name, where)


def source_hash(module_name: str) -> str | None:
    """SHA-256 (first 16 hex digits) of a module's source: its file, or every ``.py`` file of a
    package. ``None`` for a module without source files (built-in, compiled)."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    file = getattr(module, "__file__", None)
    if not file or not file.endswith(".py"):
        return None
    path = Path(file)
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def resolve_dotted(path: str, where: str, searched=()):
    """``"package.module:attr.sub"`` → the object (``ConfigError`` naming ``where`` otherwise,
    and the folders ``searched`` where the module is not found)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{where}: expected 'package.module:callable', got {path!r}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"{where}: cannot import module {module_name!r} ({error}; searched "
                          f"{', '.join(searched) or 'sys.path'})") from None
    except Exception as error:  # noqa: BLE001 - the user's module fails at import: say so, with its key
        raise ConfigError(f"{where}: importing {module_name!r} raised {type(error).__name__}: {error}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{where}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{where}: {path!r} is not callable")
    return obj


# what papers and other libraries call Avalanche's strategies and plugins (normalised: lower case,
# letters and digits only) → Avalanche's names, or advice where Avalanche has no class of that name
ALIASES = {
    "si": "SynapticIntelligence", "synapticintelligence": "SynapticIntelligence",
    "agem": "AGEM", "averagedgem": "AGEM", "er": "Replay", "experiencereplay": "Replay", "replay": "Replay",
    "eraca": "ER_ACE", "erace": "ER_ACE", "eraml": "ER_AML", "der": "DER", "derpp": "DER", "darkexperiencereplay": "DER",
    "icarl": "ICaRL", "joint": "JointTraining", "jointtraining": "JointTraining", "offline": "JointTraining",
    "gss": "GSS_greedy", "gr": "GenerativeReplay", "dgr": "GenerativeReplay", "generativereplay": "GenerativeReplay",
    "finetune": "Naive", "finetuning": "Naive", "sgd": "Naive", "cumulative": "Cumulative",
    "onlineewc": "EWC (with kwargs: {mode: online, decay_factor: ...})", "ewcpp": "EWC (with kwargs: {mode: online})",
    "rwalk": "Naive with plugins: [RWalkPlugin]", "riemannianwalk": "Naive with plugins: [RWalkPlugin]",
    "lwf": "LwF", "mas": "MAS", "gdumb": "GDumb", "lfl": "LFL", "packnet": "PackNet",
}


def _normal(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("++", "pp"))


def _unknown(kind: str, name: str, where: str, known: Iterable[str]) -> ConfigError:
    """An unknown name, with did-you-mean over ``known`` (case- and punctuation-insensitive) and
    the common aliases of strategies and plugins."""
    known = sorted(set(known))
    by_normal = {_normal(k): k for k in known}
    key = _normal(name)
    close = []
    if kind == "plugin":
        stem = _normal(ALIASES.get(key.removesuffix("plugin"), key).split()[0])
        close += [by_normal[c] for c in (key, f"{key}plugin", f"{stem}plugin") if c in by_normal]
    else:
        if key in ALIASES:
            close.append(ALIASES[key])
        if key in by_normal:
            close.append(by_normal[key])
    if len(key) >= 3:
        close += [k for n, k in by_normal.items() if n.startswith(key)]
    close += [by_normal[c] for c in difflib.get_close_matches(key, list(by_normal), n=3, cutoff=0.7)]
    close += difflib.get_close_matches(name, known, n=3)
    close = list(dict.fromkeys(c for c in close if c != name))[:3]
    hint = f"; did you mean {' or '.join(close)}?" if close else f"; known: {', '.join(known)}"
    return ConfigError(f"{where}: unknown {kind} {name!r} (or give 'package.module:callable'){hint}")


def _package_exports(suffix: str) -> dict:
    import avalanche_plugins

    return {name: getattr(avalanche_plugins, name) for name in avalanche_plugins.__all__ if name.endswith(suffix)}


def strategy_class(name: str, where: str, resolver: Resolver | None = None) -> type:
    """An Avalanche strategy class by name, or a dotted path."""
    if ":" in name:
        return _resolve(name, where, resolver)
    import avalanche.training as training
    import avalanche.training.supervised as supervised
    from avalanche.training.templates import BaseTemplate

    found = {n: getattr(m, n) for m in (supervised, training) for n in dir(m)
             if isinstance(getattr(m, n), type) and issubclass(getattr(m, n), BaseTemplate)}
    if name not in found:
        raise _unknown("Avalanche strategy", name, where, found)
    return found[name]


def plugin_class(name: str, where: str, resolver: Resolver | None = None) -> type:
    """A plugin of this package or Avalanche's by class name, or a dotted path."""
    if ":" in name:
        return _resolve(name, where, resolver)
    import avalanche.training.plugins as avalanche_plugins_module

    found = {n: getattr(avalanche_plugins_module, n) for n in dir(avalanche_plugins_module) if n.endswith("Plugin")}
    found.pop("EvaluationPlugin", None)  # the study builds the one evaluator itself
    found.update(_package_exports("Plugin"))
    if name not in found:
        raise _unknown("plugin", name, where, found)
    return found[name]


def metric_factory(name: str, where: str, resolver: Resolver | None = None) -> Callable:
    """A metric class of this package, an Avalanche metric helper/class, or a dotted path."""
    if ":" in name:
        return _resolve(name, where, resolver)
    import avalanche.evaluation.metrics as metrics

    found = {n: getattr(metrics, n) for n in dir(metrics)
             if n.endswith("_metrics") or (n[0].isupper() and isinstance(getattr(metrics, n), type))}
    found.update(_package_exports("Metric"))
    if name not in found:
        raise _unknown("metric", name, where, found)
    return found[name]


def model_factory(name: str, where: str, resolver: Resolver | None = None) -> Callable | None:
    """``None`` for a zoo name (built by ``build_model``), else the dotted callable."""
    from avalanche_plugins.study.catalog.zoo import ZOO

    if ":" in name:
        return _resolve(name, where, resolver)
    if name not in ZOO:
        raise _unknown("model", name, where, ZOO)
    return None


# ------------------------------------------------------------------------------------------------
# signatures


def parameters(fn: Callable) -> tuple[dict[str, inspect.Parameter], set[str], bool, dict]:
    """``(named parameters, required names, accepts any keyword, type hints)`` of a callable.
    For a class, the parameters of every ``__init__`` along its MRO (cooperative ``**kwargs``
    end in ``object.__init__``, which accepts none), so a class accepts exactly those names;
    the required ones are those of the class's own ``__init__``."""
    is_class = isinstance(fn, type)
    targets = [c.__init__ for c in inspect.getmro(fn) if "__init__" in vars(c) and c is not object] if is_class else [fn]
    params: dict[str, inspect.Parameter] = {}
    hints: dict = {}
    required: set[str] = set()
    accepts_any = False
    for i, target in enumerate(targets):
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            return {}, set(), True, {}
        if i == 0:
            required = {n for n, p in signature.parameters.items() if n != "self" and p.default is p.empty
                        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        for n, p in signature.parameters.items():
            if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                params.setdefault(n, p)
        try:
            hints = {**typing.get_type_hints(target), **hints}
        except Exception:  # unresolvable annotations: check what the defaults say
            pass
        accepts_any = not is_class and any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return params, required, accepts_any, hints


def check_arguments(fn: Callable, kwargs: Mapping, where: str, *, injected: Iterable[str] = (),
                    optional: Iterable[str] = (), label: str | None = None) -> None:
    """Check ``kwargs`` against ``fn``'s signature: every name accepted, every required parameter
    given (``injected`` ones are supplied by the study, ``optional`` ones may come later, e.g.
    from a grid), every value of the annotated / default type. Every problem is reported at once."""
    label = label or getattr(fn, "__name__", str(fn))
    params, required, accepts_any, hints = parameters(fn)
    injected, optional = set(injected), set(optional)
    found = ErrorList()
    for name, value in kwargs.items():
        with found.attempt():
            if name in injected:
                raise ConfigError(f"{where}.{name}: set by the study itself (do not give it)")
            if name not in params:
                if accepts_any:
                    continue
                accepted = sorted(set(params) - injected)
                close = difflib.get_close_matches(name, accepted, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(f"{where}.{name}: {label} has no argument {name!r}; {hint}it takes "
                                  f"{', '.join(accepted)}")
            check_value(value, hints.get(name, inspect.Parameter.empty), params[name].default, f"{where}.{name}")
    missing = [n for n in params if n in required and n not in kwargs and n not in injected and n not in optional]
    if missing:
        found.errors.append(f"{where}: {label} needs {', '.join(missing)}")
    found.raise_if_any()


def check_value(value, annotation, default, where: str) -> None:
    """Raise ``ConfigError`` when ``value`` clearly does not fit ``annotation`` (or, without one,
    the type of ``default``). Unknown annotation types accept anything."""
    if annotation is inspect.Parameter.empty:
        if isinstance(default, bool):
            annotation = bool
        elif isinstance(default, numbers.Real):
            annotation = float
        elif isinstance(default, str):
            annotation = str
        else:
            return
        if default is not None:
            annotation = annotation | None
    expected = _expected(annotation)
    if expected is None or any(ok(value) for ok, _ in expected):
        return
    names = " or ".join(dict.fromkeys(name for _, name in expected))
    raise ConfigError(f"{where}: expected {names}, got {value!r}")


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


_SIMPLE = {
    float: (_is_number, "a number"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    str: (lambda v: isinstance(v, str), "a string"),
    type(None): (lambda v: v is None, "null"),
}


def _expected(annotation) -> list[tuple[Callable, str]] | None:
    """``[(predicate, name), ...]`` any of which the value must satisfy; None: anything goes."""
    if annotation in _SIMPLE:
        return [_SIMPLE[annotation]]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        out = []
        for member in typing.get_args(annotation):
            sub = _expected(member)
            if sub is None:
                return None
            out += sub
        return out
    if origin in (list, tuple, Sequence, typing.Sequence) or annotation in (list, tuple):
        return [(lambda v: isinstance(v, (list, tuple)), "a list")]
    return None
