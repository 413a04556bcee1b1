"""The built-in loop's epoch totals are values: each step, restart and epoch end gives new
ones, and a checkpoint carries them under the names it always had."""

from __future__ import annotations

import pytest

from hetero_ray.training.epoch_totals import EpochTotals


def test_epoch_totals_add_each_step_weighted_by_its_local_batch():
    totals = EpochTotals(started=0.0)
    after = totals.plus(2.0, 3).plus(0.5, 4)
    assert (after.loss_sum, after.samples) == (8.0, 7)
    assert (totals.loss_sum, totals.samples) == (0.0, 0)  # a value: the old totals are unchanged


def test_a_step_without_samples_adds_nothing_to_the_epoch():
    totals = EpochTotals(loss_sum=1.0, samples=2)
    assert totals.plus(None, 1) == totals


def test_epoch_totals_come_back_from_a_checkpoint_with_the_clock_going_on():
    saved = EpochTotals(loss_sum=6.0, samples=12, started=100.0)
    extra = saved.to_checkpoint()
    assert set(extra) == {"epoch_loss_sum", "epoch_samples", "epoch_elapsed_s"}

    rank0 = EpochTotals.from_checkpoint(extra, with_sums=True)
    assert (rank0.loss_sum, rank0.samples) == (6.0, 12)
    assert rank0.elapsed_s() == pytest.approx(extra["epoch_elapsed_s"], abs=1.0)
    other = EpochTotals.from_checkpoint(extra, with_sums=False)  # the sums live on rank 0 alone
    assert (other.loss_sum, other.samples) == (0.0, 0)
    assert other.elapsed_s() == pytest.approx(extra["epoch_elapsed_s"], abs=1.0)


def test_a_fresh_start_begins_the_epoch_from_zero_now():
    totals = EpochTotals.from_checkpoint({}, with_sums=True)
    assert (totals.loss_sum, totals.samples) == (0.0, 0)
    assert 0.0 <= totals.elapsed_s() < 1.0
