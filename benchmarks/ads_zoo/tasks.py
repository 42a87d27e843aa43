"""The old and new task of each scenario as tensors (the task source of a job)."""

from __future__ import annotations

import torch

from avalanche_plugins.study.catalog.datasets import (
    load_digits_arrays,
    load_fashion_mnist_arrays,
    load_mnist_arrays,
)
from benchmarks.ads_zoo.settings import SCENARIOS

_DATA: dict = {}


def scenario_data(name: str, data_root, seed: int = 0) -> dict:
    """Old/new training tensors and old test tensors of a scenario (cached per process)."""
    if name in _DATA:
        return _DATA[name]
    if name == "split_digits":
        xtr, ytr, xte, yte = load_digits_arrays(seed=0)
    elif name in ("split_mnist", "permuted_mnist"):
        xtr, ytr, xte, yte = load_mnist_arrays(data_root)
    elif name == "split_fashion_mnist":
        xtr, ytr, xte, yte = load_fashion_mnist_arrays(data_root)
    else:
        raise ValueError(f"scenario must be one of {SCENARIOS}, got {name!r}")
    if name == "permuted_mnist":
        perm = torch.randperm(xtr[0].numel(), generator=torch.Generator().manual_seed(seed))
        shape = xtr.shape[1:]
        new_x = xtr.reshape(len(xtr), -1)[:, perm].reshape(len(xtr), *shape)
        data = {"old": (xtr, ytr), "new": (new_x, ytr), "old_test": (xte, yte)}
    else:
        old, new, old_test = ytr < 5, ytr >= 5, yte < 5
        data = {"old": (xtr[old], ytr[old]), "new": (xtr[new], ytr[new]), "old_test": (xte[old_test], yte[old_test])}
    data["input_shape"] = tuple(xtr.shape[1:])
    _DATA[name] = data
    return data


def subset(x, y, n, generator):
    """At most ``n`` random rows of ``(x, y)`` drawn with ``generator`` (all of them, undrawn, if fewer)."""
    if len(x) <= n:
        return x, y
    idx = torch.randperm(len(x), generator=generator)[:n]
    return x[idx], y[idx]
