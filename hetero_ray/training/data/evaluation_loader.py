"""An evaluation loader from ``hetero_ray.train.prepare_data_loader``: every sample once
across the ranks, with no plan, no step records and no collective.

Evaluation has no global batch to balance: each rank takes every ``num_workers``-th
sample of the epoch's order, starting at its rank, in batches of the loader's own size —
the split of torch's ``DistributedSampler`` (which Ray Train's ``prepare_data_loader``
adds), without its padding: ``DistributedSampler`` repeats samples so that every rank
gets as many, which counts them twice in an evaluation; here a rank may get one sample
fewer instead. Where the dataset divides evenly the two splits are the same, so a port
from Ray Train evaluates each rank on the very same samples.

Nothing here waits for another rank — except while the plan has left a rank out since
its last copy of rank 0's state: then every rank's ``iter()`` first gives every rank that
state (a collective, see :mod:`hetero_ray.training.rank.replica_state`), so that a rank left
out evaluates rank 0's model, not its own stale one. Iterate an evaluation loader on every
rank at the same point (as Ray Train's examples and the Hugging Face Trainer do); at an
epoch's end the copy has already been made, and nothing waits.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch

from hetero_ray.tensors import map_tensors


class RankShard(torch.utils.data.Sampler):
    """This rank's samples: positions ``rank, rank + n, rank + 2n, …`` of the epoch's order.

    The order is the dataset's, or with ``shuffle`` a permutation seeded by
    ``seed + epoch`` (``DistributedSampler``'s, so a port sees the same order);
    :meth:`set_epoch` changes the epoch as it does there.
    """

    def __init__(self, num_samples: int, rank: int, num_workers: int, *, shuffle: bool = False, seed: int = 0):
        self.num_samples, self.rank, self.num_workers = num_samples, rank, num_workers
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            order = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(self.num_samples)
        return iter(order[self.rank::self.num_workers].tolist())

    def __len__(self) -> int:
        return len(range(self.rank, self.num_samples, self.num_workers))


class EvaluationLoader:
    """Iterable over this rank's evaluation batches (a torch ``DataLoader`` over its
    :class:`RankShard`), moved to the rank's device.

    Attributes:
        sampler: the :class:`RankShard` (``loader.sampler.set_epoch(epoch)`` works as in
            Ray Train).
        dataset, batch_size: as for a ``DataLoader``.
    """

    def __init__(self, dataset, *, rank: int, num_workers: int, device: torch.device, batch_size: int,
                 shuffle: bool = False, seed: int = 0, collate_fn=None, loader_workers: int = 0,
                 pin_memory: bool = False, prefetch_factor: Optional[int] = None, drop_last: bool = False,
                 move_to_device: bool = True, worker_init_fn=None, before_iteration=None):
        self.dataset, self.batch_size = dataset, batch_size
        self._before_iteration = before_iteration
        self.sampler = RankShard(len(dataset), rank, num_workers, shuffle=shuffle, seed=seed)
        self._device = device if move_to_device else None
        self._dataloader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=self.sampler, collate_fn=collate_fn, num_workers=loader_workers,
            pin_memory=pin_memory and device.type == "cuda", prefetch_factor=prefetch_factor, drop_last=drop_last,
            worker_init_fn=worker_init_fn, persistent_workers=loader_workers > 0,
        )

    def __len__(self) -> int:
        """Batches this rank evaluates (``test_loss /= len(test_loader)`` as in Ray Train's examples)."""
        return len(self._dataloader)

    def __iter__(self) -> Iterator[Any]:
        if self._before_iteration is not None:
            self._before_iteration()
        device = self._device
        for batch in self._dataloader:
            yield batch if device is None else map_tensors(batch, lambda t: t.to(device, non_blocking=True))
