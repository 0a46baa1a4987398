"""Real image data read from local files only: CIFAR-100 (python archive), Fashion-MNIST, digits.

No network at run time. Every loader returns an :class:`ImageData` with the official train/test
partition; :func:`fit_validation_split` cuts the fitting and validation sets out of the training
images with a fixed permutation (CIFAR-100: 40,000/10,000; Fashion-MNIST: 50,000/10,000), and the
test images select nothing.
"""
from __future__ import annotations

import gzip
import os
import pickle
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

__all__ = ["ImageData", "FASHION_MNIST_DIR", "detect_dataset", "fit_validation_split",
           "load_cifar100", "load_dataset", "load_digits", "load_fashion_mnist"]

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True)
class ImageData:
    """One dataset's official partition.

    Attributes:
        name: dataset name recorded in every row (``"fashion-mnist"``, ``"cifar-100"``, ``"digits"``).
        train_x: uint8 ``(n_train, c, h, w)``; train_y: int64 ``(n_train,)``.
        test_x: uint8 ``(n_test, c, h, w)``; test_y: int64 ``(n_test,)``.
        num_classes: label count.
        source: the files read.
        note: a warning about how the data was chosen (e.g. the digits fallback), "" if none;
            runners print it and record it.
    """

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    source: str
    note: str = ""


def _read_idx(path: Path, magic: int) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        raw = fh.read()
    got = int.from_bytes(raw[:4], "big")
    if got != magic:
        raise ValueError(f"load_fashion_mnist: {path} has IDX magic {got}, expected {magic}. "
                         "Tip: reinstall the package dataset-fashion-mnist.")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"load_fashion_mnist: {path} holds {data.size} values, header says "
                         f"{shape}. Tip: the file is truncated; reinstall dataset-fashion-mnist.")
    return data.reshape(shape)


def load_fashion_mnist(root: str | os.PathLike = FASHION_MNIST_DIR) -> ImageData:
    """Fashion-MNIST from the IDX ``.gz`` files of the Debian package ``dataset-fashion-mnist``.

    Returns:
        60,000 train and 10,000 test 28×28 grayscale images ``(n, 1, 28, 28)``, 10 classes.

    Raises:
        FileNotFoundError: if a file is missing (tip: ``apt-get install dataset-fashion-mnist``).
    """
    root = Path(root)
    files = {k: root / f"{k}-ubyte.gz" for k in ("train-images-idx3", "train-labels-idx1",
                                                  "t10k-images-idx3", "t10k-labels-idx1")}
    for p in files.values():
        if not p.is_file():
            raise FileNotFoundError(f"load_fashion_mnist: {p} not found. Tip: apt-get install -y "
                                    "dataset-fashion-mnist (or `make data`).")
    tx = _read_idx(files["train-images-idx3"], 2051)[:, None]
    ty = _read_idx(files["train-labels-idx1"], 2049).astype(np.int64)
    vx = _read_idx(files["t10k-images-idx3"], 2051)[:, None]
    vy = _read_idx(files["t10k-labels-idx1"], 2049).astype(np.int64)
    return ImageData("fashion-mnist", np.ascontiguousarray(tx), ty, np.ascontiguousarray(vx), vy,
                     10, str(root))


def _unpickle(path: Path) -> dict:
    with open(path, "rb") as fh:
        return pickle.load(fh, encoding="bytes")


def load_cifar100(path: str | os.PathLike) -> ImageData:
    """The official CIFAR-100 python archive, extracted (folder ``cifar-100-python``).

    Args:
        path: the folder holding the pickle files ``train``, ``test`` and ``meta`` (each a dict
            with ``b'data'`` uint8 ``(n, 3072)`` and ``b'fine_labels'``), or its parent.

    Returns:
        uint8 images ``(n, 3, 32, 32)`` and the 100 fine labels.

    Raises:
        FileNotFoundError: if ``train``/``test`` are missing. ValueError: malformed arrays.
    """
    root = Path(path)
    if not (root / "train").is_file() and (root / "cifar-100-python" / "train").is_file():
        root = root / "cifar-100-python"
    parts = {}
    for split in ("train", "test"):
        f = root / split
        if not f.is_file():
            raise FileNotFoundError(f"load_cifar100: {f} not found. Tip: pass the extracted "
                                    "cifar-100-python folder (from cifar-100-python.tar.gz) as --data.")
        d = _unpickle(f)
        x = np.asarray(d[b"data"], dtype=np.uint8)
        y = np.asarray(d[b"fine_labels"], dtype=np.int64)
        if x.ndim != 2 or x.shape[1] != 3072 or len(y) != len(x):
            raise ValueError(f"load_cifar100: {f} has data {x.shape} and {len(y)} labels, expected "
                             "(n, 3072) and n. Tip: use the python (not binary) archive.")
        parts[split] = (x.reshape(-1, 3, 32, 32), y)
    classes = 100
    if (root / "meta").is_file():
        classes = len(_unpickle(root / "meta").get(b"fine_label_names", [None] * 100))
    return ImageData("cifar-100", parts["train"][0], parts["train"][1], parts["test"][0],
                     parts["test"][1], classes, str(root))


