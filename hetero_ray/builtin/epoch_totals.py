"""The built-in loop's running totals of the epoch in progress, on one rank: what the
epoch's row needs at its end — the train loss (``Σ loss·b / Σ b`` over all ranks' steps)
and the throughput (samples over training time, the time before a restart included).

Values, not a bag: each step, each gather and each epoch end gives new totals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional


@dataclass(frozen=True)
class EpochTotals:
    loss_sum: float = 0.0  # Σ loss·b over this rank's steps
    samples: int = 0  # Σ b over the same steps
    started: float = field(default_factory=time.time)  # wall time; shifted back by the time before a restart

    def plus(self, loss: Optional[float], local_batch_size: int) -> EpochTotals:
        """With one more step. A rank that held no sample of the step (loss None) ran a
        placeholder sample with weight 0, which counts for nothing."""
        if loss is None:
            return self
        return replace(self, loss_sum=self.loss_sum + loss * local_batch_size,
                       samples=self.samples + local_batch_size)

    def elapsed_s(self) -> float:
        return time.time() - self.started

    def to_checkpoint(self) -> dict:
        """The job checkpoint's entries (its ``extra``), under the names it has always had."""
        return {"epoch_loss_sum": self.loss_sum, "epoch_samples": self.samples, "epoch_elapsed_s": self.elapsed_s()}

    @classmethod
    def from_checkpoint(cls, extra: dict, *, with_sums: bool) -> EpochTotals:
        """The totals a checkpoint carried, the epoch's clock going on from its elapsed
        time. Only rank 0's checkpoint holds the sums (gathered there at save time), so
        every other rank starts from zero: ``with_sums`` on rank 0 only."""
        return cls(loss_sum=extra.get("epoch_loss_sum", 0.0) if with_sums else 0.0,
                   samples=extra.get("epoch_samples", 0) if with_sums else 0,
                   started=time.time() - extra.get("epoch_elapsed_s", 0.0))
