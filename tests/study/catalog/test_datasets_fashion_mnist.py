"""Fashion-MNIST (issue 39): the built-in dataset on tiny IDX files in torchvision's layout, and
``avalanche-study data fashion_mnist`` on fake package files (never the real data: the last test
checks the real Debian package only where it is installed)."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from avalanche_plugins.study.catalog import prepare as P
from avalanche_plugins.study.catalog.datasets import MNIST_FILES, data_fingerprint, make_stream
from avalanche_plugins.study.cli import run_command
from tests.study.catalog.test_datasets import exp_tensors, write_fake_idx, write_idx

FOLDER = "FashionMNIST/raw"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# the dataset


def test_split_and_permuted_streams_from_torchvision_layout(tmp_path):
    raw = write_fake_idx(tmp_path, FOLDER, n_train=200, n_test=50)
    stream = make_stream("fashion_mnist", "split", data_root=tmp_path, seed=1)
    assert stream.input_shape == (1, 28, 28) and stream.n_classes == 10
    assert [len(e.dataset) for e in stream.benchmark.train_stream] == [40] * 5
    classes = [sorted(e.classes_in_this_experience) for e in stream.benchmark.train_stream]
    assert sorted(c for pair in classes for c in pair) == list(range(10))
    # normalised with Fashion-MNIST's own statistics: (p - 0.2860) / 0.3530 of the file's bytes
    pixels = np.frombuffer((raw / "t10k-images-idx3-ubyte").read_bytes()[16:], dtype=np.uint8).reshape(50, 28, 28)
    x, _ = exp_tensors(make_stream("fashion_mnist", "permuted", n_experiences=2, data_root=tmp_path)
                       .benchmark.test_stream[0])
    expected = (torch.from_numpy(pixels.astype(np.float64)) / 255.0 - 0.2860) / 0.3530
    torch.testing.assert_close(x.squeeze(1).double(), expected, rtol=0, atol=1e-5)  # float32 arithmetic
    task = make_stream("fashion_mnist", "split", task_incremental=True, data_root=tmp_path)
    assert task.n_classes == 2 and all(sorted(e.classes_in_this_experience) == [0, 1]
                                       for e in task.benchmark.train_stream)
    val = make_stream("fashion_mnist", "split", data_root=tmp_path, validation=True)
    assert sum(len(e.dataset) for e in val.benchmark.test_stream) == 30  # 15 % of 200, stratified


def test_fewer_training_images_per_class(tmp_path):
    write_fake_idx(tmp_path, FOLDER, n_train=200, n_test=50)
    full = make_stream("fashion_mnist", "split", data_root=tmp_path, seed=2)
    cut = make_stream("fashion_mnist", "split", data_root=tmp_path, seed=2, train_per_class=5)
    assert "5 training images per class" in cut.description
    for whole, part in zip(full.benchmark.train_stream, cut.benchmark.train_stream):
        assert part.classes_in_this_experience == whole.classes_in_this_experience
        x, y = exp_tensors(part)
        assert torch.bincount(y).tolist()[min(y):] == [5, 5]
        wx, _ = exp_tensors(whole)
        assert (x.flatten(1)[:, None] == wx.flatten(1)[None]).all(-1).any(1).all()  # drawn from the experience
    assert [len(e.dataset) for e in cut.benchmark.test_stream] == [10] * 5  # the test stream stays whole
    again = make_stream("fashion_mnist", "split", data_root=tmp_path, seed=2, train_per_class=5)
    assert torch.equal(exp_tensors(again.benchmark.train_stream[0])[0], exp_tensors(cut.benchmark.train_stream[0])[0])
    val = make_stream("fashion_mnist", "split", data_root=tmp_path, validation=True, train_per_class=17)
    assert sum(len(e.dataset) for e in val.benchmark.test_stream) == 30
    with pytest.raises(ValueError, match="choose train_per_class <= 17"):  # 20 per class, 3 held out
        make_stream("fashion_mnist", "split", data_root=tmp_path, validation=True, train_per_class=18)
    with pytest.raises(ValueError, match="train_per_class must be an int >= 1"):
        make_stream("fashion_mnist", "split", data_root=tmp_path, train_per_class=0)


def test_fewer_evaluation_images_per_class_the_same_for_every_seed(tmp_path):
    write_fake_idx(tmp_path, FOLDER, n_train=200, n_test=50)
    cut = make_stream("fashion_mnist", "split", data_root=tmp_path, seed=2, test_per_class=3)
    assert "3 test images per class" in cut.description
    assert [len(e.dataset) for e in cut.benchmark.train_stream] == [40] * 5  # training stays whole
    other = make_stream("fashion_mnist", "split", data_root=tmp_path, seed=5, test_per_class=3)

    def test_images(stream):
        x = torch.cat([exp_tensors(e)[0] for e in stream.benchmark.test_stream])
        return sorted(map(tuple, x.flatten(1).tolist()))

    assert test_images(cut) == test_images(other)  # seed 2 and seed 5 score on the same 30 images
    for experience in cut.benchmark.test_stream:
        y = exp_tensors(experience)[1]
        assert sorted(torch.bincount(y).tolist()[min(y):]) == [3, 3]
    val = make_stream("fashion_mnist", "split", data_root=tmp_path, validation=True, test_per_class=2)
    assert sum(len(e.dataset) for e in val.benchmark.test_stream) == 20
    with pytest.raises(ValueError, match="choose test_per_class <= 5"):  # 50 test images, 5 per class
        make_stream("fashion_mnist", "split", data_root=tmp_path, test_per_class=6)


def test_the_study_takes_images_per_class_as_scenario_keys(tmp_path):
    from avalanche_plugins.study.api import load_study
    from avalanche_plugins.study.describe.config import ConfigError
    from avalanche_plugins.study.run.build import build_stream

    write_fake_idx(tmp_path, FOLDER, n_train=200, n_test=50)
    study = load_study({"scenarios": [{"benchmark": "split_fashion_mnist", "data_root": str(tmp_path),
                                       "train_per_class": 4, "test_per_class": 2}],
                        "model": {"name": "mlp", "kwargs": {"hidden": [8]}}, "strategies": ["Naive"]})
    scenario = study.scenarios[0]
    assert scenario.as_dict()["train_per_class"] == 4 and scenario.as_dict()["test_per_class"] == 2
    stream = build_stream(scenario, seed=0, validation=False)
    assert [len(e.dataset) for e in stream.benchmark.train_stream] == [8] * 5
    assert [len(e.dataset) for e in stream.benchmark.test_stream] == [4] * 5
    with pytest.raises(ConfigError, match="train_per_class"):
        load_study({"scenarios": [{"benchmark": "split_fashion_mnist", "train_per_class": 0}],
                    "model": "mlp", "strategies": ["Naive"]})


def test_missing_files_name_the_prepare_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"avalanche-study data fashion_mnist --data-root .*"):
        make_stream("fashion_mnist", data_root=tmp_path)
    with pytest.raises(FileNotFoundError, match="--data-root is required for Fashion-MNIST"):
        make_stream("fashion_mnist")


def test_results_json_records_the_files_sha256(tmp_path):
    root = tmp_path / "data"
    write_fake_idx(root, FOLDER, n_train=100, n_test=20)
    fingerprint = data_fingerprint(root, "fashion_mnist")
    assert fingerprint["name"] == "Fashion-MNIST"
    assert fingerprint["sha256"] == {f"{FOLDER}/{f}": _sha(root / FOLDER / f) for f in MNIST_FILES}
    # what run_study writes into results.json for the scenario (test_study_runner runs it end to end)
    from avalanche_plugins.study.api import load_study
    from avalanche_plugins.study.report.provenance import scenario_provenance

    study = load_study({"scenarios": [{"benchmark": "split_fashion_mnist", "data_root": str(root)}],
                        "model": {"name": "mlp", "kwargs": {"hidden": [8]}}, "strategies": ["Naive"]})
    entry = scenario_provenance(study.scenarios[0], None, dataset="fashion_mnist")
    assert entry["data"]["sha256"] == fingerprint["sha256"]


# ---------------------------------------------------------------------------------------------
# avalanche-study data fashion_mnist


def fake_package(folder: Path, n_train=20, n_test=10, seed=0) -> P.IdxDataset:
    """Four gzipped IDX files of a tiny balanced dataset in ``folder`` (as the Debian package
    installs them) and the spec :func:`prepare` verifies them against."""
    raw = write_fake_idx(folder / "made", "raw", n_train, n_test, seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in MNIST_FILES:
        with open(raw / f, "rb") as src, gzip.open(folder / f"{f}.gz", "wb") as out:
            shutil.copyfileobj(src, out)
    images = np.frombuffer((raw / "train-images-idx3-ubyte").read_bytes()[16:], dtype=np.uint8)
    return dataclasses.replace(P.FASHION_MNIST, sha256={f: _sha(raw / f) for f in MNIST_FILES}, n_train=n_train,
                               n_test=n_test, train_mean=float(images.mean() / 255.0),
                               package_dirs=(str(folder),))


def no_dpkg(package):
    return []


def test_prepare_decompresses_verifies_and_is_idempotent(tmp_path):
    spec = fake_package(tmp_path / "usr" / "share" / "datasets" / "fashion-mnist")
    root = tmp_path / "root"
    done = P.prepare("fashion_mnist", root, spec=spec, list_package=no_dpkg)
    assert sorted(done.wrote) == sorted(MNIST_FILES)
    for f in MNIST_FILES:
        assert (root / FOLDER / f).read_bytes() == (tmp_path / "usr/share/datasets/fashion-mnist/made/raw" / f).read_bytes()
    assert any("verified 20 train / 10 test images" in line and "2 / 1 per class" in line for line in done.lines)
    assert sum(line.startswith("wrote ") for line in done.lines) == 4
    stamp = {f: (root / FOLDER / f).stat().st_mtime_ns for f in MNIST_FILES}
    again = P.prepare("fashion_mnist", root, spec=spec, list_package=no_dpkg)
    assert again.wrote == [] and "already prepared" in again.lines[0]
    assert {f: (root / FOLDER / f).stat().st_mtime_ns for f in MNIST_FILES} == stamp
    (root / FOLDER / "t10k-labels-idx1-ubyte").write_bytes(b"damaged")
    fixed = P.prepare("fashion_mnist", root, spec=spec, list_package=no_dpkg)
    assert fixed.wrote == ["t10k-labels-idx1-ubyte"] and fixed.lines[0].startswith("replaced ")
    assert make_stream("fashion_mnist", "split", data_root=root).input_shape == (1, 28, 28)


def test_prepare_finds_the_files_dpkg_lists(tmp_path):
    spec = fake_package(tmp_path / "elsewhere")
    spec = dataclasses.replace(spec, package_dirs=(str(tmp_path / "not-installed"),))
    listing = ["/.", "/usr", str(tmp_path / "elsewhere"), str(tmp_path / "elsewhere" / "README.md.gz"),
               *(str(tmp_path / "elsewhere" / f"{f}.gz") for f in MNIST_FILES)]
    asked = []
    done = P.prepare("fashion_mnist", tmp_path / "root", spec=spec,
                     list_package=lambda package: asked.append(package) or listing)
    assert asked == ["dataset-fashion-mnist"] and len(done.wrote) == 4
    assert str(tmp_path / "elsewhere" / "train-images-idx3-ubyte.gz") in done.lines[0]


def test_without_the_package_it_says_how_to_get_the_data(tmp_path, capsys):
    spec = dataclasses.replace(P.FASHION_MNIST, package_dirs=(str(tmp_path / "absent"),))
    with pytest.raises(P.DataUnavailable) as caught:
        P.prepare("fashion_mnist", tmp_path / "root", spec=spec, list_package=no_dpkg)
    message = str(caught.value)
    assert "apt-get install dataset-fashion-mnist" in message and "download=True" in message
    assert "dpkg -L dataset-fashion-mnist" in message and not (tmp_path / "root").exists()
    with pytest.raises(SystemExit) as stopped:  # the command: non-zero, the same advice on stderr
        run_command(["data", "fashion_mnist", "--data-root", str(tmp_path / "root"), "--source", str(tmp_path)])
    assert stopped.value.code == 1
    assert "apt-get install dataset-fashion-mnist" in capsys.readouterr().err


def test_a_file_that_fails_verification_is_refused_and_not_written(tmp_path):
    spec = fake_package(tmp_path / "pkg")
    wrong = dataclasses.replace(spec, sha256={**spec.sha256, "train-labels-idx1-ubyte": "0" * 64})
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte.gz decompresses to a file of SHA-256"):
        P.prepare("fashion_mnist", tmp_path / "root", spec=wrong, list_package=no_dpkg)
    assert not (tmp_path / "root" / FOLDER / "train-labels-idx1-ubyte").exists()
    assert not [p for p in (tmp_path / "root" / FOLDER).iterdir() if p.name.startswith(".")]  # no temporary left
    with pytest.raises(ValueError, match="mean pixel"):
        P.prepare("fashion_mnist", tmp_path / "r2", spec=dataclasses.replace(spec, train_mean=0.9),
                  list_package=no_dpkg)
    with pytest.raises(ValueError, match="expected 40 images of"):
        P.verify_contents(dataclasses.replace(spec, n_train=40), tmp_path / "r2" / FOLDER)
    unbalanced = tmp_path / "unbalanced"
    write_fake_idx(unbalanced, "raw", 20, 10)
    write_idx(unbalanced / "raw" / "train-labels-idx1-ubyte", np.zeros(20), 0x801)
    with pytest.raises(ValueError, match="expected 2 images of each of 10 classes"):
        P.verify_contents(spec, unbalanced / "raw")


def test_the_command_prepares_from_a_source_folder(tmp_path, monkeypatch, capsys):
    spec = fake_package(tmp_path / "carried")
    monkeypatch.setitem(P.DATASETS, "fashion_mnist", spec)
    done = run_command(["data", "fashion_mnist", "--data-root", str(tmp_path / "root"),
                        "--source", str(tmp_path / "carried")])
    assert len(done.wrote) == 4 and "wrote " in capsys.readouterr().out
    run_command(["data", "fashion_mnist", "--data-root", str(tmp_path / "root")])  # prepared: no source needed
    assert "already prepared" in capsys.readouterr().out


def test_the_spec_matches_the_study_catalog():
    from avalanche_plugins.study.catalog.datasets import CATALOG, FASHION_MNIST_MEAN

    assert tuple(P.FASHION_MNIST.sha256) == MNIST_FILES
    assert CATALOG["fashion_mnist"].files == tuple(f"{P.FASHION_MNIST.folder}/{f}" for f in MNIST_FILES)
    assert abs(P.FASHION_MNIST.train_mean - FASHION_MNIST_MEAN) < 1e-4
    assert all(len(digest) == 64 for digest in P.FASHION_MNIST.sha256.values())


PACKAGE_FILES = [Path(d) / f"{f}.gz" for d in P.FASHION_MNIST.package_dirs for f in MNIST_FILES]


@pytest.mark.skipif(not all(p.is_file() for p in PACKAGE_FILES),
                    reason="the Debian package dataset-fashion-mnist is not installed (apt-get install "
                           "dataset-fashion-mnist); the fake-package tests above cover the command")
def test_the_real_package_matches_the_constants(tmp_path):
    done = P.prepare("fashion_mnist", tmp_path)
    assert len(done.wrote) == 4 and "6,000 / 1,000 per class" in done.lines[-1]