def load_digits() -> ImageData:
    """scikit-learn's 1,797 real 8×8 digits (last resort): a fixed 1,497/300 train/test cut."""
    from sklearn.datasets import load_digits as _ld

    d = _ld()
    x = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    y = d.target.astype(np.int64)
    return ImageData("digits", x[:1497], y[:1497], x[1497:], y[1497:], 10, "sklearn.datasets.load_digits")


_CIFAR100_FILES = ("train", "test", "meta")


def detect_dataset(path: str | os.PathLike) -> str | None:
    """Which dataset a ``--data`` folder holds, from its file names only (nothing is unpickled).

    Args:
        path: a folder.

    Returns:
        ``"cifar-100"`` if it (or its ``cifar-100-python`` subfolder) holds the python archive's
        ``train``, ``test`` and ``meta`` files; ``"fashion-mnist"`` if it holds the IDX file
        ``train-images-idx3-ubyte.gz``; else None.
    """
    root = Path(path)
    for folder in (root, root / "cifar-100-python"):
        if all((folder / f).is_file() for f in _CIFAR100_FILES):
            return "cifar-100"
    if (root / "train-images-idx3-ubyte.gz").is_file():
        return "fashion-mnist"
    return None


def load_dataset(name: str, data: str | os.PathLike | None = None) -> ImageData:
    """By name: ``"cifar-100"`` (needs ``data``), ``"fashion-mnist"`` or ``"digits"``.

    Args:
        name: dataset name.
        data: folder of the dataset's files; None: the Debian package's Fashion-MNIST files.

    Returns:
        The official partition. ``"fashion-mnist"`` without ``data`` falls back to scikit-learn's
        ``digits`` when the package files are absent: the returned ``name`` says ``"digits"`` and
        ``note`` carries a warning to print and record.

    Raises:
        FileNotFoundError: a named folder lacks the dataset's files (the message says when the
            folder holds the other dataset). ValueError: unknown name; cifar-100 without data.
    """
    if name == "cifar-100":
        if data is None:
            raise ValueError("load_dataset: cifar-100 needs --data PATH (the extracted "
                             "cifar-100-python folder). Tip: it is not downloadable here.")
        return load_cifar100(data)
    if name == "fashion-mnist":
        root = Path(data) if data is not None else FASHION_MNIST_DIR
        if not (root / "train-images-idx3-ubyte.gz").is_file():
            if data is None:
                return replace(load_digits(), note=(
                    f"load_dataset: Fashion-MNIST package files not found under {root}; fell back "
                    "to scikit-learn's 1,797 8x8 digits (results are not comparable to "
                    "Fashion-MNIST runs). Tip: apt-get install -y dataset-fashion-mnist."))
            if detect_dataset(root) == "cifar-100":
                raise FileNotFoundError(
                    f"load_dataset: {root} holds no Fashion-MNIST files, but this looks like "
                    "CIFAR-100 (train, test, meta pickles). Tip: add --dataset cifar-100.")
        return load_fashion_mnist(root)
    if name == "digits":
        return load_digits()
    raise ValueError(f"load_dataset: unknown dataset {name!r}; expected 'fashion-mnist', "
                     "'cifar-100' or 'digits'. Tip: see DATA.md.")


def fit_validation_split(n_train: int, n_validation: int, split_seed: int = 0
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Fixed fitting/validation index split of the training images.

    Args:
        n_train: training image count.
        n_validation: images held out for validation (10,000 for CIFAR-100 and Fashion-MNIST).
        split_seed: seed of the permutation; fixed so every run and method shares the split.

    Returns:
        ``(fit_idx, validation_idx)``: disjoint int64 arrays covering ``range(n_train)``, each in
        the fixed permutation's order (so a prefix is a random subset).
    """
    if not 0 < n_validation < n_train:
        raise ValueError(f"fit_validation_split: need 0 < n_validation < n_train, got "
                         f"{n_validation} and {n_train}. Tip: CIFAR-100 uses 10,000 of 50,000.")
    perm = np.random.default_rng(split_seed).permutation(n_train)
    return perm[n_validation:].astype(np.int64), perm[:n_validation].astype(np.int64)
