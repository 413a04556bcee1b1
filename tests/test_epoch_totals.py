"""The built-in loop's epoch totals are values: each step, restart and epoch end gives new
ones, and a checkpoint carries them under the names it always had."""

from __future__ import annotations

import time


from hetero_ray.builtin.epoch_totals import EpochTotals


def test_epoch_totals_add_each_step_weighted_by_its_local_batch():
    totals = EpochTotals(started=0.0)
    after = totals.plus(2.0, 3).plus(0.5, 4)
    assert (after.loss_sum, after.samples) == (8.0, 7)
    assert (totals.loss_sum, totals.samples) == (0.0, 0)  # a value: the old totals are unchanged


def test_a_step_without_samples_adds_nothing_to_the_epoch():
    totals = EpochTotals(loss_sum=1.0, samples=2)
    assert totals.plus(None, 1) == totals


def _between(value: float, low: float, high: float) -> bool:
    """``low ≤ value ≤ high`` but for the rounding of wall-clock subtractions."""
    return low - 1e-6 <= value <= high + 1e-6


def test_epoch_totals_come_back_from_a_checkpoint_with_the_clock_going_on():
    # The clock reads bracket each value: however slowly the lines run, it lies between them.
    saved = EpochTotals(loss_sum=6.0, samples=12, started=100.0)
    before = time.time()
    extra = saved.to_checkpoint()
    after = time.time()
    assert set(extra) == {"epoch_loss_sum", "epoch_samples", "epoch_elapsed_s"}
    assert _between(extra["epoch_elapsed_s"], before - 100.0, after - 100.0)

    restored_at = time.time()
    rank0 = EpochTotals.from_checkpoint(extra, with_sums=True)
    assert (rank0.loss_sum, rank0.samples) == (6.0, 12)
    assert _between(rank0.elapsed_s(), extra["epoch_elapsed_s"], extra["epoch_elapsed_s"] + time.time() - restored_at)
    restored_at = time.time()
    other = EpochTotals.from_checkpoint(extra, with_sums=False)  # the sums live on rank 0 alone
    assert (other.loss_sum, other.samples) == (0.0, 0)
    assert _between(other.elapsed_s(), extra["epoch_elapsed_s"], extra["epoch_elapsed_s"] + time.time() - restored_at)


def test_a_fresh_start_begins_the_epoch_from_zero_now():
    started_at = time.time()
    totals = EpochTotals.from_checkpoint({}, with_sums=True)
    assert (totals.loss_sum, totals.samples) == (0.0, 0)
    assert _between(totals.elapsed_s(), 0.0, time.time() - started_at)
