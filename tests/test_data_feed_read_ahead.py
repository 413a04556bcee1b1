"""The feed's reading ahead (hetero_ray/runtime/data_feed.py), on a real Ray Data pipeline
read in this process: two ranks step through epochs as the loader asks, and every epoch
still gives every row once in the order a reading begun for it alone gives; one reading
at most is begun ahead; a restart that reads an epoch again gets the same rows; and
``close()`` leaves no Ray Data execution running."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.ray_data_jobs import features

pytestmark = pytest.mark.ray

NUM_ROWS, STEP, SHUFFLE, EPOCHS = 96, 16, 24, 3  # 6 steps an epoch; ranks take 10 and 6 rows


def _slow(batch: dict) -> dict:
    time.sleep(0.3)  # a reading lasts a second or more: one begun ahead is still running when the feed closes
    return batch


@pytest.fixture
def executions(monkeypatch) -> list:
    """Every Ray Data execution started in this process from now on (and Ray Data's limits
    refresh, which the feed sets, as it was after the test)."""
    from ray.data._internal.execution.resource_manager import ResourceManager
    from ray.data._internal.execution.streaming_executor import StreamingExecutor

    interval = ResourceManager.GLOBAL_LIMITS_UPDATE_INTERVAL_S
    monkeypatch.setattr(ResourceManager, "GLOBAL_LIMITS_UPDATE_INTERVAL_S", interval)

    started = []
    execute = StreamingExecutor.execute

    def recorded(self, *args, **kwargs):
        started.append(self)
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(StreamingExecutor, "execute", recorded)
    return started


def _running(executions: list) -> int:
    return sum(not e._shutdown for e in executions)


def _feed(ray, slow: bool = True):
    """A feed of NUM_ROWS rows; ``slow``: its readings last a second or more (:func:`_slow`)."""
    from hetero_ray.runtime.data_feed import DataFeed

    dataset = ray.data.range(NUM_ROWS, override_num_blocks=6).map_batches(features)
    return DataFeed(dataset.map_batches(_slow) if slow else dataset, "train", read_batch_size=10)


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    """A reading begun ahead starts its execution in the feed's thread, a moment later."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def _epoch(feed, epoch: int, executions: list, first_step: int = 0) -> list[int]:
    ids = []
    for start in range(first_step * STEP, NUM_ROWS, STEP):
        for rank, (lo, hi) in enumerate([(start, start + 10), (start + 10, start + STEP)]):
            rows = feed.rows(epoch, lo, hi, rank=rank, num_workers=2, shuffle_block=SHUFFLE, seed=3)
            ids.extend(rows["id"].tolist())
        assert _running(executions) <= 2, "more than the epoch's reading and one ahead"
    return ids


def test_read_ahead_keeps_every_epochs_rows_and_stops_at_close(ray_session, executions):
    alone = _feed(ray_session)  # each epoch the first reading of its feed: nothing read ahead
    expected = {epoch: alone.rows(epoch, 0, NUM_ROWS, rank=0, num_workers=1, shuffle_block=SHUFFLE,
                                  seed=3)["id"].tolist() for epoch in range(EPOCHS)}
    alone.close()
    assert expected[0] != expected[1] and sorted(expected[0]) == list(range(NUM_ROWS))

    feed = _feed(ray_session)
    feed.num_rows()
    before = len(executions)
    got = [_epoch(feed, epoch, executions) for epoch in range(EPOCHS)]
    assert got == [expected[epoch] for epoch in range(EPOCHS)]
    # One reading an epoch, each begun in the epoch before it, and one begun in the last
    # (its execution starts in the feed's thread: give it a moment)
    _wait_for(lambda: len(executions) - before >= EPOCHS + 1)
    assert len(executions) - before == EPOCHS + 1

    # A worker group restarted from a checkpoint mid-epoch reads that epoch again.
    again = _epoch(feed, EPOCHS - 1, executions, first_step=2)
    assert again == expected[EPOCHS - 1][2 * STEP:]
    # The run ends near an epoch's end, just after the next reading was begun.
    feed.rows(EPOCHS, 0, NUM_ROWS - 8, rank=0, num_workers=2, shuffle_block=SHUFFLE, seed=3)
    _wait_for(lambda: _running(executions) >= 1)
    assert _running(executions) >= 1
    feed.close()
    assert _running(executions) == 0
    assert np.all([e._shutdown for e in executions])


def test_one_reading_serves_a_steps_pieces_in_whatever_order_the_ranks_ask(ray_session, executions):
    """Rank 1's piece of a step comes after rank 0's in the window, but rank 1 may ask
    first: the reading begun for it keeps the window from its start, and rank 0's piece
    comes from it (not from a second reading of the whole epoch), at an epoch's start as
    at a restart mid-epoch."""
    feed = _feed(ray_session, slow=False)
    feed.num_rows()
    before = len(executions)
    for epoch, step in [(0, 0), (0, 1), (1, 3)]:  # epoch 1 begins at step 3: a restart from a checkpoint
        start = step * STEP
        late = feed.rows(epoch, start + 10, start + STEP, rank=1, num_workers=2, window_start=start)
        early = feed.rows(epoch, start, start + 10, rank=0, num_workers=2, window_start=start)
        assert early["id"].tolist() + late["id"].tolist() == list(range(start, start + STEP))
    assert len(executions) - before == 2, "one reading for each epoch"
    feed.close()
    _wait_for(lambda: _running(executions) == 0)
    assert _running(executions) == 0
