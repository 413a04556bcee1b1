"""CIFAR-10/100: the standard python-pickle batches in ``--data-dir``, checked, read and fetched.

The images are kept as uint8 and normalised when a batch is gathered (:class:`Normalize`),
so four workers on one node do not each hold 600 MB of floats.

The batch files are untrusted input (a shared folder, a copy from somewhere): by default
each must have the md5 that torchvision publishes for the official archive before it is
unpickled, and it is unpickled by a restricted unpickler that builds only what the format
holds (dicts, lists, strings, numbers, numpy arrays), so a planted pickle cannot run code.
:func:`hetero_ray.builtin.data.load_dataset` wraps what :func:`read` returns as a dataset.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import pickle
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

try:
    from numpy._core.multiarray import _reconstruct as _np_reconstruct  # numpy >= 2
except ImportError:  # numpy 1
    from numpy.core.multiarray import _reconstruct as _np_reconstruct

from hetero_ray.errors import UserError

IMAGE_SHAPE = (3, 32, 32)  # (C, H, W) of every image in the batches

# Per-channel statistics of the training sets (the usual published values).
_CIFAR_MEAN_STD = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


@dataclass(frozen=True)
class _CifarLayout:
    """Where and what the standard python-pickle batches are."""

    title: str  # as people write it
    folder: str  # inside --data-dir
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    label_key: str
    label_names_key: str
    num_classes: int
    archive: str  # what --download fetches


_LAYOUTS = {
    "cifar10": _CifarLayout(
        "CIFAR-10", "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",), "batches.meta", "labels", "label_names", 10, "cifar-10-python.tar.gz",
    ),
    "cifar100": _CifarLayout(
        "CIFAR-100", "cifar-100-python", ("train",), ("test",), "meta", "fine_labels",
        "fine_label_names", 100, "cifar-100-python.tar.gz",
    ),
}


def _torchvision_class(name: str):
    """torchvision's CIFAR class: the archive's address and the published md5 of every file."""
    from torchvision import datasets

    return datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100


def _published_md5(name: str) -> dict[str, str]:
    """File name → md5 of that file in the official archive (torchvision's values)."""
    cls = _torchvision_class(name)
    return {**dict(cls.train_list + cls.test_list), cls.meta["filename"]: cls.meta["md5"]}


def num_classes(name: str) -> int:
    return _LAYOUTS[name].num_classes


def read(name: str, data_dir: Optional[str], verify_checksums: bool = True
         ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``((train_images, train_labels), (test_images, test_labels))`` of the copy in ``data_dir``.

    Raises:
        UserError: files missing, unreadable, malformed, not the published ones (with
            ``verify_checksums``) or holding anything but the format's types.
    """
    return _read_cifar(name, _require_data_dir(name, data_dir), verify_checksums)


def check(name: str, data_dir: Optional[str], download: bool = False, verify_checksums: bool = True) -> None:
    """Without ``download``: every file reads as :func:`read` reads it. With ``download``:
    the folder can be created and written (nothing is fetched or written here).

    Raises:
        UserError: naming the path, what was expected there and what to do.
    """
    root = _require_data_dir(name, data_dir)
    if download:
        _check_download_target(name, root)
    else:
        _read_cifar(name, root, verify_checksums)


def fetch(name: str, data_dir: Optional[str]) -> None:
    """Fetches the archive into ``data_dir`` unless an intact copy (torchvision's md5 sums) is there.

    Raises:
        UserError: the folder is not writable or the download failed.
    """
    root = _require_data_dir(name, data_dir)
    _check_download_target(name, root)
    layout = _LAYOUTS[name]
    if _is_published_copy(name, root):
        return
    cls = _torchvision_class(name)
    try:
        from torchvision.datasets.utils import download_and_extract_archive

        # Checks the archive's published md5; each file in it is checked again when read.
        # Nothing is unpickled here (torchvision's CIFAR classes would, without restriction).
        download_and_extract_archive(cls.url, root, filename=cls.filename, md5=cls.tgz_md5)
    except Exception as exc:
        raise UserError(
            f"could not download {layout.title} into {root} ({type(exc).__name__}: {exc}); "
            f"{_fix_hint(layout, root, True)}"
        ) from exc


class Normalize:
    """uint8 (B, 3, H, W) → float32 ``(x/255 − mean) / std`` per channel, with the
    statistics of dataset ``name``'s training set."""

    def __init__(self, name: str):
        mean, std = _CIFAR_MEAN_STD[name]
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return (images.float() / 255.0 - self.mean) / self.std


# --- reading and checking the files -------------------------------------------------------

# The only globals the official batches name: numpy's array reconstruction (under its
# numpy 1 module name in the archives, numpy 2's in files re-pickled since), the array
# type and dtype. Pickles run code only by calling globals, so with these alone a batch
# file can build dicts, lists, strings, numbers and arrays, and nothing else.
_CIFAR_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class _ForbiddenGlobal(pickle.UnpicklingError):
    def __init__(self, module: str, name: str):
        self.global_name = f"{module}.{name}"
        super().__init__(f"global {self.global_name} is not allowed in a CIFAR batch")


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR batch and nothing else: any global outside :data:`_CIFAR_GLOBALS`
    (``os.system``, ``builtins.eval``, ...) is refused before it is imported."""

    def find_class(self, module: str, name: str):
        allowed = _CIFAR_GLOBALS.get((module, name))
        if allowed is None:
            raise _ForbiddenGlobal(module, name)
        return allowed


def _read_cifar(name: str, root: str, verify_checksums: bool) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Reads every file of the copy in ``root``, each checked before it is used.

    Each file is read once; with ``verify_checksums`` its md5 must be the published one
    before it is unpickled, and :class:`_CifarUnpickler` unpickles it.

    Returns:
        ``((train_images, train_labels), (test_images, test_labels))``: uint8 images of
        shape (N, 3, 32, 32) and int64 labels, in file order.

    Raises:
        UserError: naming the path, what is wrong there and what to do.
    """
    layout = _LAYOUTS[name]
    folder = _check_cifar_folder(layout, root)
    published = _published_md5(name) if verify_checksums else {}

    def content(filename: str) -> dict:
        return _unpickle(layout, os.path.join(folder, filename), published[filename] if verify_checksums else None)

    def split(filenames: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        batches = [_batch_arrays(layout, os.path.join(folder, f), content(f)) for f in filenames]
        images = np.concatenate([images for images, _ in batches]).reshape(-1, *IMAGE_SHAPE)
        return images, np.concatenate([labels for _, labels in batches])

    train, test = split(layout.train_files), split(layout.test_files)
    _check_meta(layout, os.path.join(folder, layout.meta_file), content(layout.meta_file))
    return train, test


def _check_cifar_folder(layout: _CifarLayout, root: str) -> str:
    """The batches' folder in ``root``, once it is there with every expected file."""
    folder = os.path.join(root, layout.folder)
    if not os.path.exists(root):
        raise UserError(f"--data-dir {root} does not exist; {_fix_hint(layout, root, False)}")
    if not os.path.isdir(root):
        raise UserError(f"--data-dir {root} is not a folder; {_fix_hint(layout, root, False)}")
    if not os.path.isdir(folder):
        raise UserError(
            f"--data-dir {root} has no {layout.folder} folder (the {layout.title} python-pickle batches); "
            f"{_fix_hint(layout, root, False)}"
        )
    expected = layout.train_files + layout.test_files + (layout.meta_file,)
    missing = [f for f in expected if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise UserError(
            f"{folder} lacks {', '.join(missing)} (expected {', '.join(expected)}); "
            f"the copy is incomplete: delete {folder} and pass --download to fetch it again"
        )
    return folder


def _unpickle(layout: _CifarLayout, path: str, expected_md5: Optional[str]) -> dict:
    """The dict in the file at ``path``; its md5 is checked first when ``expected_md5`` is given."""
    folder = os.path.dirname(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror}); check that file's permissions") from None
    if expected_md5 is not None:
        actual = hashlib.md5(raw, usedforsecurity=False).hexdigest()
        if actual != expected_md5:
            raise UserError(
                f"{path} is not the published {layout.title} file: its md5 is {actual}, the one in "
                f"{layout.archive} is {expected_md5}, so it was not unpickled. Delete {folder} and pass "
                "--download to fetch the original files, or, for a copy you made yourself and trust, pass "
                "--no-verify-checksums (verify_checksums=False in Python)"
            )
    # encoding="latin1", as torchvision reads the Python-2 pickles the archives contain.
    try:
        content = _CifarUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except _ForbiddenGlobal as exc:
        raise UserError(
            f"{path} refers to {exc.global_name}, which no {layout.title} file does: it was not loaded "
            f"and nothing in it ran. The file is not a genuine {layout.title} batch (it may have been "
            f"planted): delete {folder} and pass --download to fetch the original files"
        ) from None
    except Exception as exc:  # truncated (EOFError), garbage (UnpicklingError, ValueError, ...)
        raise UserError(
            f"{path} is not a readable {layout.title} batch ({type(exc).__name__}: {exc}); the file is "
            f"truncated or corrupt: delete {folder} and pass --download to fetch it again"
        ) from None
    if not isinstance(content, dict):
        raise _malformed(layout, path, f"it holds a {type(content).__name__}, expected a dict")
    return content


def _batch_arrays(layout: _CifarLayout, path: str, content: dict) -> tuple[np.ndarray, np.ndarray]:
    """A batch's images (uint8, one row of 3072 per image) and labels (int64), once checked."""
    for key in ("data", layout.label_key):
        if key not in content:
            keys = ", ".join(repr(k) for k in content)
            raise _malformed(layout, path, f"key {key!r} is missing (found {keys})")
    data, labels = content["data"], content[layout.label_key]
    row = math.prod(IMAGE_SHAPE)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != row:
        found = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise _malformed(layout, path, f"'data' is a {found}, expected uint8 of shape (N, {row})")
    if not isinstance(labels, (list, np.ndarray)):
        found = type(labels).__name__
        raise _malformed(layout, path, f"{layout.label_key!r} is a {found}, expected a list of integers")
    if len(labels) != len(data):
        raise _malformed(layout, path, f"{len(data)} images but {len(labels)} labels")
    label_array = np.asarray(labels)
    if label_array.size and (label_array.ndim != 1 or label_array.dtype.kind not in "iu"):
        raise _malformed(layout, path, f"{layout.label_key!r} must be a list of integers")
    if label_array.size and (label_array.min() < 0 or label_array.max() >= layout.num_classes):
        raise _malformed(layout, path, f"labels must lie in [0, {layout.num_classes - 1}]")
    return data, label_array.astype(np.int64)


def _check_meta(layout: _CifarLayout, path: str, content: dict) -> None:
    names = content.get(layout.label_names_key)
    if not isinstance(names, list) or len(names) != layout.num_classes:
        found = f"found {len(names)}" if isinstance(names, list) else "missing" if names is None else "not a list"
        raise _malformed(layout, path, f"{layout.label_names_key!r} must list {layout.num_classes} classes ({found})")


def _malformed(layout: _CifarLayout, path: str, what: str) -> UserError:
    return UserError(
        f"{path} is not a valid {layout.title} file: {what}; "
        f"delete {os.path.dirname(path)} and pass --download to fetch the original files"
    )


def _is_published_copy(name: str, root: str) -> bool:
    """Whether every file of the official archive is in ``root`` with its published md5."""
    folder = os.path.join(root, _LAYOUTS[name].folder)
    for filename, md5 in _published_md5(name).items():
        path = os.path.join(folder, filename)
        if not os.path.isfile(path):
            return False
        digest = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != md5:
            return False
    return True


def _check_download_target(name: str, root: str) -> None:
    if os.path.exists(root) and not os.path.isdir(root):
        raise UserError(f"--data-dir {root} is a file; --download needs a folder to put {_LAYOUTS[name].title} in")
    existing = root
    while not os.path.exists(existing):
        existing = os.path.dirname(existing) or "."
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(
            f"--download cannot write {_LAYOUTS[name].title} into --data-dir {root}: {existing} is not a "
            "writable folder; choose a --data-dir you can write to"
        )


def _fix_hint(layout: _CifarLayout, root: str, download: bool) -> str:
    if download:
        return (
            f"check that this machine can reach the internet, or fetch {layout.archive} yourself, "
            f"extract it into {root} and run without --download"
        )
    hint = f"pass --download to fetch it, or point --data-dir at the folder that contains {layout.folder}"
    if os.path.basename(os.path.normpath(root)) == layout.folder:
        hint += f" (that is {os.path.dirname(os.path.normpath(root)) or '.'}, the parent of the folder given)"
    return hint


def _require_data_dir(name: str, data_dir: Optional[str]) -> str:
    if not data_dir:
        raise UserError(
            f"--dataset {name} reads its files from --data-dir; pass the folder that holds "
            f"{_LAYOUTS[name].folder} (or should receive it, with --download)"
        )
    return os.path.abspath(os.path.expanduser(str(data_dir)))
