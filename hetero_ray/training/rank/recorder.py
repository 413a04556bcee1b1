"""Sends a rank's records to the metrics store: batched, fire-and-forget.

A remote call per step and rank would cost more than small steps themselves; records are
buffered and sent at most every ``flush_interval_s``. Training never waits for the
store, except where a later event must find every row there (:meth:`close`: before a
checkpoint is reported, and at the end).
"""

from __future__ import annotations

import time
from typing import Optional

from hetero_ray.training.rank.answers import answer


class StepRecorder:
    def __init__(self, store, flush_interval_s: float, extra_sinks: Optional[list] = None):
        self._store = store
        self._sinks = extra_sinks or []  # e.g. the planner, fed the same step rows
        self._flush_interval_s = flush_interval_s
        self._steps: list[dict] = []
        self._sample_ids: list[dict] = []
        self._last_send = time.monotonic()
        self._last_sent = None  # the store call of the last send, perhaps still in flight

    def record(self, step_row: dict, sample_ids: Optional[dict] = None) -> None:
        self._steps.append(step_row)
        if sample_ids is not None:
            self._sample_ids.append(sample_ids)
        if time.monotonic() - self._last_send >= self._flush_interval_s:
            self.send()

    def send(self):
        """Sends what is buffered; returns the store call's reference (or None)."""
        self._last_send = time.monotonic()
        if not self._steps and not self._sample_ids:
            return None
        steps, sample_ids = self._steps, self._sample_ids
        self._steps, self._sample_ids = [], []
        for sink in self._sinks:
            sink.add_steps.remote(steps)
        self._last_sent = self._store.add.remote(steps=steps, sample_ids=sample_ids)
        return self._last_sent

    def close(self, timeout_s: float = 30.0) -> None:
        """Returns once every row recorded so far is in the store. It waits for the last
        call sent, even with nothing new buffered: a periodic send can still be in flight,
        and another caller's call (rank 0's "checkpoint reached") may overtake it, since
        Ray orders an actor's calls per caller only. The store runs one call at a time, so
        the last call done means every earlier one of this caller is done."""
        self.send()
        if self._last_sent is not None:
            answer(self._last_sent, timeout_s)
