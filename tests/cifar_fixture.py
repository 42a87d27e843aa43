"""A tiny CIFAR-10 / CIFAR-100 in torchvision's on-disk format, for offline tests and demos.

:func:`write_fake_cifar` writes the same files, keys and dtypes as the originals
(``cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}`` or
``cifar-100-python/{train,test,meta}``: pickles with ``data`` as ``N x 3072`` ``uint8`` in
row-major CHW order and ``labels`` / ``fine_labels`` (plus ``coarse_labels``) as lists), so
:func:`avalanche_plugins.study.catalog.datasets.load_cifar_arrays` and :func:`~avalanche_plugins.study.catalog.datasets.make_stream`
run their real loading code on it. Images are a per-class template plus noise, so a model can
learn them; MD5 sums differ from the originals (torchvision's own loader rejects the files).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from avalanche_plugins.study.catalog.datasets import CIFAR

__all__ = ["write_fake_cifar"]


def _images(labels: np.ndarray, templates: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    noise = rng.integers(0, 256, size=(len(labels), 3072))
    return (0.6 * templates[labels] + 0.4 * noise).astype(np.uint8)


def _labels(n_classes: int, per_class: int, rng: np.random.Generator) -> np.ndarray:
    labels = np.repeat(np.arange(n_classes), per_class)
    rng.shuffle(labels)
    return labels


def _dump(obj, path: Path) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)  # the originals are Python 2 pickles


def write_fake_cifar(root, kind: str = "cifar10", n_train_per_class: int = 10, n_test_per_class: int = 4,
                     seed: int = 0) -> Path:
    """Write a tiny ``kind`` (``"cifar10"`` or ``"cifar100"``) under ``root`` and return its folder.

    ``n_train_per_class`` / ``n_test_per_class`` images of every class (CIFAR-10's training
    images are spread over its five batch files); ``seed`` fixes images and order.

    Example:
        >>> import tempfile
        >>> from avalanche_plugins.study.catalog.datasets import load_cifar_arrays
        >>> with tempfile.TemporaryDirectory() as root:
        ...     folder = write_fake_cifar(root, "cifar100", n_train_per_class=2, n_test_per_class=1)
        ...     xtr, ytr, xte, yte = load_cifar_arrays(root, "cifar100")
        >>> folder.name, tuple(xtr.shape), tuple(xte.shape), int(ytr.max())
        ('cifar-100-python', (200, 3, 32, 32), (100, 3, 32, 32), 99)
    """
    if kind not in CIFAR:
        raise ValueError(f"kind must be one of {tuple(CIFAR)}, got {kind!r}")
    for name, value in (("n_train_per_class", n_train_per_class), ("n_test_per_class", n_test_per_class)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    layout = CIFAR[kind]
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, size=(layout.n_classes, 3072))
    folder = Path(root) / layout.folder
    folder.mkdir(parents=True, exist_ok=True)
    train_labels = _labels(layout.n_classes, n_train_per_class, rng)
    test_labels = _labels(layout.n_classes, n_test_per_class, rng)
    train_parts = np.array_split(np.arange(len(train_labels)), len(layout.train_files))
    for files, labels, parts in ((layout.train_files, train_labels, train_parts),
                                 (layout.test_files, test_labels, [np.arange(len(test_labels))])):
        for file, idx in zip(files, parts):
            entry = {"batch_label": f"fake {file}", "data": _images(labels[idx], templates, rng),
                     "filenames": [f"fake_{i}.png" for i in idx], layout.label_key: labels[idx].tolist()}
            if kind == "cifar100":
                entry["coarse_labels"] = (labels[idx] // 5).tolist()
            _dump(entry, folder / file)
    if kind == "cifar10":
        meta = {"label_names": [f"class_{c}" for c in range(10)], "num_cases_per_batch": len(train_parts[0]),
                "num_vis": 3072}
    else:
        meta = {"fine_label_names": [f"class_{c}" for c in range(100)],
                "coarse_label_names": [f"superclass_{c}" for c in range(20)]}
    _dump(meta, folder / layout.meta_file)
    return folder
