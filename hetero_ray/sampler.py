"""The global sampler: one seeded permutation per epoch, cut into per-rank pieces.

Step ``s`` of an epoch consumes positions ``[s·B, (s+1)·B)`` of that epoch's permutation;
the plan in force at step ``s`` cuts the window into contiguous pieces, rank ``i`` taking
the ``i``-th. The whole position in the epoch is the integer ``s``: it does not depend on
the number of ranks or on the split, so a plan may change at any step, the number of
ranks may change across a restart, and resuming needs only ``(epoch, step)``. Every rank
derives the same permutation from ``(seed, epoch)`` without communicating.

Exactly once follows: windows of consecutive steps tile the permutation, and the pieces
of one window tile the window (``Σ pieces = window``) whatever the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hetero_ray.planning.plan import Plan


@dataclass(frozen=True)
class Position:
    """Where training stands: the next step to run."""

    epoch: int
    step: int  # within the epoch
    global_step: int  # across epochs; the unit of checkpoints and plan changes

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step, "global_step": self.global_step}

    @classmethod
    def from_dict(cls, d: dict) -> "Position":
        return cls(int(d["epoch"]), int(d["step"]), int(d["global_step"]))


class GlobalSampler:
    """Sample indices for every (epoch, step, rank) of a run.

    Args:
        num_samples: size of the training set.
        global_batch_size: ``B``, the samples consumed by one step across all ranks.
        seed: with the epoch number, fixes the permutation.
        drop_last: drop the last window of an epoch when it is shorter than ``B``;
            otherwise it is cut by the same rule, scaled (:meth:`Plan.cut`).
        shuffle: a new seeded order every epoch; False keeps the dataset's order (the
            windows and their cut are the same rule either way).
    """

    def __init__(self, num_samples: int, global_batch_size: int, seed: int, drop_last: bool = False,
                 shuffle: bool = True):
        if num_samples < 1:
            raise ValueError(f"num_samples must be ≥ 1, got {num_samples}")
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be ≥ 1, got {global_batch_size}")
        if drop_last and num_samples < global_batch_size:
            raise ValueError(
                f"with drop_last, {num_samples} samples give no full batch of {global_batch_size}"
            )
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.drop_last = drop_last
        self.shuffle = shuffle
        self._cached_epoch: int | None = None
        self._cached_permutation: torch.Tensor | None = None

    @property
    def steps_per_epoch(self) -> int:
        if self.drop_last:
            return self.num_samples // self.global_batch_size
        return math.ceil(self.num_samples / self.global_batch_size)

    @property
    def samples_per_epoch(self) -> int:
        return min(self.num_samples, self.steps_per_epoch * self.global_batch_size)

    def permutation(self, epoch: int) -> torch.Tensor:
        """The epoch's order of sample indices; identical on every rank and every restart."""
        if self._cached_epoch != epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(_epoch_seed(self.seed, epoch))
                self._cached_permutation = torch.randperm(self.num_samples, generator=generator)
            else:
                self._cached_permutation = torch.arange(self.num_samples)
            self._cached_epoch = epoch
        return self._cached_permutation

    def window(self, step: int) -> tuple[int, int]:
        """Positions ``[start, stop)`` of the permutation that step ``step`` consumes."""
        if not 0 <= step < self.steps_per_epoch:
            raise IndexError(f"step {step} outside epoch of {self.steps_per_epoch} steps")
        start = step * self.global_batch_size
        return start, min(start + self.global_batch_size, self.num_samples)

    def window_size(self, step: int) -> int:
        start, stop = self.window(step)
        return stop - start

    def piece(self, step: int, plan: Plan, rank: int) -> tuple[int, int]:
        """Positions ``[start, stop)`` of the permutation that ``rank`` takes at ``step``."""
        if plan.global_batch_size != self.global_batch_size:
            raise ValueError(
                f"plan {plan} sums to {plan.global_batch_size}, sampler expects {self.global_batch_size}"
            )
        if not 0 <= rank < plan.num_workers:
            raise IndexError(f"rank {rank} outside plan of {plan.num_workers} ranks")
        start, stop = self.window(step)
        sizes = plan.cut(stop - start)
        offset = start + sum(sizes[:rank])
        return offset, offset + sizes[rank]

    def indices(self, epoch: int, step: int, plan: Plan, rank: int) -> torch.Tensor:
        """Sample indices of ``rank``'s local batch at ``(epoch, step)`` under ``plan``."""
        start, stop = self.piece(step, plan, rank)
        return self.permutation(epoch)[start:stop]

    def position_of(self, global_step: int) -> Position:
        """The position of a global step (every epoch has the same number of steps)."""
        epoch, step = divmod(global_step, self.steps_per_epoch)
        return Position(epoch, step, global_step)

    def next_position(self, position: Position) -> Position:
        """The position after running ``position``'s step."""
        if position.step + 1 < self.steps_per_epoch:
            return Position(position.epoch, position.step + 1, position.global_step + 1)
        return Position(position.epoch + 1, 0, position.global_step + 1)


def _epoch_seed(seed: int, epoch: int) -> int:
    # A fixed mix of seed and epoch; distinct (seed, epoch) pairs give distinct streams.
    return (seed * 1_000_003 + epoch * 7_919) % (2**63 - 1)
