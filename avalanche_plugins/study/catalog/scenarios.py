"""The study's built-in scenarios, read from the dataset catalog
(:data:`avalanche_plugins.study.catalog.datasets.CATALOG`): ``{kind}_{dataset}`` for every kind a
dataset supports (``split_digits``, ``permuted_mnist``, ...), with its input shape and classes."""

from __future__ import annotations

from avalanche_plugins.study.catalog.datasets import CATALOG, Dataset

__all__ = ["BUILTIN_SCENARIOS", "INPUT_SHAPES", "builtin_scenarios", "dataset_of"]


def builtin_scenarios() -> dict[str, tuple[str, str]]:
    """``{scenario name: (dataset, kind)}`` of the catalog as it is now (a dataset added at run
    time included).

    Example:
        >>> builtin_scenarios()["permuted_digits"]
        ('digits', 'permuted')
    """
    return {f"{kind}_{name}": (name, kind) for name, entry in CATALOG.items() for kind in entry.kinds}


def dataset_of(benchmark: str) -> tuple[str, str, Dataset]:
    """``(dataset name, kind, catalog entry)`` of a built-in scenario name."""
    dataset, kind = builtin_scenarios()[benchmark]
    return dataset, kind, CATALOG[dataset]


BUILTIN_SCENARIOS = builtin_scenarios()  # the shipped ones
INPUT_SHAPES = {name: entry.input_shape for name, entry in CATALOG.items()}
