"""``avalanche-study data NAME --data-root DIR``: put a dataset that a system package ships into
the torchvision layout the study reads, and verify it.

Fashion-MNIST (60,000 train / 10,000 test 28×28 grey images, 10 classes, MIT licence, © Zalando)
comes in the Debian package ``dataset-fashion-mnist`` as the four original IDX files, gzipped
(re-compressed by the packager, so their MD5 is not torchvision's and torchvision would try to
download them). :func:`prepare` finds the package's ``.gz`` files (``--source FOLDER``, else
``dpkg -L dataset-fashion-mnist``, else the package's install folder), decompresses them into
``DIR/FashionMNIST/raw/`` under torchvision's ``*-ubyte`` names, and verifies the decompressed
files: their SHA-256 against :data:`FASHION_MNIST`'s constants (computed once from the package's
files, which are the original data), their IDX headers and sizes, the balanced classes
(6,000 / 1,000 images per class) and the training images' mean pixel (0.2860). Files already
there and verified are left alone (the command is idempotent); a file there that fails the
check is replaced. Without the package it raises :class:`DataUnavailable`, saying how to get
the data.

Example (no package needed: a folder without the files is refused):
    >>> import tempfile
    >>> try:
    ...     prepare("fashion_mnist", tempfile.mkdtemp(), source=tempfile.mkdtemp())
    ... except DataUnavailable as error:
    ...     print(str(error).split(":")[0])
    Fashion-MNIST's package files were not found
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["DATASETS", "FASHION_MNIST", "DataUnavailable", "IdxDataset", "Prepared", "dpkg_files", "prepare"]

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IMAGES_MAGIC, LABELS_MAGIC = 0x803, 0x801


class DataUnavailable(FileNotFoundError):
    """The dataset's source files are not on this machine (the message says how to get them)."""


@dataclass(frozen=True)
class IdxDataset:
    """A dataset shipped as four gzipped IDX files by a system package, and what its
    decompressed files must be."""

    name: str  # the study's dataset name (``avalanche-study data NAME``)
    label: str
    folder: str  # under --data-root: torchvision's layout
    package: str  # the Debian package
    package_dirs: tuple[str, ...]  # where the package installs the .gz files
    sha256: Mapping[str, str]  # decompressed file -> SHA-256
    n_train: int
    n_test: int
    n_classes: int
    image_size: tuple[int, int]
    train_mean: float  # mean training pixel in [0, 1]
    torchvision_class: str  # the torchvision dataset whose download writes the same files


FASHION_MNIST = IdxDataset(
    name="fashion_mnist", label="Fashion-MNIST", folder="FashionMNIST/raw", package="dataset-fashion-mnist",
    package_dirs=("/usr/share/datasets/fashion-mnist",),
    sha256={  # of the decompressed files of dataset-fashion-mnist 0.0~git20200523.55506a9-1
        "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
    n_train=60_000, n_test=10_000, n_classes=10, image_size=(28, 28), train_mean=0.2860,
    torchvision_class="FashionMNIST",
)
DATASETS: dict[str, IdxDataset] = {FASHION_MNIST.name: FASHION_MNIST}
MEAN_TOLERANCE = 5e-4  # the train mean pixel is 0.28604; a different file set is far outside


@dataclass
class Prepared:
    """What :func:`prepare` did: ``lines`` to print, ``folder`` holding the files, ``wrote``
    the files it (re)wrote (empty: already prepared and verified), ``sha256`` of each file."""

    folder: Path
    wrote: list[str]
    sha256: dict[str, str]
    lines: list[str]


def dpkg_files(package: str) -> list[str]:
    """The paths ``dpkg -L package`` lists (empty without dpkg or without the package)."""
    try:
        done = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    return done.stdout.split("\n") if done.returncode == 0 else []


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _how_to_get(spec: IdxDataset, data_root: Path) -> str:
    return (f"get them with `apt-get install {spec.package}` (Debian/Ubuntu; then rerun "
            f"`avalanche-study data {spec.name} --data-root {data_root}`), or pass --source FOLDER holding the "
            f"four .gz files ({', '.join(f + '.gz' for f in spec.sha256)}), or, where a network exists, with "
            f"torchvision's download: python -c \"from torchvision.datasets import {spec.torchvision_class}; "
            f"{spec.torchvision_class}('{data_root}', download=True)\" (it writes the same "
            f"{spec.folder}/ files; this command then verifies them)")


def find_sources(spec: IdxDataset, source=None, list_package: Callable[[str], list[str]] = dpkg_files) -> dict:
    """``{decompressed name: .gz path}`` from ``source`` if given, else from the package's file
    list, else from its install folders; ``{}`` where a file is missing in each place."""
    gz = {f"{name}.gz": name for name in spec.sha256}
    if source is not None:
        candidates = [Path(source) / g for g in gz]
    else:
        listed = [Path(p) for p in list_package(spec.package) if Path(p).name in gz]
        candidates = listed or [Path(d) / g for d in spec.package_dirs for g in gz]
    found = {}
    for path in candidates:
        if path.is_file():
            found.setdefault(gz[path.name], path)
    return found if len(found) == len(gz) else {}


def _read_idx(path: Path, magic: int, dims: int) -> np.ndarray:
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(4 * (dims + 1)), dtype=">u4")
        if len(header) != dims + 1 or int(header[0]) != magic:
            raise ValueError(f"{path}: not an IDX file of magic {magic:#x} ({dims} dimensions)")
        data = np.frombuffer(f.read(), dtype=np.uint8)
    shape = tuple(int(n) for n in header[1:])
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: the header says {shape} ({int(np.prod(shape))} bytes), the file holds {data.size}")
    return data.reshape(shape)


