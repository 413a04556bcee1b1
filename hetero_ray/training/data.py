"""Datasets held in memory, indexed by sample id.

The training loop draws sample indices from its own global sampler and gathers each
local batch with :meth:`DataSplit.batch`; there is no DataLoader, so "which samples did
rank i see at step s" is exactly the sampler's answer.

Synthetic datasets are generated from the seed alone, identically on every process and
every machine: only integer draws and uniform floats (exact on every CPU) feed plain
element-wise arithmetic, never a transcendental function whose last bit could differ
between an x86 and an ARM node. CIFAR is read from the python-pickle batches in
``--data-dir`` and kept as uint8; each batch is normalised when gathered, so four workers
on one node do not each hold 600 MB of floats.

The batch files are untrusted input (a shared folder, a copy from somewhere): by default
each must have the md5 that torchvision publishes for the official archive before it is
unpickled, and it is unpickled by a restricted unpickler that builds only what the format
holds (dicts, lists, strings, numbers, numpy arrays), so a planted pickle cannot run code.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import pickle
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch

try:
    from numpy._core.multiarray import _reconstruct as _np_reconstruct  # numpy >= 2
except ImportError:  # numpy 1
    from numpy.core.multiarray import _reconstruct as _np_reconstruct

from hetero_ray.config import DATASETS, FILE_DATASETS
from hetero_ray.errors import ConfigError, UserError

# synthetic_image: 10 classes of 3×32×32, like CIFAR-10, so every image model runs on it.
SYNTHETIC_IMAGE_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
# Each class is a fixed low-resolution pattern (upsampled by pixel repetition) plus
# per-pixel noise. The pattern is much weaker than the noise (0.08 vs 1), so with the
# default batch of 64 simple_cnn climbs from 10 % to ~95 % eval accuracy over ~200 steps
# (and mlp to ~85 %) instead of reaching 100 % within a few steps (as it does at 0.25).
_PROTOTYPE_RESOLUTION = 8
_PROTOTYPE_SCALE = 0.08
_NOISE_SCALE = 1.0

# synthetic_text: a byte-sized vocabulary and a context nanoGPT-style models handle on CPU.
SYNTHETIC_TEXT_VOCAB = 256
SYNTHETIC_TEXT_SEQ_LEN = 64
# A sparse Markov chain: each token is followed by one of 4 fixed successors chosen with
# probabilities 10/20, 5/20, 3/20, 2/20, so the best possible next-token accuracy is 50 %
# and a model that learns the chain gets visibly close to it.
_SUCCESSOR_THRESHOLDS = (10, 15, 18, 20)  # cumulative weights out of 20

# Per-channel statistics of the training sets (the usual published values).
_CIFAR_MEAN_STD = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


@dataclass(frozen=True)
class DataSpec:
    """What a model needs to know about the data."""

    kind: str  # "image" | "text"
    num_classes: int  # image: classes; text: vocabulary size
    input_shape: tuple  # image: (C, H, W); text: (seq_len,)

    def __post_init__(self):
        if self.kind not in ("image", "text"):
            raise ValueError(f"DataSpec.kind must be 'image' or 'text', got {self.kind!r}")

    @property
    def vocab_size(self) -> int:
        self._require("text", "vocab_size")
        return self.num_classes

    @property
    def seq_len(self) -> int:
        self._require("text", "seq_len")
        return self.input_shape[0]

    def _require(self, kind: str, what: str) -> None:
        if self.kind != kind:
            raise ValueError(f"DataSpec.{what} is defined for {kind} data, this spec is {self.kind}")


class DataSplit:
    """In-memory samples; :meth:`batch` gathers the samples at given indices.

    Args:
        inputs: one row per sample (float images, uint8 images or int64 tokens).
        targets: int64, one row per sample.
        transform: applied to each gathered input batch (e.g. uint8 → normalised float).
    """

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    ):
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
        self.inputs = inputs
        self.targets = targets
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def batch(self, indices: Union[torch.Tensor, Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of the samples at ``indices``, in that order."""
        indices = torch.as_tensor(indices, dtype=torch.long)
        inputs = self.inputs[indices]
        if self.transform is not None:
            inputs = self.transform(inputs)
        return inputs, self.targets[indices]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.batch([index])
        return inputs[0], targets[0]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """What a DataLoader fetches for a batch: one gather instead of one per sample
        (pair with :func:`as_batch` as its ``collate_fn``)."""
        return self.batch(indices)


