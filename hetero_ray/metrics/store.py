"""The metrics store: every record of a run, in memory for live readers, on disk for good.

Workers send batches of records fire-and-forget. The store holds the run's small tables
(attempts, workers, plans, epochs, decisions, node profiles) and hands rows to its two
halves: a :class:`~hetero_ray.runs.writer.RunWriter` makes them durable (parts at least every
``parquet_flush_interval_s``, one file per table on :meth:`MetricsStore.finalize`), and a
:class:`~hetero_ray.metrics.step_window.StepWindow` keeps the most recent step rows for live
queries. The analyses live with their subjects (:mod:`hetero_ray.metrics.summary`,
:mod:`hetero_ray.runs.trajectory`). Plain class, no Ray import: the actor in
:mod:`hetero_ray.runtime.actors` wraps it. Restarts, and a write that fails
(:meth:`MetricsStore.failure`): docs/run-files.md#the-metrics-store
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

from hetero_ray.metrics.step_window import StepWindow
from hetero_ray.runs import remote_copy, run_files
from hetero_ray.runs.records import DECISIONS, EPOCHS, PLANS, REPORTS, SAMPLE_IDS, STEPS, to_table
from hetero_ray.runs.trajectory import effective_plans
from hetero_ray.runs.writer import RunWriter

logger = logging.getLogger(__name__)


class StoreWriteFailed(Exception):
    """The metrics store could not write the run's files; the message says what and where."""


