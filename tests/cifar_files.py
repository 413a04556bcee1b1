"""Small CIFAR-10 / CIFAR-100 folders in the exact format of the official archives.

The official files are Python 2 pickles: their keys and strings are Python 2 ``str``, which
Python 3 reads as ``str`` with ``encoding="latin1"`` (torchvision) and as ``bytes`` with
``encoding="bytes"`` (the snippet on the CIFAR web page, ``batch[b"data"]``). Python 3's
own pickler cannot write such strings, so :class:`_Py2Pickler` emits the Python 2
opcodes, and both readings work here as they do on the real files. Like the real files,
they name no global but numpy's ``numpy.core.multiarray._reconstruct``, ``numpy.ndarray``
and ``numpy.dtype`` (an array's raw bytes are a Python 2 ``str`` too, not a call to
``_codecs.encode`` as Python 3 would write them).
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path
from typing import Union

import numpy as np

CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR100_FOLDER = "cifar-100-python"
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_LABEL_NAMES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
_IMAGE_BYTES = 3 * 32 * 32  # one row: 1024 red, then 1024 green, then 1024 blue values
_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's array reconstruction function


class _Py2Str(bytes):
    """A Python 2 ``str``."""


class _Py2Pickler(pickle._Pickler):  # the pure-Python pickler, whose dispatch table is extensible
    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj: _Py2Str) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + bytes(obj))
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + bytes(obj))
        self.memoize(obj)

    dispatch[_Py2Str] = _save_py2_str
    dispatch[bytes] = _save_py2_str  # the raw data of arrays

    def save_global(self, obj, name=None) -> None:
        if obj is _RECONSTRUCT:  # under the module name Python 2's numpy wrote
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
        else:
            super().save_global(obj, name)


def _py2(value):
    """Turns every ``str`` (dict keys included) into a Python 2 ``str``."""
    if isinstance(value, str):
        return _Py2Str(value.encode("latin1"))
    if isinstance(value, dict):
        return {_py2(k): _py2(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_py2(v) for v in value]
    return value


def write_py2_pickle(path: Union[str, Path], obj) -> None:
    """Pickles ``obj`` as Python 2 did (protocol 2, ``str`` as byte strings)."""
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=2).dump(_py2(obj))


def _batch(batch_label: str, labels: dict, rng: np.random.RandomState, n: int, start: int) -> dict:
    return {
        "batch_label": batch_label,
        **labels,
        "data": rng.randint(0, 256, size=(n, _IMAGE_BYTES)).astype(np.uint8),
        "filenames": [f"image_{start + i:05d}.png" for i in range(n)],
    }


def write_cifar10(root: Union[str, Path], num_train: int = 250, num_test: int = 100, seed: int = 0) -> Path:
    """Writes ``root/cifar-10-batches-py`` with ``num_train`` images over the five training
    batches (as evenly as possible) and ``num_test`` in ``test_batch``; returns ``root``."""
    root = Path(root)
    folder = root / CIFAR10_FOLDER
    os.makedirs(folder, exist_ok=True)
    rng = np.random.RandomState(seed)
    sizes = [len(part) for part in np.array_split(np.arange(num_train), len(CIFAR10_TRAIN_FILES))]
    start = 0
    for i, (filename, n) in enumerate(zip(CIFAR10_TRAIN_FILES, sizes), start=1):
        labels = {"labels": [int(v) for v in rng.randint(0, 10, size=n)]}
        write_py2_pickle(folder / filename, _batch(f"training batch {i} of 5", labels, rng, n, start))
        start += n
    labels = {"labels": [int(v) for v in rng.randint(0, 10, size=num_test)]}
    write_py2_pickle(folder / "test_batch", _batch("testing batch 1 of 1", labels, rng, num_test, 0))
    meta = {"num_cases_per_batch": max(sizes), "label_names": list(CIFAR10_LABEL_NAMES), "num_vis": _IMAGE_BYTES}
    write_py2_pickle(folder / "batches.meta", meta)
    return root


def write_cifar100(root: Union[str, Path], num_train: int = 200, num_test: int = 100, seed: int = 0) -> Path:
    """Writes ``root/cifar-100-python`` (``train``, ``test``, ``meta``); returns ``root``."""
    root = Path(root)
    folder = root / CIFAR100_FOLDER
    os.makedirs(folder, exist_ok=True)
    rng = np.random.RandomState(seed)
    for filename, n, batch_label in (("train", num_train, "training batch 1 of 1"), ("test", num_test, "testing batch 1 of 1")):
        fine = rng.randint(0, 100, size=n)
        labels = {"fine_labels": [int(v) for v in fine], "coarse_labels": [int(v) // 5 for v in fine]}
        write_py2_pickle(folder / filename, _batch(batch_label, labels, rng, n, 0))
    meta = {
        "fine_label_names": [f"fine_{i:02d}" for i in range(100)],
        "coarse_label_names": [f"coarse_{i:02d}" for i in range(20)],
    }
    write_py2_pickle(folder / "meta", meta)
    return root


def read_batch(path: Union[str, Path], encoding: str = "latin1") -> dict:
    """Unpickles one batch file as torchvision does (or with ``encoding="bytes"``)."""
    with open(path, "rb") as f:
        return pickle.load(f, encoding=encoding)