def verify_contents(spec: IdxDataset, folder: Path) -> str:
    """Check the decompressed files' headers, sizes, class balance and training mean pixel;
    ``ValueError`` naming the first that is off, else one line saying what was checked."""
    stats = {}
    for split, n in (("train", spec.n_train), ("t10k", spec.n_test)):
        images = _read_idx(folder / f"{split}-images-idx3-ubyte", IMAGES_MAGIC, 3)
        labels = _read_idx(folder / f"{split}-labels-idx1-ubyte", LABELS_MAGIC, 1)
        if images.shape != (n, *spec.image_size) or labels.shape != (n,):
            raise ValueError(f"{spec.label} {split}: expected {n} images of {spec.image_size} and {n} labels, "
                             f"got images {images.shape} and labels {labels.shape}")
        counts = np.bincount(labels, minlength=spec.n_classes)
        if len(counts) != spec.n_classes or not (counts == n // spec.n_classes).all():
            raise ValueError(f"{spec.label} {split}: expected {n // spec.n_classes} images of each of "
                             f"{spec.n_classes} classes, got {counts.tolist()}")
        stats[split] = images.mean(dtype=np.float64) / 255.0
    if abs(stats["train"] - spec.train_mean) > MEAN_TOLERANCE:
        raise ValueError(f"{spec.label}: the training images' mean pixel is {stats['train']:.4f}, expected "
                         f"{spec.train_mean:.4f}")
    return (f"verified {spec.n_train:,} train / {spec.n_test:,} test images of {spec.image_size[0]}×"
            f"{spec.image_size[1]}, {spec.n_train // spec.n_classes:,} / {spec.n_test // spec.n_classes:,} "
            f"per class, train mean pixel {stats['train']:.4f}")


def _decompress(gz_path: Path, target: Path, expected: str, package: str) -> str:
    """Decompress ``gz_path`` next to ``target`` and move it there only if its SHA-256 is ``expected``."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(gz_path, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
        got = _sha256(Path(tmp))
        if got != expected:
            raise ValueError(f"{gz_path} decompresses to a file of SHA-256 {got}, expected {expected} "
                             f"(a damaged or different file: reinstall the package, e.g. "
                             f"`apt-get install --reinstall {package}`, or use another --source)")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 -> what a plain open() would have given
        os.replace(tmp, target)
        return got
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def prepare(name: str, data_root, *, source=None, spec: IdxDataset | None = None,
            list_package: Callable[[str], list[str]] = dpkg_files) -> Prepared:
    """Prepare and verify dataset ``name`` under ``data_root`` (see the module docstring).

    ``source``: a folder holding the ``.gz`` files instead of the package's; ``spec`` and
    ``list_package`` (``dpkg -L``) are injectable for tests. Raises :class:`DataUnavailable` when
    a file is neither prepared nor findable, ``ValueError`` when a file fails verification.
    """
    if spec is None:
        if name not in DATASETS:
            raise ValueError(f"avalanche-study data prepares {', '.join(DATASETS)}, got {name!r}")
        spec = DATASETS[name]
    root = Path(data_root)
    folder = root / spec.folder
    present = {f: _sha256(folder / f) for f in spec.sha256 if (folder / f).is_file()}
    stale = [f for f in spec.sha256 if present.get(f) != spec.sha256[f]]
    lines, wrote = [], []
    if stale:
        sources = find_sources(spec, source, list_package)
        if not sources:
            where = f"--source {source}" if source is not None else (
                f"no Debian package {spec.package} (`dpkg -L {spec.package}` lists none of them) and nothing in "
                f"{', '.join(spec.package_dirs)}")
            raise DataUnavailable(f"{spec.label}'s package files were not found: {where}; {_how_to_get(spec, root)}")
        folder.mkdir(parents=True, exist_ok=True)
        for f in stale:
            what = "replaced (it failed its SHA-256 check)" if f in present else "wrote"
            present[f] = _decompress(sources[f], folder / f, spec.sha256[f], spec.package)
            wrote.append(f)
            lines.append(f"{what} {folder / f} from {sources[f]} ({(folder / f).stat().st_size:,} bytes, "
                         f"SHA-256 {spec.sha256[f][:16]}… verified)")
    check = verify_contents(spec, folder)
    if not wrote:
        lines.append(f"{spec.label} is already prepared in {folder}: the SHA-256 of all {len(spec.sha256)} files "
                     "verified; nothing written")
    lines.append(f"{check}; the study reads it with --data-root {root} (scenarios split_{spec.name}, "
                 f"permuted_{spec.name})")
    return Prepared(folder, wrote, present, lines)
