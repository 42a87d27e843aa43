"""Data helpers: digits arrays, split/permuted streams, validation split, MNIST from a root."""

import struct

import numpy as np
import pytest
import torch

from avalanche_plugins.study.catalog.datasets import (
    check_mnist_root,
    data_fingerprint,
    load_digits_arrays,
    make_stream,
)


def exp_tensors(experience):
    ds = experience.dataset
    xs, ys = zip(*[(ds[i][0], int(ds[i][1])) for i in range(len(ds))])
    return torch.stack(xs), torch.tensor(ys)


def test_digits_arrays_are_standardised_and_stratified():
    xtr, ytr, xte, yte = load_digits_arrays(test_fraction=0.25, seed=0)
    assert xtr.shape[1:] == (1, 8, 8) and len(xtr) + len(xte) == 1797
    assert abs(float(xtr.mean())) < 1e-5 and abs(float(xtr.std()) - 1) < 1e-3
    frac = torch.bincount(yte, minlength=10) / torch.bincount(torch.cat([ytr, yte]), minlength=10)
    assert torch.all((frac > 0.2) & (frac < 0.3))


def test_split_class_incremental_partitions_classes():
    s = make_stream("digits", "split", n_experiences=5, seed=3)
    seen = []
    for exp in s.benchmark.train_stream:
        classes = sorted(exp.classes_in_this_experience)
        assert len(classes) == 2
        seen += classes
        assert exp.task_labels == [0]
    assert sorted(seen) == list(range(10)) and s.n_classes == 10


def test_split_task_incremental_relabels_from_zero():
    s = make_stream("digits", "split", n_experiences=5, task_incremental=True)
    assert s.n_classes == 2
    for t, exp in enumerate(s.benchmark.train_stream):
        assert exp.task_labels == [t]
        assert sorted(exp.classes_in_this_experience) == [0, 1]


def test_permuted_experiences_are_pixel_permutations():
    s = make_stream("digits", "permuted", n_experiences=3, seed=1)
    x0, y0 = exp_tensors(s.benchmark.test_stream[0])
    x2, y2 = exp_tensors(s.benchmark.test_stream[2])
    assert torch.equal(y0, y2)
    flat0, flat2 = x0.flatten(1), x2.flatten(1)
    assert not torch.equal(flat0, flat2)
    assert torch.equal(flat0.sort(dim=1).values, flat2.sort(dim=1).values)  # same pixels, moved


def test_validation_split_is_held_out_from_training_not_test():
    plain = make_stream("digits", "split", seed=0)
    val = make_stream("digits", "split", seed=0, validation=True)
    n_train = sum(len(e.dataset) for e in plain.benchmark.train_stream)
    n_val_train = sum(len(e.dataset) for e in val.benchmark.train_stream)
    n_val = sum(len(e.dataset) for e in val.benchmark.test_stream)
    assert n_val_train + n_val == n_train
    test_x, _ = exp_tensors(plain.benchmark.test_stream[0])
    val_x = torch.cat([exp_tensors(e)[0] for e in val.benchmark.test_stream])
    # no validation image is a test image
    assert not (torch.cdist(test_x.flatten(1), val_x.flatten(1)) < 1e-6).any()


def test_bad_arguments():
    with pytest.raises(ValueError, match="dataset"):
        make_stream("cifar")
    with pytest.raises(ValueError, match="scenario"):
        make_stream("digits", "rotated")
    with pytest.raises(ValueError, match="n_experiences"):
        make_stream("digits", "split", n_experiences=3)


def test_missing_mnist_names_data_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data-root"):
        make_stream("mnist", data_root=tmp_path)
    with pytest.raises(FileNotFoundError, match="--data-root is required"):
        check_mnist_root(None)


def write_idx(path, array, magic):
    """One IDX file (big-endian header: magic, then each dimension) of a ``uint8`` array."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(struct.pack(f">{1 + array.ndim}I", magic, *array.shape) + array.tobytes())


def write_fake_idx(root, folder="MNIST/raw", n_train=200, n_test=50, seed=0, n_classes=10):
    """Tiny MNIST-format files in torchvision's layout ``root/folder/{train,t10k}-{images,labels}-idx?-ubyte``:
    random 28×28 ``uint8`` images, labels cycling through the classes. Returns the folder."""
    rng = np.random.default_rng(seed)
    raw = root / folder
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), 0x803)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % n_classes, 0x801)
    return raw


def write_fake_mnist(root, n_train=200, n_test=50, seed=0):
    return write_fake_idx(root, "MNIST/raw", n_train, n_test, seed)


def test_mnist_from_root_classic_and_validation(tmp_path):
    write_fake_mnist(tmp_path)
    classic = make_stream("mnist", "split", data_root=tmp_path)
    assert classic.input_shape == (1, 28, 28)
    assert sum(len(e.dataset) for e in classic.benchmark.train_stream) == 200
    perm = make_stream("mnist", "permuted", n_experiences=2, data_root=tmp_path)
    assert len(perm.benchmark.test_stream[1].dataset) == 50
    val = make_stream("mnist", "split", data_root=tmp_path, validation=True)
    assert sum(len(e.dataset) for e in val.benchmark.test_stream) == 30  # 15% of 200, stratified


def test_data_fingerprint_hashes_the_mnist_files(tmp_path):
    import hashlib

    write_fake_mnist(tmp_path)
    fingerprint = data_fingerprint(tmp_path)
    image_file = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    assert fingerprint["name"] == "MNIST" and len(fingerprint["sha256"]) == 4
    assert fingerprint["sha256"]["MNIST/raw/train-images-idx3-ubyte"] == hashlib.sha256(image_file.read_bytes()).hexdigest()
    assert data_fingerprint(tmp_path / "elsewhere")["sha256"]["MNIST/raw/t10k-labels-idx1-ubyte"] == "missing"
    assert data_fingerprint(None)["name"] == "scikit-learn digits"
