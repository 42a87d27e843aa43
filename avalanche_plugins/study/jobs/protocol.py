"""The tuning protocol every comparison follows: tune on validation with one seed, then test.

1. Every setting of a hyper-parameter grid (:func:`expand_grid`) runs once, seed :data:`TUNE_SEED`,
   on a validation split held out from the *training* images (``make_stream(validation=True)``),
   never on the test set.
2. :func:`select_best` keeps, per group (e.g. scenario × method), the setting with the highest
   finite validation score; a setting whose run diverged (NaN score) is never chosen.
3. The chosen setting runs on the test stream with every seed; only those runs are reported.

Used by ``benchmarks.layer_adaptive_ewc`` (λ and α grids) and ``avalanche_plugins.study`` (any grid).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

__all__ = ["TUNE_SEED", "expand_grid", "is_skipped", "select_best", "setting_label", "split_list"]

TUNE_SEED = 0


def expand_grid(grid: Mapping[str, Sequence]) -> list[dict]:
    """Every combination of ``grid``'s values, first key varying slowest (``{}`` → ``[{}]``).

    Example:
        >>> expand_grid({"ewc_lambda": [1, 10], "alpha": [0.5]})
        [{'ewc_lambda': 1, 'alpha': 0.5}, {'ewc_lambda': 10, 'alpha': 0.5}]
    """
    keys = list(grid)
    for key in keys:
        if isinstance(grid[key], (str, bytes)) or not isinstance(grid[key], Sequence) or not grid[key]:
            raise ValueError(f"grid[{key!r}]: expected a non-empty list of values, got {grid[key]!r}")
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def setting_label(setting: Mapping) -> str:
    """A short, stable name for a setting: ``"ewc_lambda=100, alpha=2"`` (``{}`` → ``"default"``).

    Example:
        >>> setting_label({"ewc_lambda": 100.0, "alpha": 2}), setting_label({})
        ('ewc_lambda=100, alpha=2', 'default')
    """
    if not setting:
        return "default"
    return ", ".join(f"{k}={_short(v)}" for k, v in setting.items())


def _short(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def select_best(rows: Iterable[Mapping], group: Callable[[Mapping], Hashable], *,
                score: str = "acc") -> dict:
    """Per ``group(row)``, the row with the highest finite ``row[score]`` (the first on ties).
    Groups whose every row has a NaN/None score are absent.

    Example:
        >>> rows = [{"m": "ewc", "lam": 1, "acc": 0.7}, {"m": "ewc", "lam": 10, "acc": 0.8},
        ...         {"m": "ewc", "lam": 100, "acc": float("nan")}, {"m": "si", "lam": 1, "acc": None}]
        >>> {k: v["lam"] for k, v in select_best(rows, lambda r: r["m"]).items()}
        {'ewc': 10}
    """
    best: dict = {}
    for row in rows:
        value = row.get(score)
        if value is None or not math.isfinite(value):
            continue
        key = group(row)
        if key not in best or value > best[key][score]:
            best[key] = row
    return best


def split_list(text: str | None) -> list[str]:
    """``"a, b,,c"`` → ``["a", "b", "c"]`` (``None`` → ``[]``)."""
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def is_skipped(skip: Iterable[str], *path: str) -> bool:
    """True if ``skip`` (what ``--skip`` names) holds ``path`` or one of its prefixes.

    Example:
        >>> is_skipped({"permuted"}, "permuted", "cnn"), is_skipped({"permuted/cnn"}, "permuted", "mlp")
        (True, False)
    """
    skip = set(skip)
    return any("/".join(path[:i]) in skip for i in range(1, len(path) + 1))
