"""Dataset loaders of the dense-queue application: CIFAR-100 python archive, Fashion-MNIST IDX."""
from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest

from stateremat.paper.workloads import _datasets
from stateremat.paper.workloads._datasets import (
    FASHION_MNIST_DIR,
    detect_dataset,
    fit_validation_split,
    load_cifar100,
    load_dataset,
    load_fashion_mnist,
)


def _write_cifar100(root: Path, n_train: int, n_test: int, rng: np.random.Generator) -> dict:
    """A small archive in the official format: python-2 style pickles with bytes keys."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        fine = rng.integers(0, 100, size=n).tolist()
        d = {b"filenames": [f"img{i}.png".encode() for i in range(n)], b"batch_label": split.encode(),
             b"fine_labels": fine, b"coarse_labels": [f // 5 for f in fine], b"data": data}
        with open(folder / split, "wb") as fh:
            pickle.dump(d, fh, protocol=2)
        arrays[split] = (data, np.asarray(fine))
    with open(folder / "meta", "wb") as fh:
        pickle.dump({b"fine_label_names": [f"c{i}".encode() for i in range(100)],
                     b"coarse_label_names": [f"s{i}".encode() for i in range(20)]}, fh, protocol=2)
    return arrays


def test_cifar100_archive_round_trip(tmp_path):
    arrays = _write_cifar100(tmp_path, 50, 20, np.random.default_rng(0))
    for path in (tmp_path / "cifar-100-python", tmp_path):  # the folder or its parent
        d = load_cifar100(path)
        assert d.name == "cifar-100" and d.num_classes == 100
        assert d.train_x.shape == (50, 3, 32, 32) and d.test_x.shape == (20, 3, 32, 32)
        # channel-major rows: the first 1024 bytes of a row are the red plane
        np.testing.assert_array_equal(d.train_x[7, 0].ravel(), arrays["train"][0][7, :1024])
        np.testing.assert_array_equal(d.train_x[7, 2].ravel(), arrays["train"][0][7, 2048:])
        np.testing.assert_array_equal(d.test_y, arrays["test"][1])


def test_cifar100_missing_and_malformed(tmp_path):
    with pytest.raises(FileNotFoundError, match="cifar-100-python folder"):
        load_cifar100(tmp_path)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for split in ("train", "test"):
        with open(folder / split, "wb") as fh:
            pickle.dump({b"data": np.zeros((4, 100), np.uint8), b"fine_labels": [0] * 4}, fh)
    with pytest.raises(ValueError, match=r"expected \(n, 3072\)"):
        load_cifar100(folder)
    with pytest.raises(ValueError, match="needs --data"):
        load_dataset("cifar-100")


def _write_idx(path: Path, arr: np.ndarray, magic: int) -> None:
    header = magic.to_bytes(4, "big") + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + arr.astype(np.uint8).tobytes())


def test_fashion_mnist_idx_reader(tmp_path):
    rng = np.random.default_rng(1)
    tx, vx = rng.integers(0, 256, (30, 28, 28)), rng.integers(0, 256, (10, 28, 28))
    ty, vy = rng.integers(0, 10, 30), rng.integers(0, 10, 10)
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", tx, 2051)
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", ty, 2049)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", vx, 2051)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", vy, 2049)
    d = load_fashion_mnist(tmp_path)
    assert d.train_x.shape == (30, 1, 28, 28) and d.test_x.shape == (10, 1, 28, 28)
    np.testing.assert_array_equal(d.train_x[:, 0], tx)
    np.testing.assert_array_equal(d.test_y, vy)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", vy, 2051)  # wrong magic
    with pytest.raises(ValueError, match="IDX magic 2051, expected 2049"):
        load_fashion_mnist(tmp_path)
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path / "nowhere")


@pytest.mark.skipif(not (FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").is_file(),
                    reason="Debian package dataset-fashion-mnist not installed (make data)")
def test_fashion_mnist_package_files():
    d = load_dataset("fashion-mnist")
    assert d.name == "fashion-mnist"
    assert d.train_x.shape == (60_000, 1, 28, 28) and d.test_x.shape == (10_000, 1, 28, 28)
    assert np.bincount(d.test_y).tolist() == [1000] * 10  # the official balanced test set
    assert np.bincount(d.train_y).tolist() == [6000] * 10


def test_fit_validation_split_is_fixed_and_disjoint():
    fit, val = fit_validation_split(50_000, 10_000)
    assert len(fit) == 40_000 and len(val) == 10_000
    assert np.intersect1d(fit, val).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([fit, val])), np.arange(50_000))
    fit2, val2 = fit_validation_split(50_000, 10_000)
    np.testing.assert_array_equal(val, val2)
    with pytest.raises(ValueError, match="0 < n_validation < n_train"):
        fit_validation_split(10, 10)


def test_detect_dataset_from_file_names(tmp_path):
    _write_cifar100(tmp_path / "c", 4, 2, np.random.default_rng(3))
    assert detect_dataset(tmp_path / "c") == "cifar-100"                      # the parent
    assert detect_dataset(tmp_path / "c" / "cifar-100-python") == "cifar-100"
    (tmp_path / "c" / "cifar-100-python" / "meta").unlink()                 # meta is required
    assert detect_dataset(tmp_path / "c") is None
    (tmp_path / "f").mkdir()
    _write_idx(tmp_path / "f" / "train-images-idx3-ubyte.gz", np.zeros((1, 28, 28)), 2051)
    assert detect_dataset(tmp_path / "f") == "fashion-mnist"
    assert detect_dataset(tmp_path) is None


def test_fashion_mnist_name_on_a_cifar100_folder_says_so(tmp_path):
    _write_cifar100(tmp_path, 4, 2, np.random.default_rng(4))
    with pytest.raises(FileNotFoundError, match="looks like CIFAR-100.*add --dataset cifar-100"):
        load_dataset("fashion-mnist", tmp_path / "cifar-100-python")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):   # a plain empty folder
        load_dataset("fashion-mnist", tmp_path / "empty")


def test_digits_fallback_carries_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(_datasets, "FASHION_MNIST_DIR", tmp_path / "absent")
    d = load_dataset("fashion-mnist")
    assert d.name == "digits" and d.train_x.shape == (1497, 1, 8, 8)
    assert "Fashion-MNIST package files not found" in d.note and "apt-get install" in d.note
    assert load_dataset("digits").note == ""   # asked for by name: nothing to warn about
