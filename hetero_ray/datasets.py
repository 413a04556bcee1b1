"""CIFAR-10 and CIFAR-100 as map-style datasets for your own ``train_loop_per_worker``.

The same files and checks as ``hetero-ray train --dataset cifar10``: the standard
python-pickle batches (``cifar-10-batches-py``, as in ``cifar-10-python.tar.gz``) read from a
folder, nothing downloaded, each file's published md5 checked unless told otherwise, and
unpickled restrictedly. Check the folder on the driver, so that a missing or wrong file
stops the run before any worker starts::

    from hetero_ray.datasets import CIFAR10

    CIFAR10.check(data_dir)                       # driver: a UserError saying what to do
    ...
    def train_loop_per_worker(config):
        dataset = CIFAR10(config["data_dir"])     # (image, label); image normalised per channel
        loader = hetero_ray.train.prepare_data_loader(dataset)
"""

from __future__ import annotations

import torch

__all__ = ["CIFAR10", "CIFAR100"]


class CIFAR10(torch.utils.data.Dataset):
    """CIFAR-10's training (or test) images, uint8 in memory, normalised per channel as
    they are read (``(x/255 − mean) / std`` with the dataset's channel statistics; no
    augmentation), each with its label.

    Args:
        data_dir: the folder that holds ``cifar-10-batches-py`` (``cifar-100-python`` for
            CIFAR-100), at this path on every node.
        train: the training set; False: the test set.
        verify_checksums: each file must have its published md5 (False: a copy you made
            and trust, e.g. a subset; ``--no-verify-checksums`` of ``hetero-ray train``).
            Either way the files are unpickled with only the format's types allowed.

    Raises:
        UserError: files missing, unreadable, malformed or not the published ones; the
            message says what to do.
    """

    name = "cifar10"  # hetero-ray train's --dataset

    def __init__(self, data_dir: str, train: bool = True, verify_checksums: bool = True):
        from hetero_ray.builtin.data import load_dataset

        bundle = load_dataset(self.name, data_dir=data_dir, verify_checksums=verify_checksums)
        self._split = bundle.train if train else bundle.eval
        self.num_classes = bundle.spec.num_classes

    @classmethod
    def check(cls, data_dir: str, verify_checksums: bool = True) -> None:
        """Reads every file as the dataset will (on the driver, before anything starts).

        Raises:
            UserError: naming the path, what was expected there and what to do.
        """
        from hetero_ray.builtin.data import check_data_dir

        check_data_dir(cls.name, data_dir, verify_checksums=verify_checksums)

    def __len__(self) -> int:
        return len(self._split)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self._split.batch([index])
        return images[0], labels[0]


class CIFAR100(CIFAR10):
    """CIFAR-100, as :class:`CIFAR10` (its folder holds ``cifar-100-python``)."""

    name = "cifar100"