class MetricsStore:
    def __init__(
        self,
        run_dir: str,
        experiment_name: str,
        max_recent_steps: int = 200_000,
        parquet_flush_interval_s: float = 5.0,
        remote_run_uri: Optional[str] = None,
    ):
        self.run_dir = run_dir
        self.experiment_name = experiment_name
        self._remote_run_uri = remote_run_uri  # URI storage: the tables follow each checkpoint there
        self._window = StepWindow(max_recent_steps)
        self._finalized = False
        # Sets torn parts aside and replays its write-ahead log; never raises (see failure()).
        self._writer = RunWriter(run_dir, parquet_flush_interval_s)
        # After a restart of this actor (or --resume), the small tables come back from disk.
        # A file a crash tore must not kill the store (training would go on unrecorded): it
        # becomes the store's failure, which names the file and stops the run.
        self._attempts: list[dict] = self._read(run_files.ATTEMPTS_FILE,
                                                lambda: run_files.read_json(self._path(run_files.ATTEMPTS_FILE), []),
                                                []) or []
        # The current attempt's workers came with it: a restarted store still knows each
        # rank's pid and node (the progress line's node-lost check, a test's kill).
        self._workers: dict[int, dict] = {int(w["rank"]): dict(w) for w in
                                          (self._attempts[-1].get("workers", []) if self._attempts else [])}
        nodes = self._read(run_files.NODES_FILE, lambda: run_files.read_json(self._path(run_files.NODES_FILE)), None)
        self._nodes: Optional[list[dict]] = nodes.get("nodes") if isinstance(nodes, dict) else nodes
        self._plans: list[dict] = self._read_small_table(PLANS)
        self._epochs: list[dict] = self._read_small_table(EPOCHS)
        self._decisions: list[dict] = self._read_small_table(DECISIONS)

    # ---- writers (workers, driver) -------------------------------------------------

    def begin_attempt(self, start_global_step: int, num_workers: int) -> int:
        """Registers a worker-group start; returns its attempt id (0, 1, …)."""
        attempt = len(self._attempts)
        self._attempts.append({
            "attempt": attempt,
            "start_global_step": int(start_global_step),
            "num_workers": int(num_workers),
            "wall_time": time.time(),
        })
        self._writer.write_json("attempts.json", run_files.ATTEMPTS_FILE, self._attempts)
        self._workers = {}
        self._window.new_attempt()
        return attempt

    def note_attempt(self, attempt: int, facts: dict) -> None:
        """Facts about a worker-group start learned after it began (the emulated devices'
        factor, measured by its ranks), added to its entry in attempts.json."""
        entry = self._attempt_entry(int(attempt))
        if entry is None:
            return  # a start this store never registered (a restart lost it): nothing to add to
        entry.update(facts)
        self._writer.write_json("attempts.json", run_files.ATTEMPTS_FILE, self._attempts)

    def register_worker(self, info: dict) -> None:
        """A worker of the current attempt: rank, pid, node_id, hostname, device (kept in
        the attempt's entry of attempts.json too, for a restart of this store)."""
        self._workers[int(info["rank"])] = dict(info)
        entry = self._attempt_entry(info.get("attempt"))
        if entry is not None:
            entry["workers"] = [self._workers[rank] for rank in sorted(self._workers)]
            self._writer.write_json("attempts.json", run_files.ATTEMPTS_FILE, self._attempts)

    def add(self, steps: Optional[list[dict]] = None, sample_ids: Optional[list[dict]] = None) -> None:
        """A worker's batch of step rows and (compact) sample-id rows."""
        steps = list(steps or ())
        self._window.add(steps, self._current_attempt())
        self._writer.queue(STEPS, steps)
        id_rows = []
        for row in sample_ids or ():
            base = {k: row[k] for k in ("epoch", "step", "global_step", "rank", "attempt")}
            id_rows.extend({**base, "sample_index": int(i)} for i in row["sample_indices"])
        self._writer.queue(SAMPLE_IDS, id_rows)
        self._writer.maybe_flush()

    def add_plan(self, row: dict) -> None:
        self._plans.append(row)
        self._writer.queue(PLANS, [row])
        self._writer.maybe_flush()

    def add_epoch(self, row: dict) -> None:
        self._epochs.append(row)
        self._writer.queue(EPOCHS, [row])
        self._writer.maybe_flush(force=True)  # rare and valuable: on disk at once

    def add_decision(self, row: dict) -> None:
        self._decisions.append(row)
        self._writer.queue(DECISIONS, [row])
        self._writer.maybe_flush()

    def add_report(self, row: dict) -> None:
        self._writer.queue(REPORTS, [row])
        self._writer.maybe_flush()

    def set_nodes(self, nodes: list[dict]) -> None:
        self._nodes = nodes
        self._writer.write_json("nodes.json", run_files.NODES_FILE, {"nodes": nodes})

    # ---- readers (driver progress, dashboard) --------------------------------------

    def workers(self) -> dict[int, dict]:
        return dict(self._workers)

    def attempts(self) -> list[dict]:
        return list(self._attempts)

    def plans(self) -> list[dict]:
        return list(self._plans)

    def epochs(self) -> list[dict]:
        return list(self._epochs)

    def decisions(self) -> list[dict]:
        return list(self._decisions)

    def nodes(self) -> Optional[list[dict]]:
        return self._nodes

    def failure(self) -> Optional[dict[str, Any]]:
        """Why the store stopped writing, or None while every write succeeds.

        ``message`` (what failed, where, the OS error), ``path``, ``what``, ``disk_full``,
        ``errno`` and ``wall_time``. Rows received since are kept for live readers only.
        """
        return self._writer.failure()

    def memory(self) -> dict[str, Any]:
        """This process's resident memory and what the store holds (the soak test's view)."""
        import psutil

        return {
            "rss_bytes": psutil.Process().memory_info().rss,
            "steps_held": len(self._window),
            "max_recent_steps": self._window.max_rows,
            "pending_rows": self._writer.pending_rows(),
            "cursor": self._window.cursor,
        }

    def steps_since(self, cursor: int, limit: int = 50_000) -> tuple[list[dict], int]:
        """Step rows received after ``cursor`` (oldest first) and the new cursor.

        Rows older than the in-memory window are only on disk; a reader that fell that far
        behind gets the oldest rows still held and should read Parquet for the gap.
        """
        return self._window.since(cursor, limit)

    def progress(self, window_steps: int = 20) -> dict[str, Any]:
        """A compact view of the current attempt's latest steps (the driver's progress line)."""
        return {"attempt": self._current_attempt(), **self._window.progress(self._num_workers(), window_steps)}

    # ---- queries (the performance app; see dashboards/live_source.py) -------------------
    #
    # The app calls :meth:`updates_since` once per refresh and gets only what is new; the
    # rest are small views computed from the bounded in-memory window. Nothing here
    # changes the store's state.

    def info(self) -> dict[str, Any]:
        """What the store holds: run identity, status and the step cursor range."""
        latest = self.progress(window_steps=2)
        return {
            "experiment_name": self.experiment_name,
            "run_dir": self.run_dir,
            "status": "failed" if self._writer.failure() else ("finalized" if self._finalized else "running"),
            "attempt": self._current_attempt(),
            "num_workers": self._num_workers(),
            "started_wall_time": self._attempts[0]["wall_time"] if self._attempts else None,
            "cursor": self._window.cursor,
            # Sequence number of the oldest step row still in memory (older ones: Parquet only).
            "oldest_cursor": self._window.oldest_cursor,
            "steps_held": len(self._window),
            "max_recent_steps": self._window.max_rows,
            "global_step": latest.get("global_step"),
            "plan_version": latest.get("plan_version"),
            "attempt_starts": self._attempt_starts(),
        }

    def updates_since(self, cursors: Optional[dict[str, int]] = None,
                      limit: int = 50_000) -> dict[str, Any]:
        """Everything new for a live reader, in one round trip.

        Args:
            cursors: what the reader already has: ``steps`` (step-row cursor) and the
                number of ``plans``, ``epochs`` and ``decisions`` rows it holds.
            limit: at most this many step rows; call again while ``more`` is true.

        Returns:
            ``info`` (see :meth:`info`), ``steps`` (an Arrow table of the STEPS schema: the
            columnar form costs a fraction of a list of dicts to send), ``cursors`` to pass
            next time, ``more``, ``missed_steps`` (rows that left memory before the reader
            asked: read them from Parquet), and the new ``plans``, ``epochs``, ``decisions``.
        """
        cursors = dict(cursors or {})
        step_cursor = int(cursors.get("steps", 0))
        rows, new_cursor = self._window.since(step_cursor, limit)
        counts = {name: int(cursors.get(name, 0)) for name in ("plans", "epochs", "decisions")}
        return {
            "info": self.info(),
            "steps": to_table(STEPS, rows),
            "missed_steps": max(0, self._window.oldest_cursor - step_cursor - 1),
            "more": new_cursor < self._window.cursor,
            "plans": self._plans[counts["plans"]:],
            "epochs": self._epochs[counts["epochs"]:],
            "decisions": self._decisions[counts["decisions"]:],
            "cursors": {"steps": new_cursor, "plans": len(self._plans), "epochs": len(self._epochs),
                        "decisions": len(self._decisions)},
        }

    def recent_steps(self, window_steps: int = 50) -> list[dict]:
        """Step rows of the current attempt's last ``window_steps`` global steps."""
        return self._window.recent(self._current_attempt(), self._num_workers(), window_steps)

    def rank_summaries(self, window_steps: int = 50) -> list[dict[str, Any]]:
        """Per rank over the last ``window_steps`` steps: share, busy/wait/step time, own samples/s."""
        import pandas as pd

        from hetero_ray.metrics.summary import rank_summaries

        rows = self.recent_steps(window_steps)
        return rank_summaries(pd.DataFrame(rows), last_steps=window_steps) if rows else []

    def plan_history(self) -> list[dict]:
        """Plans on the run's effective trajectory (plans of redone steps dropped), in order."""
        return effective_plans(self._plans, self._attempt_starts())

    def capabilities(self) -> list[dict]:
        """The profiled nodes as a list (``nodes.json`` holds ``{"nodes": [...]}``), or []."""
        nodes = self._nodes
        if isinstance(nodes, dict):
            nodes = nodes.get("nodes")
        return list(nodes or [])

    # ---- persistence ---------------------------------------------------------------

    def flush(self) -> None:
        """Pending rows become Parquet parts (see :meth:`RunWriter.flush`)."""
        self._writer.flush()

    def checkpoint_reached(self) -> bool:
        """A checkpoint is about to be reported, its step rows already here: on URI storage
        the tables go there first, so a driver that crashes leaves them beside every
        checkpoint Ray Train registered (training/rank/loop_report.py waits for this; see
        :mod:`hetero_ray.runs.remote_copy`). False when the copy failed (said here): the
        checkpoint is then not reported, and the next one copies again."""
        if self._remote_run_uri is None or self._finalized:
            return True
        self._writer.flush()
        try:
            remote_copy.upload_tables(self.run_dir, self._remote_run_uri)
        except OSError as e:
            logger.warning("the run's tables could not be copied to %s (%s); trying again at the next checkpoint",
                           self._remote_run_uri, e)
            return False
        return True

    def finalize(self) -> dict[str, Optional[str]]:
        """Writes what is pending and merges every table into its final Parquet file.

        After a failed write, merges only what is on disk (a table whose merge fails keeps
        its parts, which readers read the same way) and keeps the write-ahead log. Rows
        that arrive afterwards are dropped with a log line (no stray part is left).
        """
        merged = self._writer.finalize()
        self._finalized = True
        return merged

    def _read_small_table(self, table: str) -> list[dict]:
        return self._read(f"{table}.parquet", lambda: _records(run_files.read_table(self.run_dir, table)), [])

    def _read(self, filename: str, read, default):
        try:
            return read()
        except (OSError, ValueError) as e:  # ValueError: a torn JSON file
            path = self._path(filename)
            self._writer.fail(f"{path} cannot be read ({e}): a crash cut it short; move it aside to continue "
                              "the run without it, or start the run under another name", filename, path, e)
            return default

    def _current_attempt(self) -> int:
        return len(self._attempts) - 1

    def _attempt_entry(self, attempt: Optional[int]) -> Optional[dict]:
        """The entry of attempts.json for ``attempt``; None for one this store never registered."""
        return next((a for a in self._attempts if a["attempt"] == attempt), None)

    def _num_workers(self) -> int:
        return self._attempts[-1]["num_workers"] if self._attempts else 0

    def _attempt_starts(self) -> dict[int, int]:
        return {a["attempt"]: a["start_global_step"] for a in self._attempts}

    def _path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)


def _records(df) -> list[dict]:
    """Rows of a small table as plain dicts (lists instead of arrays)."""
    rows = df.to_dict("records")
    for row in rows:
        for key, value in row.items():
            if hasattr(value, "tolist"):
                row[key] = value.tolist()
    return rows
