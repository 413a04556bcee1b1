"""The step recorder's wait before a checkpoint: every row recorded is in the store when it
returns, also when a periodic send is still in flight and nothing new is buffered."""

from __future__ import annotations

import os
import time

import pytest
import ray

from hetero_ray.training.rank.recorder import StepRecorder

pytestmark = pytest.mark.ray


@ray.remote
class _SlowStore:
    """Takes a while over each call, then marks the rows it holds in a file (seen without
    a call to the actor, which would queue behind the slow one)."""

    def __init__(self, marker: str):
        self._marker = marker
        self._rows = 0

    def add(self, steps, sample_ids):
        time.sleep(1.0)
        self._rows += len(steps)
        with open(self._marker, "w") as f:
            f.write(str(self._rows))


def test_close_waits_for_a_send_still_in_flight(ray_session, tmp_path):
    marker = str(tmp_path / "rows")
    store = _SlowStore.remote(marker)
    recorder = StepRecorder(store, flush_interval_s=0.0)
    recorder.record({"global_step": 9})  # sent at once: the buffer is empty afterwards
    recorder.record({"global_step": 10})

    recorder.close(timeout_s=60)

    assert os.path.exists(marker), "close() returned while the rows of the last send were not in the store"
    with open(marker) as f:
        assert f.read() == "2"


def test_close_without_rows_returns_at_once(ray_session, tmp_path):
    store = _SlowStore.remote(str(tmp_path / "rows"))
    StepRecorder(store, flush_interval_s=0.0).close(timeout_s=1)
