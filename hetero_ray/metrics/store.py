"""The metrics store: every record of a run, in memory for live readers, on disk for good.

Workers send batches of records fire-and-forget; the store appends them to pending
buffers, keeps the most recent step rows in a bounded window for live queries (the
dashboard, the driver's progress line), and writes pending rows as Parquet parts at
least every ``parquet_flush_interval_s``. :meth:`finalize` merges the parts into one file
per table on the run's effective trajectory.

Plain class, no Ray import: the actor in :mod:`hetero_ray.runtime.actors` wraps it. If
that actor restarts, a new instance picks up the attempt table and the part sequence from
the run directory, so nothing already on disk is lost.

A write that fails (the disk is full, the folder went read-only) is not retried: the
store stops writing, keeps serving live readers, and says why in :meth:`failure`. The
driver's run guard polls that and stops training, so a run never goes on unrecorded.
"""

from __future__ import annotations

import collections
import errno
import itertools
import glob
import json
import os
import shutil
import time
from typing import Any, Callable, Optional

from hetero_ray.metrics import run_files
from hetero_ray.metrics.records import (
    DECISIONS, EPOCHS, PLANS, REPORTS, SAMPLE_IDS, STEPS, TABLES, to_table,
)

WAL_FILE = "pending.jsonl"  # in <run_dir>/parts/: rows received but not yet in a Parquet part
_PROGRESS_STEPS_KEPT = 200  # per-step totals kept for the progress view
_ARRIVAL_SLACK_STEPS = 64  # ranks send rows in batches: how far arrival order may lag steps
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class StoreWriteFailed(Exception):
    """The metrics store could not write the run's files; the message says what and where."""


