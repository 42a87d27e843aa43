"""Continual-learning streams for the benchmarks, all offline.

* ``digits``: scikit-learn's bundled 8×8 handwritten digits (1,797 real images, no download).
* ``mnist``: MNIST from ``--data-root`` (torchvision layout ``ROOT/MNIST/raw/*-ubyte``) through
  Avalanche's classic ``SplitMNIST`` / ``PermutedMNIST``. A missing file raises
  :class:`FileNotFoundError` naming ``--data-root`` instead of a download attempt.

Scenarios: ``split`` (5 experiences of 2 classes; class-incremental, or task-incremental with
``task_incremental=True`` and class ids from zero in each experience) and ``permuted``
(every experience is all 10 classes under a fixed pixel permutation; the first is unpermuted).

With ``validation=True`` the test stream is replaced by a held-out part of the *training*
images (stratified, ``VALIDATION_FRACTION``), so hyper-parameters can be tuned without ever
looking at the test set. For MNIST that path loads the same IDX files with torchvision's reader
and builds the stream with Avalanche's ``nc_benchmark`` / ``tensors_benchmark`` (the generators the
classic benchmarks use), with the same normalisation.

Note: Avalanche's generators reseed torch's global RNG; build the stream before seeding a model.

:func:`data_fingerprint` names the data a run used (dataset, and the SHA-256 of each MNIST file)
for its ``results.json``.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

__all__ = [
    "DATASETS",
    "SCENARIOS",
    "VALIDATION_FRACTION",
    "Stream",
    "load_digits_arrays",
    "load_mnist_arrays",
    "make_stream",
    "check_mnist_root",
    "data_fingerprint",
]

DATASETS = ("digits", "mnist")
SCENARIOS = ("split", "permuted")
VALIDATION_FRACTION = 0.15
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


@dataclass
class Stream:
    """A benchmark plus what a model needs to know about it."""

    benchmark: object  # Avalanche scenario with train_stream / test_stream
    input_shape: tuple[int, int, int]
    n_classes: int  # output units of a single shared head
    task_incremental: bool
    description: str


def _stratified_split(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    held = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        held.extend(idx[: max(1, int(round(fraction * len(idx))))])
    held = np.sort(np.array(held))
    keep = np.setdiff1d(np.arange(len(y)), held)
    return keep, held


def load_digits_arrays(test_fraction: float = 0.25, seed: int = 0):
    """scikit-learn's 8×8 digits as standardised ``(N, 1, 8, 8)`` float tensors.

    Returns ``(x_train, y_train, x_test, y_test)``; the split is stratified and seeded.

    Example:
        >>> xtr, ytr, xte, yte = load_digits_arrays()
        >>> xtr.shape[1:], int(ytr.max()) + 1, len(xtr) + len(xte)
        (torch.Size([1, 8, 8]), 10, 1797)
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = np.asarray(data.target)
    train_idx, test_idx = _stratified_split(y, test_fraction, seed)
    mean, std = x[train_idx].mean(), x[train_idx].std()
    x = (x - mean) / std
    y = torch.as_tensor(y, dtype=torch.long)
    return x[train_idx], y[train_idx], x[test_idx], y[test_idx]


