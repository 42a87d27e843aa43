"""CIFAR-10 / CIFAR-100 from torchvision's on-disk layout: a tiny dataset written in the same binary
format goes through the real loading code (nothing downloaded, ../shared never used)."""

import pickle

import numpy as np
import pytest
import torch

from avalanche_plugins.study.catalog.datasets import (
    CIFAR,
    data_fingerprint,
    load_cifar_arrays,
    make_stream,
)
from tests.cifar_fixture import write_fake_cifar


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    write_fake_cifar(root, "cifar10", n_train_per_class=6, n_test_per_class=3, seed=0)
    write_fake_cifar(root, "cifar100", n_train_per_class=3, n_test_per_class=2, seed=1)
    return root


def raw_images(root, kind, split="train"):
    """Independent decoding: bytes keys, the documented N x 3072 row-major CHW layout."""
    layout = CIFAR[kind]
    files = layout.train_files if split == "train" else layout.test_files
    xs, ys = [], []
    for name in files:
        with open(root / layout.folder / name, "rb") as f:
            entry = pickle.load(f, encoding="bytes")
        entry = {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()}  # Python 2 keys: bytes
        xs.append(np.frombuffer(entry["data"].tobytes(), dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.array(entry["labels" if kind == "cifar10" else "fine_labels"]))
    return np.concatenate(xs), np.concatenate(ys)


def denormalise(x, kind):
    layout = CIFAR[kind]
    mean, std = torch.tensor(layout.mean).view(3, 1, 1), torch.tensor(layout.std).view(3, 1, 1)
    return torch.round((x * std + mean) * 255).to(torch.uint8).numpy()


def test_written_files_are_torchvision_layout(root):
    for kind, files in (("cifar10", [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"]),
                        ("cifar100", ["train", "test", "meta"])):
        folder = root / CIFAR[kind].folder
        assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    with open(root / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    assert entry["data"].dtype == np.uint8 and entry["data"].shape == (12, 3072)  # 60 images over 5 files
    assert isinstance(entry["labels"], list)


@pytest.mark.parametrize("kind, n_train, n_test, n_classes", [("cifar10", 60, 30, 10), ("cifar100", 300, 200, 100)])
def test_arrays_round_trip_the_pickled_pixels(root, kind, n_train, n_test, n_classes):
    xtr, ytr, xte, yte = load_cifar_arrays(root, kind)
    assert xtr.shape == (n_train, 3, 32, 32) and xte.shape == (n_test, 3, 32, 32)
    assert xtr.dtype == torch.uint8 and ytr.dtype == torch.long
    for split, (x, y) in (("train", (xtr, ytr)), ("test", (xte, yte))):
        raw_x, raw_y = raw_images(root, kind, split)
        assert np.array_equal(x.numpy(), raw_x) and np.array_equal(y.numpy(), raw_y)
    assert sorted(set(ytr.tolist())) == list(range(n_classes))


@pytest.mark.parametrize("kind, n_exp", [("cifar10", 5), ("cifar100", 10)])
def test_class_incremental_split_holds_every_image_of_its_classes(root, kind, n_exp):
    stream = make_stream(kind, "split", n_experiences=n_exp, data_root=root, seed=3)
    n_classes = CIFAR[kind].n_classes
    assert (stream.input_shape, stream.n_classes, stream.task_incremental) == ((3, 32, 32), n_classes, False)
    assert len(stream.benchmark.train_stream) == n_exp
    raw_x, raw_y = raw_images(root, kind, "test")
    label_of = {img.tobytes(): int(c) for img, c in zip(raw_x, raw_y)}  # images are distinct
    seen_labels = set()
    for exp in stream.benchmark.test_stream:
        assert exp.task_label == 0
        assert len(exp.classes_in_this_experience) == n_classes // n_exp
        images, mapping = [], {}
        for x, y, t in exp.dataset:
            assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and t == 0
            img = denormalise(x, kind)
            images.append(img.tobytes())
            mapping.setdefault(int(y), set()).add(label_of[img.tobytes()])
        assert all(len(orig) == 1 for orig in mapping.values())  # one original class per label
        originals = {c for orig in mapping.values() for c in orig}
        expected = {img.tobytes() for img, c in zip(raw_x, raw_y) if c in originals}
        assert sorted(images) == sorted(expected)  # every test image of those classes, once
        assert sorted(mapping) == sorted(exp.classes_in_this_experience)
        seen_labels |= set(mapping)
    assert seen_labels == set(range(n_classes))  # one shared head: ids over the whole stream


def test_task_incremental_labels_tasks_and_restarts_class_ids(root):
    stream = make_stream("cifar100", "split", n_experiences=20, task_incremental=True, data_root=root)
    assert stream.n_classes == 5 and "task-incremental" in stream.description
    for i, exp in enumerate(stream.benchmark.train_stream):
        assert exp.task_label == i
        labels = {int(y) for _, y, _ in exp.dataset}
        assert labels == set(range(5)) and len(exp.dataset) == 5 * 3


@pytest.mark.parametrize("kind, mean, std", [("cifar10", (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
                                             ("cifar100", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))])
def test_normalisation_uses_the_usual_cifar_statistics(root, kind, mean, std):
    raw_x, _ = raw_images(root, kind, "test")
    raw = {img.tobytes(): img for img in raw_x}
    for x, _, _ in list(make_stream(kind, data_root=root).benchmark.test_stream[0].dataset)[:5]:
        img = torch.from_numpy(raw[denormalise(x, kind).tobytes()]).float() / 255
        expected = (img - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
        assert torch.allclose(x, expected, atol=1e-5)


def test_validation_split_comes_from_training_images(root):
    stream = make_stream("cifar10", data_root=root, validation=True)
    raw_train = {img.tobytes() for img in raw_images(root, "cifar10", "train")[0]}
    held = [denormalise(x, "cifar10").tobytes() for exp in stream.benchmark.test_stream for x, _, _ in exp.dataset]
    assert len(held) == 10 and set(held) <= raw_train  # 15 % of 6 per class, rounded: 1 per class
    assert sum(len(e.dataset) for e in stream.benchmark.train_stream) == 50


def test_bytes_keys_of_python2_pickles_are_read(tmp_path):
    folder = write_fake_cifar(tmp_path, "cifar10", n_train_per_class=1, n_test_per_class=2)
    before = load_cifar_arrays(tmp_path, "cifar10")
    with open(folder / "test_batch", "rb") as f:
        entry = pickle.load(f)
    with open(folder / "test_batch", "wb") as f:  # the keys as the original (Python 2) files hold them
        pickle.dump({k.encode(): v for k, v in entry.items()}, f)
    after = load_cifar_arrays(tmp_path, "cifar10")
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_missing_or_bad_data_names_data_root_and_folder(tmp_path, root):
    with pytest.raises(FileNotFoundError, match=r"--data-root.*cifar-10-batches-py/data_batch_1"):
        make_stream("cifar10", data_root=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"--data-root is required.*cifar-100-python"):
        make_stream("cifar100", data_root=None)
    with pytest.raises(ValueError, match="n_experiences.*divide 100"):
        make_stream("cifar100", n_experiences=7, data_root=root)
    with pytest.raises(ValueError, match="scenario must be 'split'"):
        make_stream("cifar10", "permuted", data_root=root)
    bad = tmp_path / "bad"
    folder = write_fake_cifar(bad, "cifar10", n_train_per_class=1, n_test_per_class=1)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({"data": np.zeros((10, 100), dtype=np.uint8), "labels": [0] * 10}, f)
    with pytest.raises(ValueError, match=r"test_batch.*N x 3072 uint8"):
        load_cifar_arrays(bad, "cifar10")
    with pytest.raises(ValueError, match="kind must be one of"):
        write_fake_cifar(tmp_path, "cifar1000")


def test_fingerprint_hashes_the_cifar_files(root, tmp_path):
    import hashlib

    fp = data_fingerprint(root, "cifar100")
    assert fp["name"] == "CIFAR-100" and set(fp["sha256"]) == {f"cifar-100-python/{f}" for f in ("train", "test", "meta")}
    assert fp["sha256"]["cifar-100-python/train"] == \
        hashlib.sha256((root / "cifar-100-python" / "train").read_bytes()).hexdigest()
    assert data_fingerprint(tmp_path, "cifar10")["sha256"]["cifar-10-batches-py/test_batch"] == "missing"
    assert data_fingerprint(root)["name"] == "MNIST"  # the default is unchanged