class MetricsStore:
    def __init__(
        self,
        run_dir: str,
        experiment_name: str,
        max_recent_steps: int = 200_000,
        parquet_flush_interval_s: float = 5.0,
    ):
        self.run_dir = run_dir
        self.experiment_name = experiment_name
        self._max_recent_steps = max_recent_steps
        self._flush_interval_s = parquet_flush_interval_s
        self._pending: dict[str, list[dict]] = {t: [] for t in TABLES}
        self._recent_steps: collections.deque[tuple[int, dict]] = collections.deque(maxlen=max_recent_steps)
        self._cursor = 0  # sequence number of the last step row received
        self._last_flush = time.monotonic()
        self._part_sequence = self._existing_part_count()
        self._attempts: list[dict] = run_files.read_json(self._path(run_files.ATTEMPTS_FILE), []) or []
        self._workers: dict[int, dict] = {}
        self._latest_by_rank: dict[int, dict] = {}
        self._step_totals: collections.OrderedDict[int, dict] = collections.OrderedDict()
        nodes = run_files.read_json(self._path(run_files.NODES_FILE))
        self._nodes: Optional[list[dict]] = nodes.get("nodes") if isinstance(nodes, dict) else nodes
        self._finalized = False
        self._failure: Optional[dict[str, Any]] = None  # set once, by the first write that fails
        self._wal_path = os.path.join(run_dir, run_files.PARTS_DIR, WAL_FILE)
        self._wal = None  # opened on first write
        self._replay_wal()
        # After a restart of this actor (or --resume), the small tables come back from disk.
        self._plans: list[dict] = _records(run_files.read_table(run_dir, PLANS))
        self._epochs: list[dict] = _records(run_files.read_table(run_dir, EPOCHS))
        self._decisions: list[dict] = _records(run_files.read_table(run_dir, DECISIONS))

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
        path = self._path(run_files.ATTEMPTS_FILE)
        self._write("attempts.json", path, lambda: run_files.write_json(path, self._attempts))
        self._workers = {}
        self._latest_by_rank = {}
        self._step_totals = collections.OrderedDict()
        return attempt

    def register_worker(self, info: dict) -> None:
        """A worker of the current attempt: rank, pid, node_id, hostname, device."""
        self._workers[int(info["rank"])] = dict(info)

    def add(self, steps: Optional[list[dict]] = None, sample_ids: Optional[list[dict]] = None) -> None:
        """A worker's batch of step rows and (compact) sample-id rows."""
        steps = list(steps or ())
        for row in steps:
            self._cursor += 1
            self._recent_steps.append((self._cursor, row))
            self._aggregate(row)
        self._queue(STEPS, steps)
        id_rows = []
        for row in sample_ids or ():
            base = {k: row[k] for k in ("epoch", "step", "global_step", "rank", "attempt")}
            id_rows.extend({**base, "sample_index": int(i)} for i in row["sample_indices"])
        self._queue(SAMPLE_IDS, id_rows)
        self._maybe_flush()

    def add_plan(self, row: dict) -> None:
        self._plans.append(row)
        self._queue(PLANS, [row])
        self._maybe_flush()

    def add_epoch(self, row: dict) -> None:
        self._epochs.append(row)
        self._queue(EPOCHS, [row])
        self._maybe_flush(force=True)  # rare and valuable: on disk at once

    def add_decision(self, row: dict) -> None:
        self._decisions.append(row)
        self._queue(DECISIONS, [row])
        self._maybe_flush()

    def add_report(self, row: dict) -> None:
        self._queue(REPORTS, [row])
        self._maybe_flush()

    def set_nodes(self, nodes: list[dict]) -> None:
        self._nodes = nodes
        path = self._path(run_files.NODES_FILE)
        self._write("nodes.json", path, lambda: run_files.write_json(path, {"nodes": nodes}))

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
        return dict(self._failure) if self._failure else None

    def memory(self) -> dict[str, Any]:
        """This process's resident memory and what the store holds (the soak test's view)."""
        import psutil

        return {
            "rss_bytes": psutil.Process().memory_info().rss,
            "steps_held": len(self._recent_steps),
            "max_recent_steps": self._max_recent_steps,
            "pending_rows": sum(len(rows) for rows in self._pending.values()),
            "cursor": self._cursor,
        }

    def steps_since(self, cursor: int, limit: int = 50_000) -> tuple[list[dict], int]:
        """Step rows received after ``cursor`` (oldest first) and the new cursor.

        Rows older than the in-memory window are only on disk; a reader that fell that far
        behind gets the oldest rows still held and should read Parquet for the gap.
        """
        if not self._recent_steps:
            return [], cursor
        # Sequence numbers in the window are contiguous, so the start is an offset.
        first_seq = self._recent_steps[0][0]
        start = max(0, cursor - first_seq + 1)
        taken = list(itertools.islice(self._recent_steps, start, start + limit))
        if not taken:
            return [], cursor
        return [row for _, row in taken], taken[-1][0]

    def progress(self, window_steps: int = 20) -> dict[str, Any]:
        """A compact view of the current attempt's latest steps (the driver's progress line)."""
        attempt = self._current_attempt()
        num_workers = self._attempts[-1]["num_workers"] if self._attempts else 0
        complete = [g for g, t in self._step_totals.items() if t["ranks"] == num_workers]
        if not complete:
            return {"global_step": None, "attempt": attempt}
        last = complete[-1]
        window = complete[-window_steps:]
        samples_per_s = None
        if len(window) >= 2:
            span = self._step_totals[window[-1]]["wall_time"] - self._step_totals[window[0]]["wall_time"]
            samples = sum(self._step_totals[g]["samples"] for g in window[1:])
            samples_per_s = samples / span if span > 0 else None
        totals = self._step_totals[last]
        ranks = {
            rank: {k: row[k] for k in ("local_batch_size", "busy_time_s", "step_time_s", "node_id")}
            for rank, row in sorted(self._latest_by_rank.items())
        }
        return {
            "attempt": attempt,
            "global_step": last,
            "epoch": totals["epoch"],
            "samples_per_s": samples_per_s,
            "loss": totals["loss_sum"] / totals["loss_samples"] if totals["loss_samples"] else None,
            "ranks": ranks,
            "plan_version": totals["plan_version"],
        }

    # ---- queries (the performance app; see dashboards/data.py) -------------------------
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
            "status": "failed" if self._failure else ("finalized" if self._finalized else "running"),
            "attempt": self._current_attempt(),
            "num_workers": self._attempts[-1]["num_workers"] if self._attempts else 0,
            "started_wall_time": self._attempts[0]["wall_time"] if self._attempts else None,
            "cursor": self._cursor,
            # Sequence number of the oldest step row still in memory (older ones: Parquet only).
            "oldest_cursor": self._recent_steps[0][0] if self._recent_steps else self._cursor + 1,
            "steps_held": len(self._recent_steps),
            "max_recent_steps": self._max_recent_steps,
            "global_step": latest.get("global_step"),
            "plan_version": latest.get("plan_version"),
            "attempt_starts": {a["attempt"]: a["start_global_step"] for a in self._attempts},
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
        rows, new_cursor = self.steps_since(step_cursor, limit)
        oldest = self._recent_steps[0][0] if self._recent_steps else self._cursor + 1
        counts = {name: int(cursors.get(name, 0)) for name in ("plans", "epochs", "decisions")}
        return {
            "info": self.info(),
            "steps": to_table(STEPS, rows),
            "missed_steps": max(0, oldest - step_cursor - 1),
            "more": new_cursor < self._cursor,
            "plans": self._plans[counts["plans"]:],
            "epochs": self._epochs[counts["epochs"]:],
            "decisions": self._decisions[counts["decisions"]:],
            "cursors": {"steps": new_cursor, "plans": len(self._plans), "epochs": len(self._epochs),
                        "decisions": len(self._decisions)},
        }

    def recent_steps(self, window_steps: int = 50) -> list[dict]:
        """Step rows of the current attempt's last ``window_steps`` global steps."""
        attempt = self._current_attempt()
        num_workers = max(1, self._attempts[-1]["num_workers"] if self._attempts else 1)
        # Ranks send their rows in batches, so the window's rows are not strictly last in
        # arrival order; look back a generous, bounded number of rows.
        look_back = min(len(self._recent_steps), 2 * (window_steps + _ARRIVAL_SLACK_STEPS) * num_workers)
        tail = [row for _, row in itertools.islice(
            reversed(self._recent_steps), look_back) if row["attempt"] == attempt]
        if not tail:
            return []
        last = max(row["global_step"] for row in tail)
        return sorted((row for row in tail if row["global_step"] > last - window_steps),
                      key=lambda row: (row["global_step"], row["rank"]))

    def rank_summaries(self, window_steps: int = 50) -> list[dict[str, Any]]:
        """Per rank over the last ``window_steps`` steps: share, busy/wait/step time, own samples/s."""
        import pandas as pd

        from hetero_ray.metrics.summary import rank_summaries

        rows = self.recent_steps(window_steps)
        return rank_summaries(pd.DataFrame(rows), last_steps=window_steps) if rows else []

    def plan_history(self) -> list[dict]:
        """Plans on the run's effective trajectory (plans of redone steps dropped), in order."""
        starts = {a["attempt"]: a["start_global_step"] for a in self._attempts}
        kept = []
        for plan in self._plans:
            later = [s for a, s in starts.items() if a > plan.get("attempt", 0)]
            if not later or plan["first_global_step"] < min(later):
                kept.append(plan)
        return sorted(kept, key=lambda p: (p["first_global_step"], p["plan_version"]))

    def capabilities(self) -> list[dict]:
        """The profiled nodes as a list (``nodes.json`` holds ``{"nodes": [...]}``), or []."""
        nodes = self._nodes
        if isinstance(nodes, dict):
            nodes = nodes.get("nodes")
        return list(nodes or [])

    def bottlenecks(self, window_steps: int = 200) -> list[dict]:
        """Bottleneck verdicts over the recent window; [] where the classifier is not installed."""
        try:
            from hetero_ray.profiling.bottlenecks import classify
        except ImportError:
            return []
        import pandas as pd

        rows = self.recent_steps(window_steps)
        if not rows:
            return []
        return [v.to_dict() for v in classify(pd.DataFrame(rows))]

    def _aggregate(self, row: dict) -> None:
        """Keeps per-step cluster totals of the current attempt for :meth:`progress`."""
        if row["attempt"] != self._current_attempt():
            return  # a late row of a dead attempt
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

    # ---- persistence ---------------------------------------------------------------

    def flush(self) -> None:
        """Pending rows become Parquet parts; then the write-ahead log can start over.

        A part that cannot be written ends all writing (see :meth:`failure`); the parts
        already written stay complete and readable.
        """
        self._last_flush = time.monotonic()
        if self._failure:
            return
        for table, rows in self._pending.items():
            if rows:
                sequence = self._part_sequence + 1
                path = os.path.join(run_files.parts_dir(self.run_dir, table), f"part-{sequence:08d}.parquet")
                part = to_table(table, rows)
                if not self._write(f"the {table} part", path,
                                   lambda: run_files.write_part(self.run_dir, table, part, sequence)):
                    return
                self._part_sequence = sequence
                self._pending[table] = []
        self._write("the write-ahead log", self._wal_path, self._truncate_wal)

    def finalize(self) -> dict[str, Optional[str]]:
        """Writes what is pending and merges every table into its final Parquet file.

        After a failed write, merges only what is on disk (a table whose merge fails keeps
        its parts, which readers read the same way) and keeps the write-ahead log.
        """
        self.flush()
        if not self._failure:
            self._close_wal(remove=True)
        merged: dict[str, Optional[str]] = {}
        for table in TABLES:
            try:
                merged[table] = run_files.merge_parts(self.run_dir, table)
            except OSError:
                if not self._failure:
                    raise
                merged[table] = None  # its parts stay; the first failure is the one to report
        self._finalized = True
        return merged

    # ---- write-ahead log -----------------------------------------------------------
    # Rows wait in memory up to a flush interval before they reach Parquet. So that a
    # crash of this actor loses none of them, every row is first appended to a JSON-lines
    # log (one line per row, flushed to the OS at once); a restarted store replays it.
    # A row both in a part and in the log (crash between the two) is read once: readers
    # drop duplicates on each table's key (records.KEY_COLUMNS).

    def _queue(self, table: str, rows: list[dict]) -> None:
        if not rows or self._failure:
            return  # after a failed write nothing more reaches disk: hold no more rows for it
        self._pending[table].extend(rows)
        self._write("the write-ahead log", self._wal_path, lambda: self._append_wal(table, rows))

    def _append_wal(self, table: str, rows: list[dict]) -> None:
        if self._wal is None:
            os.makedirs(os.path.dirname(self._wal_path), exist_ok=True)
            self._wal = open(self._wal_path, "a")
        self._wal.write("".join(json.dumps({"t": table, "r": row}, default=float) + "\n" for row in rows))
        self._wal.flush()

    def _replay_wal(self) -> None:
        try:
            with open(self._wal_path) as f:
                lines = f.readlines()
        except FileNotFoundError:
            return
        replayed = 0
        for line in lines:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line being written when the actor died
            self._pending[entry["t"]].append(entry["r"])
            replayed += 1
        if replayed:
            self.flush()
        else:
            self._truncate_wal()

    def _truncate_wal(self) -> None:
        if self._wal is not None:
            self._wal.seek(0)
            self._wal.truncate()
        elif os.path.exists(self._wal_path):
            open(self._wal_path, "w").close()

    def _close_wal(self, remove: bool = False) -> None:
        if self._wal is not None:
            try:
                self._wal.close()
            except OSError:
                pass  # a failed append left bytes in the buffer; the failure is already recorded
            self._wal = None
        if remove and os.path.exists(self._wal_path):
            os.remove(self._wal_path)

    # ---- failed writes ---------------------------------------------------------------

    def _write(self, what: str, path: str, write: Callable[[], Any]) -> bool:
        """Runs ``write()``; an OSError becomes the store's :meth:`failure`, not a raise.

        Callers are fire-and-forget remote calls from the workers: an exception raised
        here would reach nobody. Returns whether the write succeeded.
        """
        if self._failure:
            return False
        try:
            write()
            return True
        except OSError as e:
            self._fail(e, what, path)
            return False

    def _fail(self, error: OSError, what: str, path: str) -> None:
        disk_full = error.errno in DISK_FULL_ERRNOS or "No space left" in str(error)
        reason = error.strerror or str(error)
        if disk_full:
            message = f"disk full at {path} while writing {what} ({free_space(self.run_dir)})"
        else:
            message = f"cannot write {what} at {path} ({reason})"
        self._failure = {
            "message": message, "what": what, "path": path, "disk_full": disk_full,
            "errno": error.errno, "error": f"{type(error).__name__}: {error}", "wall_time": time.time(),
        }
        for rows in self._pending.values():
            rows.clear()  # they cannot be written; hold no memory for them
        self._close_wal()

    def _maybe_flush(self, force: bool = False) -> None:
        if force or time.monotonic() - self._last_flush >= self._flush_interval_s:
            self.flush()

    def _current_attempt(self) -> int:
        return len(self._attempts) - 1

    def _existing_part_count(self) -> int:
        pattern = os.path.join(self.run_dir, run_files.PARTS_DIR, "*", "part-*.parquet")
        numbers = [int(os.path.basename(p)[5:13]) for p in glob.glob(pattern)]
        return max(numbers, default=0)

    def _path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)


def free_space(path: str) -> str:
    """``"12.5 MiB free there"``: for messages about a full disk."""
    try:
        return f"{shutil.disk_usage(path).free / 1024**2:.1f} MiB free there"
    except OSError:
        return "free space unknown"


def _records(df) -> list[dict]:
    """Rows of a small table as plain dicts (lists instead of arrays)."""
    rows = df.to_dict("records")
    for row in rows:
        for key, value in row.items():
            if hasattr(value, "tolist"):
                row[key] = value.tolist()
    return rows