def check_mnist_root(data_root) -> Path:
    """Return ``Path(data_root)`` if it holds the four MNIST IDX files, else raise a clear error."""
    if data_root is None:
        raise FileNotFoundError("--data-root is required for MNIST (a folder containing MNIST/raw/)")
    root = Path(data_root)
    missing = [f for f in MNIST_FILES if not (root / "MNIST" / "raw" / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"--data-root {str(root)!r} lacks MNIST/raw/{', '.join(missing)}; these files cannot be "
            "downloaded here. Point --data-root at a folder with MNIST/raw/*-ubyte "
            "(e.g. ../shared/data) or use the digits dataset."
        )
    return root


@functools.lru_cache(maxsize=4)
def _sha256(path: str, size: int, mtime: float) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_fingerprint(data_root=None) -> dict:
    """What data a run saw: scikit-learn's digits (no ``data_root``), or MNIST from ``data_root``
    with the SHA-256 of each of its four files (absent files are listed as missing).

    Example:
        >>> data_fingerprint()["name"]
        'scikit-learn digits'
    """
    if data_root is None:
        import sklearn

        return {"name": "scikit-learn digits", "scikit-learn": sklearn.__version__}
    raw = Path(data_root) / "MNIST" / "raw"
    sha = {}
    for name in MNIST_FILES:
        path = raw / name
        if path.is_file():
            stat = path.stat()
            sha[f"MNIST/raw/{name}"] = _sha256(str(path), stat.st_size, stat.st_mtime)
        else:
            sha[f"MNIST/raw/{name}"] = "missing"
    return {"name": "MNIST", "root": str(data_root), "sha256": sha}


def load_mnist_arrays(data_root):
    """MNIST from ``data_root`` as ``(N, 1, 28, 28)`` tensors normalised like Avalanche's classic
    benchmarks (mean 0.1307, std 0.3081). Returns ``(x_train, y_train, x_test, y_test)``."""
    from torchvision.datasets import MNIST

    root = check_mnist_root(data_root)
    out = []
    for train in (True, False):
        ds = MNIST(str(root), train=train, download=False)
        x = (ds.data.float().unsqueeze(1) / 255.0 - MNIST_MEAN) / MNIST_STD
        out += [x, ds.targets.long()]
    return tuple(out)


def _permutations(n_experiences: int, n_pixels: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.arange(n_pixels)] + [torch.randperm(n_pixels, generator=g) for _ in range(n_experiences - 1)]


def _from_arrays(arrays, scenario: str, n_experiences: int, task_incremental: bool, seed: int):
    from avalanche.benchmarks import nc_benchmark, tensors_benchmark

    xtr, ytr, xte, yte = arrays
    if scenario == "split":
        return nc_benchmark(
            TensorDataset(xtr, ytr), TensorDataset(xte, yte), n_experiences=n_experiences,
            task_labels=task_incremental, seed=seed,
            class_ids_from_zero_in_each_exp=task_incremental,
            class_ids_from_zero_from_first_exp=not task_incremental,
        )
    shape = xtr.shape[1:]
    perms = _permutations(n_experiences, int(np.prod(shape)), seed)

    def permute(x, p):
        return x.reshape(len(x), -1)[:, p].reshape(len(x), *shape)

    return tensors_benchmark(
        train_tensors=[[permute(xtr, p), ytr] for p in perms],
        test_tensors=[[permute(xte, p), yte] for p in perms],
        task_labels=list(range(n_experiences)) if task_incremental else [0] * n_experiences,
    )


def make_stream(dataset: str = "digits", scenario: str = "split", *, n_experiences: int = 5,
                task_incremental: bool = False, data_root=None, seed: int = 0,
                validation: bool = False) -> Stream:
    """Build a continual-learning stream.

    Args:
        dataset: ``"digits"`` (scikit-learn, offline) or ``"mnist"`` (needs ``data_root``).
        scenario: ``"split"`` (2 classes per experience for 5 experiences) or ``"permuted"``.
        n_experiences: number of experiences (split: must divide 10).
        task_incremental: task labels per experience (use a multi-head model); otherwise one
            shared 10-way head (class-incremental for split, domain-incremental for permuted).
        data_root: folder holding ``MNIST/raw`` (``--data-root``).
        seed: class order / permutations / validation split.
        validation: replace the test stream by a held-out validation part of the training set.

    Example:
        >>> s = make_stream("digits", "split", n_experiences=5)
        >>> len(s.benchmark.train_stream), s.input_shape, s.n_classes
        (5, (1, 8, 8), 10)
    """
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}, got {scenario!r}")
    if n_experiences < 1 or (scenario == "split" and 10 % n_experiences):
        raise ValueError(f"n_experiences must be >= 1 (and divide 10 for split), got {n_experiences}")
    n_classes = 10 // n_experiences if task_incremental and scenario == "split" else 10
    if dataset == "digits":
        arrays = load_digits_arrays(seed=0)
        shape = (1, 8, 8)
    else:
        check_mnist_root(data_root)
        shape = (1, 28, 28)
        arrays = load_mnist_arrays(data_root) if validation else None
    if validation:
        xtr, ytr, _, _ = arrays
        keep, held = _stratified_split(ytr.numpy(), VALIDATION_FRACTION, seed)
        arrays = (xtr[keep], ytr[keep], xtr[held], ytr[held])
    if arrays is not None:
        bm = _from_arrays(arrays, scenario, n_experiences, task_incremental, seed)
    else:
        from avalanche.benchmarks.classic import PermutedMNIST, SplitMNIST

        if scenario == "split":
            bm = SplitMNIST(n_experiences, return_task_id=task_incremental, seed=seed,
                            class_ids_from_zero_in_each_exp=task_incremental,
                            class_ids_from_zero_from_first_exp=not task_incremental,
                            dataset_root=str(data_root))
        else:
            bm = PermutedMNIST(n_experiences, return_task_id=task_incremental, seed=seed,
                               dataset_root=str(data_root))
    mode = "task-incremental" if task_incremental else ("class-incremental" if scenario == "split" else "domain-incremental")
    desc = f"{scenario} {dataset} ({n_experiences} experiences, {mode}{', validation split' if validation else ''})"
    return Stream(bm, shape, n_classes, task_incremental, desc)
