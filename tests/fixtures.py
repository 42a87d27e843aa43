"""Streams and evaluators for the library tests (the tests never import ``benchmarks``).

The models are in :mod:`tests.cases` (the zoo's at test sizes, and two hand-sized networks).

* :func:`digits_stream` — split scikit-learn digits (8×8, offline) through Avalanche's
  ``nc_benchmark``; ``noise > 0`` makes every read of a training sample draw Gaussian noise from
  torch's global RNG, like a torchvision dataset built with ``transform=RandomCrop(...)``.
* :func:`evaluator` — an ``EvaluationPlugin`` with per-experience accuracy that does not warn
  when no logger is given.

Avalanche's ``nc_benchmark`` reseeds torch's global RNG: build the stream before seeding a model.
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import TensorDataset

# --------------------------------------------------------------------------------------------
# data


class Stream(NamedTuple):
    benchmark: object  # Avalanche scenario: train_stream, test_stream
    input_shape: tuple[int, int, int]
    n_classes: int  # outputs of one shared head (per head with task labels)


class NoisyTensorDataset(TensorDataset):
    """``(x + noise · ε, y)`` with ``ε ~ N(0, 1)`` from torch's global RNG at every read."""

    def __init__(self, x, y, noise: float):
        super().__init__(x, y)
        self.noise = noise

    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return x + self.noise * torch.randn_like(x), y


@functools.lru_cache(maxsize=1)
def digits_arrays():
    """Standardised digits ``(N, 1, 8, 8)``: 1,347 training and 450 test images (a stratified,
    seeded split, a quarter of each class held out for testing)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = np.asarray(data.target)
    rng = np.random.default_rng(0)
    held = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        held.extend(idx[: max(1, int(round(0.25 * len(idx))))])
    test = np.sort(np.array(held))
    train = np.setdiff1d(np.arange(len(y)), test)
    x = (x - x[train].mean()) / x[train].std()
    y = torch.as_tensor(y, dtype=torch.long)
    return x[train], y[train], x[test], y[test]


def digits_stream(n_experiences: int = 5, *, task_incremental: bool = False, noise: float = 0.0,
                  seed: int = 0) -> Stream:
    """Split digits: ``n_experiences`` experiences of ``10 / n_experiences`` classes each, class-
    incremental (one 10-way head) or task-incremental (task labels, class ids from 0 per task)."""
    from avalanche.benchmarks import nc_benchmark

    xtr, ytr, xte, yte = digits_arrays()
    train = NoisyTensorDataset(xtr, ytr, noise) if noise else TensorDataset(xtr, ytr)
    benchmark = nc_benchmark(train, TensorDataset(xte, yte), n_experiences=n_experiences,
                             task_labels=task_incremental, seed=seed,
                             class_ids_from_zero_in_each_exp=task_incremental,
                             class_ids_from_zero_from_first_exp=not task_incremental)
    return Stream(benchmark, (1, 8, 8), 10 // n_experiences if task_incremental else 10)


@functools.cache
def few_digits_benchmark(n_classes: int, train_per_class: int, test_per_class: int, n_experiences: int,
                         class_order: bool = True):
    """Class-incremental digits of the first ``n_classes`` classes, ``train_per_class`` /
    ``test_per_class`` images of each (the first ones), in ``n_experiences`` experiences (in class
    order, or shuffled with seed 0 when ``class_order`` is False): a stream small enough to count
    its iterations by hand."""
    from avalanche.benchmarks import nc_benchmark

    xtr, ytr, xte, yte = digits_arrays()

    def pick(x, y, n):
        idx = torch.cat([torch.nonzero(y == c).reshape(-1)[:n] for c in range(n_classes)])
        return TensorDataset(x[idx], y[idx])

    return nc_benchmark(pick(xtr, ytr, train_per_class), pick(xte, yte, test_per_class), n_experiences=n_experiences,
                        task_labels=False, seed=0, fixed_class_order=list(range(n_classes)) if class_order else None,
                        class_ids_from_zero_from_first_exp=True)


def one_torch_thread():
    """Generator body of a fixture running a test on one torch thread (restored after): tiny
    models run fastest that way, and a test's numbers do not depend on the machine's cores."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def evaluator(*metrics, loggers=()):
    """``EvaluationPlugin(accuracy_metrics(experience=True), *metrics)``, silent without loggers."""
    from avalanche.evaluation.metrics import accuracy_metrics
    from avalanche.training.plugins import EvaluationPlugin

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        return EvaluationPlugin(accuracy_metrics(experience=True), *metrics, loggers=list(loggers))
