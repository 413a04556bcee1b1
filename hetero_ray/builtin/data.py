"""Datasets held in memory, indexed by sample id, and the factory that makes one by name.

The training loop draws sample indices from its own global sampler and gathers each
local batch with :meth:`DataSplit.batch`; there is no DataLoader, so "which samples did
rank i see at step s" is exactly the sampler's answer.

:func:`load_dataset`, :func:`check_data_dir` and :func:`download_dataset` take a name of
:data:`hetero_ray.builtin.config.DATASETS`: the synthetic ones are generated from the seed by
:mod:`hetero_ray.builtin.synthetic`, CIFAR is read from ``--data-dir`` by
:mod:`hetero_ray.builtin.cifar` (files checked before they are unpickled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch

from hetero_ray.builtin import cifar, synthetic
from hetero_ray.builtin.cifar import IMAGE_SHAPE
from hetero_ray.builtin.config import DATASETS, FILE_DATASETS
from hetero_ray.builtin.synthetic import SYNTHETIC_IMAGE_CLASSES, SYNTHETIC_TEXT_SEQ_LEN, SYNTHETIC_TEXT_VOCAB
from hetero_ray.errors import ConfigError


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


def spec_for(model: str, dataset: Optional[str] = None) -> DataSpec:
    """What ``model`` is fed when no dataset is loaded (the profiler's probe, a checkpoint's
    model rebuilt): synthetic shapes of ``dataset``, the text shape for a text model."""
    from hetero_ray.builtin.config import TEXT_MODELS

    if model in TEXT_MODELS:
        return DataSpec("text", SYNTHETIC_TEXT_VOCAB, (SYNTHETIC_TEXT_SEQ_LEN,))
    classes = 100 if dataset == "cifar100" else SYNTHETIC_IMAGE_CLASSES
    return DataSpec("image", classes, IMAGE_SHAPE)


def random_batch(spec: DataSpec, batch_size: int, generator: Optional[torch.Generator] = None,
                 device: Optional[torch.device] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A random batch shaped like the data (inputs, targets); on the host unless ``device``."""
    shape = (batch_size, *spec.input_shape)
    if spec.kind == "text":
        return (torch.randint(0, spec.num_classes, shape, generator=generator, device=device),
                torch.randint(0, spec.num_classes, shape, generator=generator, device=device))
    return (torch.randn(shape, generator=generator, device=device),
            torch.randint(0, spec.num_classes, (batch_size,), generator=generator, device=device))


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
        name: one of :data:`hetero_ray.builtin.config.DATASETS`.
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
        train, evaluation = synthetic.image_samples(num_samples, eval_samples, seed)
        spec = DataSpec("image", SYNTHETIC_IMAGE_CLASSES, IMAGE_SHAPE)
        return DatasetBundle(DataSplit(*train), DataSplit(*evaluation), spec, name)
    if name == "synthetic_text":
        _check_sizes(num_samples, eval_samples)
        train, evaluation = synthetic.text_samples(num_samples, eval_samples, seed)
        spec = DataSpec("text", SYNTHETIC_TEXT_VOCAB, (SYNTHETIC_TEXT_SEQ_LEN,))
        return DatasetBundle(DataSplit(*train), DataSplit(*evaluation), spec, name)
    if download:
        download_dataset(name, data_dir)
    (train_images, train_labels), (test_images, test_labels) = cifar.read(name, data_dir, verify_checksums)
    normalize = cifar.Normalize(name)
    spec = DataSpec("image", cifar.num_classes(name), IMAGE_SHAPE)
    return DatasetBundle(DataSplit(torch.from_numpy(train_images), torch.from_numpy(train_labels), normalize),
                         DataSplit(torch.from_numpy(test_images), torch.from_numpy(test_labels), normalize),
                         spec, name)


def download_dataset(name: str, data_dir: Optional[str]) -> None:
    """Fetches CIFAR into ``data_dir`` unless an intact copy (torchvision's md5 sums) is there.

    Run it once per machine, on one process, before workers load from the folder: two
    processes downloading into one folder would overwrite each other's archive. Synthetic
    datasets need nothing.

    Raises:
        UserError: the folder is not writable or the download failed.
    """
    _check_name(name)
    if name in FILE_DATASETS:
        cifar.fetch(name, data_dir)


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
    if name in FILE_DATASETS:  # synthetic: generated in memory, nothing on disk
        cifar.check(name, data_dir, download, verify_checksums)


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise ConfigError(f"--dataset must be one of {', '.join(DATASETS)}; got {name!r}")


def _check_sizes(num_samples: int, eval_samples: int) -> None:
    for flag, value in (("--num-samples", num_samples), ("--eval-samples", eval_samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value!r}")