def as_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``collate_fn`` for a :class:`DataSplit`: its ``__getitems__`` already made the batch."""
    return batch


@dataclass
class DatasetBundle:
    train: DataSplit
    eval: DataSplit
    spec: DataSpec
    name: str


def load_dataset(
    name: str,
    *,
    data_dir: Optional[str] = None,
    num_samples: int = 4096,
    eval_samples: int = 512,
    seed: int = 0,
    download: bool = False,
    verify_checksums: bool = True,
) -> DatasetBundle:
    """Loads or generates a dataset.

    Args:
        name: one of :data:`hetero_ray.config.DATASETS`.
        data_dir: folder holding the CIFAR batches (file datasets only).
        num_samples, eval_samples, seed: synthetic datasets only; CIFAR uses its own
            training and test sets whole.
        download: run :func:`download_dataset` first. Workers sharing a folder should
            not all do this at once; download once on the driver instead.
        verify_checksums: CIFAR files must have the published md5 sums (False: a copy
            you made and trust, e.g. a subset; they are still unpickled restrictedly).

    Raises:
        ConfigError: unknown name or non-positive sizes.
        UserError: CIFAR files missing, unreadable, malformed, not the published ones
            or holding anything but the format's types; the message says what to do.
    """
    _check_name(name)
    if name == "synthetic_image":
        _check_sizes(num_samples, eval_samples)
        return _synthetic_image(num_samples, eval_samples, seed)
    if name == "synthetic_text":
        _check_sizes(num_samples, eval_samples)
        return _synthetic_text(num_samples, eval_samples, seed)
    return _load_cifar(name, data_dir, download, verify_checksums)


def download_dataset(name: str, data_dir: Optional[str]) -> None:
    """Fetches CIFAR into ``data_dir`` unless an intact copy (torchvision's md5 sums) is there.

    Run it once per machine, on one process, before workers load from the folder: two
    processes downloading into one folder would overwrite each other's archive. Synthetic
    datasets need nothing.

    Raises:
        UserError: the folder is not writable or the download failed.
    """
    _check_name(name)
    if name not in FILE_DATASETS:
        return
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


def check_data_dir(name: str, data_dir: Optional[str], download: bool = False,
                   verify_checksums: bool = True) -> None:
    """Checks, before any work starts, that ``load_dataset`` will find its files.

    Without ``download`` every expected file is read as :func:`load_dataset` reads it:
    its published md5 checked (unless ``verify_checksums`` is False), unpickled
    restrictedly, and checked for the keys and shapes of the standard python-pickle
    batches. With ``download`` the folder only needs to be creatable; nothing is fetched
    or written here (that is :func:`download_dataset`'s job, after all checks have passed).

    Raises:
        UserError: naming the path, what was expected there and what to do.
    """
    _check_name(name)
    if name not in FILE_DATASETS:
        return  # synthetic: generated in memory, nothing on disk
    root = _require_data_dir(name, data_dir)
    if download:
        _check_download_target(name, root)
    else:
        _read_cifar(name, root, verify_checksums)


# --- synthetic datasets ---------------------------------------------------------------


def _generator(seed: int, stream: int) -> torch.Generator:
    """An independent generator per (seed, purpose): eval data does not move when
    ``num_samples`` changes, and no global RNG state is read or touched."""
    state = np.random.SeedSequence([seed, stream]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _centered_uniform(shape: tuple, generator: torch.Generator) -> torch.Tensor:
    """Uniform noise with mean 0 and variance 1: (u − ½)·√12."""
    return (torch.rand(shape, generator=generator) - 0.5) * math.sqrt(12.0)


def _synthetic_image(num_samples: int, eval_samples: int, seed: int) -> DatasetBundle:
    c, h, w = IMAGE_SHAPE
    r = _PROTOTYPE_RESOLUTION
    low_res = _centered_uniform((SYNTHETIC_IMAGE_CLASSES, c, r, r), _generator(seed, 0))
    prototypes = low_res.repeat_interleave(h // r, dim=2).repeat_interleave(w // r, dim=3)
    prototypes = prototypes * _PROTOTYPE_SCALE

    def split(n: int, stream: int) -> DataSplit:
        generator = _generator(seed, stream)
        labels = torch.randint(0, SYNTHETIC_IMAGE_CLASSES, (n,), generator=generator)
        noise = _centered_uniform((n, c, h, w), generator) * _NOISE_SCALE
        return DataSplit(prototypes[labels] + noise, labels)

    spec = DataSpec("image", SYNTHETIC_IMAGE_CLASSES, IMAGE_SHAPE)
    return DatasetBundle(split(num_samples, 1), split(eval_samples, 2), spec, "synthetic_image")


def _synthetic_text(num_samples: int, eval_samples: int, seed: int) -> DatasetBundle:
    vocab, seq_len = SYNTHETIC_TEXT_VOCAB, SYNTHETIC_TEXT_SEQ_LEN
    successors = torch.randint(0, vocab, (vocab, len(_SUCCESSOR_THRESHOLDS)), generator=_generator(seed, 0))
    thresholds = torch.tensor(_SUCCESSOR_THRESHOLDS)

    def split(n: int, stream: int) -> DataSplit:
        generator = _generator(seed, stream)
        tokens = torch.empty((n, seq_len + 1), dtype=torch.long)
        tokens[:, 0] = torch.randint(0, vocab, (n,), generator=generator)
        draws = torch.randint(0, int(thresholds[-1]), (n, seq_len), generator=generator)
        slots = torch.bucketize(draws, thresholds, right=True)  # draw d → first slot with d < threshold
        for t in range(seq_len):
            tokens[:, t + 1] = successors[tokens[:, t], slots[:, t]]
        # A sample is T+1 tokens; input and target are views of the same storage.
        return DataSplit(tokens[:, :-1], tokens[:, 1:])

    spec = DataSpec("text", vocab, (seq_len,))
    return DatasetBundle(split(num_samples, 1), split(eval_samples, 2), spec, "synthetic_text")


# --- CIFAR: the python-pickle batches, checked before anything in them is used ------------


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


def _load_cifar(name: str, data_dir: Optional[str], download: bool, verify_checksums: bool) -> DatasetBundle:
    if download:
        download_dataset(name, data_dir)
    root = _require_data_dir(name, data_dir)
    train, test = _read_cifar(name, root, verify_checksums)
    mean, std = _CIFAR_MEAN_STD[name]
    normalize = _Normalize(mean, std)
    spec = DataSpec("image", _LAYOUTS[name].num_classes, IMAGE_SHAPE)
    return DatasetBundle(_cifar_split(*train, normalize), _cifar_split(*test, normalize), spec, name)


def _cifar_split(images: np.ndarray, labels: np.ndarray, normalize: Callable) -> DataSplit:
    return DataSplit(torch.from_numpy(images), torch.from_numpy(labels), normalize)


class _Normalize:
    """uint8 (B, 3, H, W) → float32 ``(x/255 − mean) / std`` per channel."""

    def __init__(self, mean: tuple, std: tuple):
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


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise ConfigError(f"--dataset must be one of {', '.join(DATASETS)}; got {name!r}")


def _check_sizes(num_samples: int, eval_samples: int) -> None:
    for flag, value in (("--num-samples", num_samples), ("--eval-samples", eval_samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value!r}")
