"""Continual-learning streams for the benchmarks, all offline.

* ``digits``: scikit-learn's bundled 8×8 handwritten digits (1,797 real images, no download).
* ``mnist``: MNIST from ``--data-root`` (torchvision layout ``ROOT/MNIST/raw/*-ubyte``) through
  Avalanche's classic ``SplitMNIST`` / ``PermutedMNIST``. A missing file raises
  :class:`FileNotFoundError` naming ``--data-root`` instead of a download attempt.
* ``fashion_mnist``: Fashion-MNIST (Xiao et al. 2017; 60,000 / 10,000 28×28 grey images, 10
  balanced classes) from ``--data-root`` in torchvision's layout ``ROOT/FashionMNIST/raw/*-ubyte``,
  read with torchvision's ``FashionMNIST(download=False)`` and normalised with its own mean / std
  (0.2860, 0.3530); split and permuted like MNIST, through the generic path. ``avalanche-study data
  fashion_mnist --data-root ROOT`` writes and verifies those files from the Debian package
  ``dataset-fashion-mnist`` (:mod:`~avalanche_plugins.study.catalog.prepare`); a missing file
  raises :class:`FileNotFoundError` naming that command.
* ``cifar10`` / ``cifar100``: CIFAR from ``--data-root`` in torchvision's layout
  (``ROOT/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``,
  ``ROOT/cifar-100-python/{train,test,meta}``), read from the pickles directly (torchvision's
  loader insists on the original MD5 sums, which a generated test dataset cannot have); ``split``
  only, 100 fine classes for CIFAR-100, normalised with Avalanche's per-channel means/stds, no
  augmentation. Images stay ``uint8`` in memory and are normalised when read.
  The tests' ``cifar_fixture.write_fake_cifar`` writes a tiny dataset in this format.

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
for its ``results.json`` (``dataset="fashion_mnist"``, ``"cifar10"``, ``"cifar100"``: of each of
their files).
"""

from __future__ import annotations

import functools
import hashlib
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

__all__ = [
    "CATALOG",
    "stream_facts",
    "DATASETS",
    "Dataset",
    "N_CLASSES",
    "SCENARIOS",
    "VALIDATION_FRACTION",
    "Stream",
    "load_digits_arrays",
    "load_mnist_arrays",
    "load_fashion_mnist_arrays",
    "load_cifar_arrays",
    "make_stream",
    "check_mnist_root",
    "check_fashion_mnist_root",
    "check_cifar_root",
    "CIFAR",
    "CifarImages",
    "data_fingerprint",
]

SCENARIOS = ("split", "permuted")
VALIDATION_FRACTION = 0.15
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
FASHION_MNIST_MEAN, FASHION_MNIST_STD = 0.2860, 0.3530  # of its 60,000 training images
FASHION_MNIST_FOLDER = "FashionMNIST/raw"


@dataclass(frozen=True)
class CifarLayout:
    """Where torchvision keeps one CIFAR dataset under a root, and how to normalise it."""

    name: str
    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    label_key: str
    n_classes: int
    mean: tuple[float, float, float]  # Avalanche's classic benchmarks' values
    std: tuple[float, float, float]

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train_files, *self.test_files, self.meta_file)


