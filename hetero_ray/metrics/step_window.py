"""The metrics store's live half: the most recent step rows, for readers while a run goes.

Every step row received gets the next sequence number (the *cursor*); the window keeps the
last ``max_rows`` rows, so a reader asks for what came after its cursor and a reader that
fell further behind reads the gap from Parquet. Beside it, per-step totals of the current
attempt feed the driver's progress line.

Plain class, no Ray, no I/O: :class:`hetero_ray.metrics.store.MetricsStore` holds one.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

_PROGRESS_STEPS_KEPT = 200  # per-step totals kept for the progress view
_ARRIVAL_SLACK_STEPS = 64  # ranks send rows in batches: how far arrival order may lag steps


class StepWindow:
    """A bounded window of step rows with sequence numbers, and the current attempt's totals."""

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self._rows: collections.deque[tuple[int, dict]] = collections.deque(maxlen=max_rows)
        self.cursor = 0  # sequence number of the last step row received
        self._latest_by_rank: dict[int, dict] = {}
        self._step_totals: collections.OrderedDict[int, dict] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def oldest_cursor(self) -> int:
        """Sequence number of the oldest row still held (older ones: Parquet only)."""
        return self._rows[0][0] if self._rows else self.cursor + 1

    def new_attempt(self) -> None:
        """A worker group started: the progress totals start over (the rows stay)."""
        self._latest_by_rank = {}
        self._step_totals = collections.OrderedDict()

    def add(self, rows: list[dict], attempt: int) -> None:
        """Rows received; those of ``attempt`` (the current one) count towards progress."""
        for row in rows:
            self.cursor += 1
            self._rows.append((self.cursor, row))
            if row["attempt"] == attempt:  # not a late row of a dead attempt
                self._aggregate(row)

    def since(self, cursor: int, limit: int = 50_000) -> tuple[list[dict], int]:
        """Rows received after ``cursor`` (oldest first) and the new cursor.

        A reader that fell behind the window gets the oldest rows still held.
        """
        if not self._rows:
            return [], cursor
        # Sequence numbers in the window are contiguous, so the start is an offset.
        start = max(0, cursor - self._rows[0][0] + 1)
        taken = list(itertools.islice(self._rows, start, start + limit))
        if not taken:
            return [], cursor
        return [row for _, row in taken], taken[-1][0]

    def recent(self, attempt: int, num_workers: int, window_steps: int) -> list[dict]:
        """Rows of ``attempt``'s last ``window_steps`` global steps, by (global_step, rank)."""
        # Ranks send their rows in batches, so the window's rows are not strictly last in
        # arrival order; look back a generous, bounded number of rows.
        look_back = min(len(self._rows), 2 * (window_steps + _ARRIVAL_SLACK_STEPS) * max(1, num_workers))
        tail = [row for _, row in itertools.islice(reversed(self._rows), look_back) if row["attempt"] == attempt]
        if not tail:
            return []
        last = max(row["global_step"] for row in tail)
        return sorted((row for row in tail if row["global_step"] > last - window_steps),
                      key=lambda row: (row["global_step"], row["rank"]))

    def progress(self, num_workers: int, window_steps: int) -> dict[str, Any]:
        """The current attempt's last complete step and throughput over the last ``window_steps``.

        Returns ``{"global_step": None}`` until a step has rows from all ``num_workers`` ranks.
        """
        complete = [g for g, t in self._step_totals.items() if t["ranks"] == num_workers]
        if not complete:
            return {"global_step": None}
        last = complete[-1]
        window = complete[-window_steps:]
        samples_per_s = None
        if len(window) >= 2:
            span = self._step_totals[window[-1]]["wall_time"] - self._step_totals[window[0]]["wall_time"]
            samples = sum(self._step_totals[g]["samples"] for g in window[1:])
            samples_per_s = samples / span if span > 0 else None
        totals = self._step_totals[last]
        ranks = {
            rank: {**{k: row[k] for k in ("local_batch_size", "busy_time_s", "step_time_s", "node_id")},
                   "probe_batch_size": row.get("probe_batch_size") or 0}  # > 0: the plan leaves the rank out
            for rank, row in sorted(self._latest_by_rank.items())
        }
        return {
            "global_step": last,
            "epoch": totals["epoch"],
            "samples_per_s": samples_per_s,
            "loss": totals["loss_sum"] / totals["loss_samples"] if totals["loss_samples"] else None,
            "ranks": ranks,
            "plan_version": totals["plan_version"],
        }

    def _aggregate(self, row: dict) -> None:
        """Per-step cluster totals of the current attempt, for :meth:`progress`."""
        self._latest_by_rank[row["rank"]] = row
        totals = self._step_totals.get(row["global_step"])
        if totals is None:
            totals = self._step_totals[row["global_step"]] = {
                "samples": 0, "ranks": 0, "wall_time": 0.0, "loss_sum": 0.0, "loss_samples": 0,
                "epoch": row["epoch"], "plan_version": row["plan_version"],
            }
            while len(self._step_totals) > _PROGRESS_STEPS_KEPT:
                self._step_totals.popitem(last=False)
        totals["samples"] += row["local_batch_size"]
        totals["ranks"] += 1
        totals["wall_time"] = max(totals["wall_time"], row["wall_time"])
        if row.get("loss") is not None:
            totals["loss_sum"] += row["loss"] * row["local_batch_size"]
            totals["loss_samples"] += row["local_batch_size"]