CIFAR = {
    "cifar10": CifarLayout("CIFAR-10", "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)),
                           ("test_batch",), "batches.meta", "labels", 10,
                           (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": CifarLayout("CIFAR-100", "cifar-100-python", ("train",), ("test",), "meta", "fine_labels", 100,
                            (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


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


def _check_idx_root(data_root, label: str, folder: str, fix: str) -> Path:
    """``Path(data_root)`` if ``data_root/folder`` holds the four IDX files, else a
    :class:`FileNotFoundError` naming ``--data-root`` and ``fix``."""
    if data_root is None:
        raise FileNotFoundError(f"--data-root is required for {label} (a folder containing {folder}/)")
    root = Path(data_root)
    missing = [f for f in MNIST_FILES if not (root / folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"--data-root {str(root)!r} lacks {folder}/{', '.join(missing)}; these files "
                                f"cannot be downloaded here. {fix}")
    return root


def check_mnist_root(data_root) -> Path:
    """Return ``Path(data_root)`` if it holds the four MNIST IDX files, else raise a clear error."""
    return _check_idx_root(data_root, "MNIST", "MNIST/raw", "Point --data-root at a folder with MNIST/raw/*-ubyte "
                           "(e.g. ../shared/data) or use the digits dataset.")


def check_fashion_mnist_root(data_root) -> Path:
    """Return ``Path(data_root)`` if it holds Fashion-MNIST's four IDX files in torchvision's
    layout, else a :class:`FileNotFoundError` naming the command that prepares them."""
    where = "DIR" if data_root is None else str(data_root)
    return _check_idx_root(data_root, "Fashion-MNIST", FASHION_MNIST_FOLDER,
                           f"Prepare them from the Debian package dataset-fashion-mnist with `avalanche-study data "
                           f"fashion_mnist --data-root {where}` (it says how to get the package if it is missing).")


@functools.lru_cache(maxsize=4)
def _sha256(path: str, size: int, mtime: float) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_fingerprint(data_root=None, dataset: str | None = None) -> dict:
    """What data a run saw, from the dataset's :data:`CATALOG` entry: bundled data (no files:
    scikit-learn's digits) by its name and the version of the package that ships it; otherwise the
    SHA-256 of each of its files under ``data_root`` (absent files listed as missing).
    ``dataset`` ``None``: the digits without ``data_root``, MNIST with one.

    Example:
        >>> data_fingerprint()["name"]
        'scikit-learn digits'
    """
    if dataset is None:
        dataset = "mnist" if data_root is not None else "digits"
    if dataset not in CATALOG:
        raise ValueError(f"dataset must be one of {DATASETS} or None, got {dataset!r}")
    entry = CATALOG[dataset]
    if not entry.files:
        return {"name": entry.label, **({entry.version_of: _version(entry.version_of)} if entry.version_of else {})}
    sha = {}
    for rel in entry.files:
        path = Path(data_root) / rel if data_root is not None else None
        if path is not None and path.is_file():
            stat = path.stat()
            sha[rel] = _sha256(str(path), stat.st_size, stat.st_mtime)
        else:
            sha[rel] = "missing"
    return {"name": entry.label, "root": None if data_root is None else str(data_root), "sha256": sha}


def _version(distribution: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _idx_arrays(root: Path, torchvision_class, mean: float, std: float):
    out = []
    for train in (True, False):
        ds = torchvision_class(str(root), train=train, download=False)
        x = (ds.data.float().unsqueeze(1) / 255.0 - mean) / std
        out += [x, ds.targets.long()]
    return tuple(out)


def load_mnist_arrays(data_root):
    """MNIST from ``data_root`` as ``(N, 1, 28, 28)`` tensors normalised like Avalanche's classic
    benchmarks (mean 0.1307, std 0.3081). Returns ``(x_train, y_train, x_test, y_test)``."""
    from torchvision.datasets import MNIST

    return _idx_arrays(check_mnist_root(data_root), MNIST, MNIST_MEAN, MNIST_STD)


def load_fashion_mnist_arrays(data_root):
    """Fashion-MNIST from ``data_root/FashionMNIST/raw`` (torchvision's reader, never a download)
    as ``(N, 1, 28, 28)`` tensors ``(p - 0.2860) / 0.3530`` for pixels ``p`` in ``[0, 1]``.
    Returns ``(x_train, y_train, x_test, y_test)``."""
    from torchvision.datasets import FashionMNIST

    return _idx_arrays(check_fashion_mnist_root(data_root), FashionMNIST, FASHION_MNIST_MEAN, FASHION_MNIST_STD)


def check_cifar_root(data_root, dataset: str = "cifar10") -> Path:
    """Return ``Path(data_root) / <folder>`` if it holds every file of ``dataset``'s torchvision
    layout (see :data:`CIFAR`), else raise a :class:`FileNotFoundError` naming ``--data-root``."""
    if dataset not in CIFAR:
        raise ValueError(f"dataset must be one of {tuple(CIFAR)}, got {dataset!r}")
    layout = CIFAR[dataset]
    if data_root is None:
        raise FileNotFoundError(f"--data-root is required for {layout.name} (a folder containing "
                                f"{layout.folder}/)")
    folder = Path(data_root) / layout.folder
    missing = [f for f in layout.files if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"--data-root {str(data_root)!r} lacks {layout.folder}/{', '.join(missing)}; these files cannot "
            f"be downloaded here. Point --data-root at a folder with torchvision's {layout.folder}/ "
            f"({', '.join(layout.files)})."
        )
    return folder


def _read_cifar_file(path: Path, label_key: str, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    # The CIFAR files are Python 2 pickles; latin1 keeps their byte strings readable (as torchvision does).
    # Like any pickle, only load data you trust.
    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    if isinstance(entry, dict):  # keys are str (latin1 decoding), or bytes if pickled as such in Python 3
        entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
    if not isinstance(entry, dict) or "data" not in entry or label_key not in entry:
        raise ValueError(f"{path} is not a CIFAR batch: expected a dict with 'data' and {label_key!r}")
    data = np.asarray(entry["data"])
    labels = np.asarray(entry[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise ValueError(f"{path}: expected 'data' as N x 3072 uint8 and N {label_key!r}, got "
                         f"{data.dtype} {data.shape} and {len(labels)} labels")
    if len(labels) and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"{path}: {label_key!r} must lie in 0..{n_classes - 1}")
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar_arrays(data_root, dataset: str = "cifar10"):
    """CIFAR from ``data_root`` as ``uint8`` images ``(N, 3, 32, 32)`` and ``long`` labels
    (CIFAR-100: the 100 fine classes). Returns ``(x_train, y_train, x_test, y_test)``."""
    folder = check_cifar_root(data_root, dataset)
    layout = CIFAR[dataset]
    out = []
    for files in (layout.train_files, layout.test_files):
        parts = [_read_cifar_file(folder / f, layout.label_key, layout.n_classes) for f in files]
        out += [torch.from_numpy(np.concatenate([x for x, _ in parts])),
                torch.from_numpy(np.concatenate([y for _, y in parts]))]
    return tuple(out)


class CifarImages(Dataset):
    """``uint8`` images normalised per channel when read (a quarter of the memory of float
    tensors); items are ``(float image, label)`` like a ``TensorDataset``'s."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean, std):
        self.images, self.targets = images, labels
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i):
        return (self.images[i].float() / 255.0 - self.mean) / self.std, self.targets[i]


def _permutations(n_experiences: int, n_pixels: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.arange(n_pixels)] + [torch.randperm(n_pixels, generator=g) for _ in range(n_experiences - 1)]


def _split(train, test, n_experiences: int, task_incremental: bool, seed: int):
    from avalanche.benchmarks import nc_benchmark

    return nc_benchmark(
        train, test, n_experiences=n_experiences, task_labels=task_incremental, seed=seed,
        class_ids_from_zero_in_each_exp=task_incremental,
        class_ids_from_zero_from_first_exp=not task_incremental,
    )


def _from_arrays(arrays, scenario: str, n_experiences: int, task_incremental: bool, seed: int):
    from avalanche.benchmarks import tensors_benchmark

    xtr, ytr, xte, yte = arrays
    if scenario == "split":
        return _split(TensorDataset(xtr, ytr), TensorDataset(xte, yte), n_experiences, task_incremental, seed)
    shape = xtr.shape[1:]
    perms = _permutations(n_experiences, int(np.prod(shape)), seed)

    def permute(x, p):
        return x.reshape(len(x), -1)[:, p].reshape(len(x), *shape)

    return tensors_benchmark(
        train_tensors=[[permute(xtr, p), ytr] for p in perms],
        test_tensors=[[permute(xte, p), yte] for p in perms],
        task_labels=list(range(n_experiences)) if task_incremental else [0] * n_experiences,
    )


def _per_class(y: np.ndarray, n: int, seed: int, key: str = "train_per_class", images: str = "training",
               after: str = "after the validation hold-out") -> np.ndarray:
    """Sorted indices of ``n`` seeded random samples of every class of ``y``."""
    counts = np.bincount(y)
    present = np.flatnonzero(counts)
    if n > counts[present].min():
        raise ValueError(f"{key}={n} asks for more {images} images than the smallest class has "
                         f"({int(counts[present].min())} {after}); choose "
                         f"{key} <= {int(counts[present].min())}")
    rng = np.random.default_rng(seed)
    return np.sort(np.concatenate([rng.permutation(np.flatnonzero(y == c))[:n] for c in present]))


def _benchmark_from_arrays(entry: Dataset, kind: str, n_experiences: int, task_incremental: bool, data_root,
                          seed: int, validation: bool, train_per_class: int | None = None,
                          test_per_class: int | None = None):
    """The generic stream of a catalog entry: its arrays (the validation split held out of the
    training images with ``validation``; then ``train_per_class`` training images of each class
    kept, seeded, and ``test_per_class`` evaluation images of each class, the same for every
    seed), split by classes or permuted."""
    xtr, ytr, xte, yte = entry.arrays(data_root)
    if validation:
        keep, held = _stratified_split(ytr.numpy(), VALIDATION_FRACTION, seed)
        xtr, ytr, xte, yte = xtr[keep], ytr[keep], xtr[held], ytr[held]
    if train_per_class is not None:
        keep = torch.from_numpy(_per_class(ytr.numpy(), train_per_class, seed))
        xtr, ytr = xtr[keep], ytr[keep]
    if test_per_class is not None:  # seed 0: every seed of a study is scored on the same images
        keep = torch.from_numpy(_per_class(yte.numpy(), test_per_class, 0, "test_per_class",
                                           "validation" if validation else "test",
                                           "in the validation hold-out" if validation else "in the test set"))
        xte, yte = xte[keep], yte[keep]
    if kind == "split" and entry.wrap is not None:
        return _split(entry.wrap(xtr, ytr), entry.wrap(xte, yte), n_experiences, task_incremental, seed)
    return _from_arrays((xtr, ytr, xte, yte), kind, n_experiences, task_incremental, seed)


def _mnist_benchmark(entry: Dataset, kind: str, n_experiences: int, task_incremental: bool, data_root, seed: int,
                     validation: bool):
    """MNIST: Avalanche's classic ``SplitMNIST`` / ``PermutedMNIST`` on the test stream; the
    validation split from the same files through the generic path (same normalisation)."""
    check_mnist_root(data_root)
    if validation:
        return _benchmark_from_arrays(entry, kind, n_experiences, task_incremental, data_root, seed, validation)
    from avalanche.benchmarks.classic import PermutedMNIST, SplitMNIST

    if kind == "split":
        return SplitMNIST(n_experiences, return_task_id=task_incremental, seed=seed,
                          class_ids_from_zero_in_each_exp=task_incremental,
                          class_ids_from_zero_from_first_exp=not task_incremental, dataset_root=str(data_root))
    return PermutedMNIST(n_experiences, return_task_id=task_incremental, seed=seed, dataset_root=str(data_root))


def _cifar(name: str) -> Dataset:
    layout = CIFAR[name]
    return Dataset(layout.name, layout.n_classes, (3, 32, 32), ("split",),
                   arrays=lambda root: load_cifar_arrays(root, name),
                   files=tuple(f"{layout.folder}/{f}" for f in layout.files),
                   wrap=lambda x, y: CifarImages(x, y, layout.mean, layout.std), norm=(layout.mean, layout.std))


@dataclass(frozen=True)
class Dataset:
    """One built-in dataset, one entry of :data:`CATALOG`: everything the study and
    :func:`make_stream` know of it. Its scenarios are ``{kind}_{name}`` for each of ``kinds``."""

    label: str  # the name results and reports give it
    n_classes: int
    input_shape: tuple[int, int, int]  # (C, H, W): what a model is built for
    kinds: tuple[str, ...]  # scenario kinds it supports: "split" and/or "permuted"
    arrays: Callable  # data_root -> (x_train, y_train, x_test, y_test) tensors
    files: tuple[str, ...] = ()  # read under data_root (fingerprinted); () for bundled data
    version_of: str | None = None  # the distribution whose version identifies bundled data
    wrap: Callable | None = None  # (images, labels) -> torch Dataset of a split stream (default: tensors)
    benchmark: Callable = _benchmark_from_arrays  # (entry, kind, n_experiences, task_incremental, data_root, seed, validation)
    norm: tuple | None = None  # (mean, std), scalars or per channel: stream images are (p - mean) / std, p in [0, 1]


CATALOG: dict[str, Dataset] = {  # name -> entry: adding a dataset is one entry here
    "digits": Dataset("scikit-learn digits", 10, (1, 8, 8), SCENARIOS, arrays=lambda root: load_digits_arrays(seed=0),
                      version_of="scikit-learn"),
    "mnist": Dataset("MNIST", 10, (1, 28, 28), SCENARIOS, arrays=load_mnist_arrays,
                     files=tuple(f"MNIST/raw/{f}" for f in MNIST_FILES), benchmark=_mnist_benchmark,
                     norm=(MNIST_MEAN, MNIST_STD)),
    "fashion_mnist": Dataset("Fashion-MNIST", 10, (1, 28, 28), SCENARIOS, arrays=load_fashion_mnist_arrays,
                             files=tuple(f"{FASHION_MNIST_FOLDER}/{f}" for f in MNIST_FILES),
                             norm=(FASHION_MNIST_MEAN, FASHION_MNIST_STD)),
    "cifar10": _cifar("cifar10"),
    "cifar100": _cifar("cifar100"),
}
DATASETS = tuple(CATALOG)  # as shipped (CATALOG itself is read at call time)
N_CLASSES = {name: entry.n_classes for name, entry in CATALOG.items()}


def make_stream(dataset: str = "digits", scenario: str = "split", *, n_experiences: int = 5,
                task_incremental: bool = False, data_root=None, seed: int = 0,
                validation: bool = False, train_per_class: int | None = None,
                test_per_class: int | None = None) -> Stream:
    """Build a continual-learning stream of a :data:`CATALOG` dataset.

    Args:
        dataset: ``"digits"`` (scikit-learn, offline), ``"mnist"``, ``"fashion_mnist"``,
            ``"cifar10"`` or ``"cifar100"`` (these need ``data_root``), or any other catalog entry.
        scenario: ``"split"`` (``n_classes / n_experiences`` classes per experience) or
            ``"permuted"`` (where the dataset's ``kinds`` allow it: digits, MNIST, Fashion-MNIST).
        n_experiences: number of experiences (split: must divide the number of classes, 10 or 100).
        task_incremental: task labels per experience (use a multi-head model); otherwise one
            shared head over all classes (class-incremental for split, domain-incremental for
            permuted).
        data_root: folder holding ``MNIST/raw``, ``FashionMNIST/raw``, ``cifar-10-batches-py`` or ``cifar-100-python``
            (``--data-root``).
        seed: class order / permutations / validation split.
        validation: replace the test stream by a held-out validation part of the training set.
        train_per_class: train on this many images of each class only (seeded by ``seed``, drawn
            after the validation hold-out; the test or validation stream stays whole), e.g. 1,000
            for 2,000 images per Split Fashion-MNIST experience instead of 12,000. Always built
            from the entry's ``arrays`` (MNIST too).
        test_per_class: evaluate on this many images of each class only (the test stream, or the
            validation stream with ``validation``), drawn with seed 0 whatever ``seed`` so that
            every seed of a study is scored on the same images; None: all of them.

    Example:
        >>> s = make_stream("digits", "split", n_experiences=5)
        >>> len(s.benchmark.train_stream), s.input_shape, s.n_classes
        (5, (1, 8, 8), 10)
    """
    if dataset not in CATALOG:
        raise ValueError(f"dataset must be one of {tuple(CATALOG)}, got {dataset!r}")
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}, got {scenario!r}")
    entry = CATALOG[dataset]
    total = entry.n_classes
    if scenario not in entry.kinds:
        raise ValueError(f"scenario must be {' or '.join(map(repr, entry.kinds))} for {dataset}, got {scenario!r}")
    if n_experiences < 1 or (scenario == "split" and total % n_experiences):
        raise ValueError(f"n_experiences must be >= 1 (and divide {total} for split {dataset}), got {n_experiences!r}")
    for key, value in (("train_per_class", train_per_class), ("test_per_class", test_per_class)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{key} must be an int >= 1 or None, got {value!r}")
    n_classes = total // n_experiences if task_incremental and scenario == "split" else total
    if train_per_class is None and test_per_class is None:
        bm = entry.benchmark(entry, scenario, n_experiences, task_incremental, data_root, seed, validation)
    else:
        bm = _benchmark_from_arrays(entry, scenario, n_experiences, task_incremental, data_root, seed, validation,
                                    train_per_class, test_per_class)
    mode = "task-incremental" if task_incremental else ("class-incremental" if scenario == "split" else "domain-incremental")
    subset = f", {train_per_class} training images per class" if train_per_class is not None else ""
    subset += (f", {test_per_class} {'validation' if validation else 'test'} images per class"
               if test_per_class is not None else "")
    desc = f"{scenario} {dataset} ({n_experiences} experiences, {mode}{', validation split' if validation else ''}{subset})"
    return Stream(bm, entry.input_shape, n_classes, task_incremental, desc)


def stream_facts(stream) -> dict:
    """The setting, experiences and classes of a built ``Stream`` (what the runs actually saw).

    Task-incremental: task labels differ between experiences (or the stream says so);
    class-incremental: one shared head and pairwise disjoint class sets; otherwise
    domain-incremental (the same classes again, e.g. permuted inputs)."""
    train = list(stream.benchmark.train_stream)
    classes = [sorted(int(c) for c in experience.classes_in_this_experience) for experience in train]
    tasks = sorted({int(t) for experience in train for t in getattr(experience, "task_labels", [0])})
    seen: set = set()
    disjoint = True
    for group in classes:
        disjoint &= not (seen & set(group))
        seen |= set(group)
    if stream.task_incremental or len(tasks) > 1:
        setting = "task-incremental"
    else:
        setting = "class-incremental" if disjoint else "domain-incremental"
    return {"setting": setting, "experiences": len(train), "classes_per_experience": [len(c) for c in classes],
            "classes": len(seen), "task_labels": tasks}
