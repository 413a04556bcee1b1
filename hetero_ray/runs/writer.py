"""The durable half of the metrics store: rows on their way to the run directory.

Rows received wait in pending buffers and are written as Parquet parts at least every
``flush_interval_s``; :meth:`RunWriter.finalize` merges the parts into one file per table.
So that a crash of the store's actor loses none of the waiting rows, every row is first
appended to a write-ahead log, which a restarted writer replays. The log is emptied only
once the parts holding its rows are durable (fsynced, renamed, the folder fsynced: see
:mod:`hetero_ray.runs.run_files`), so a part that a crash tears anyway is set aside
when the writer starts and its rows come back from the log.

After :meth:`RunWriter.finalize` the tables are merged: rows that still arrive (a worker's
last batch, sent fire-and-forget after the driver finished) are dropped with a log line
rather than left behind as a stray part beside the merged files.

A write that fails (the disk is full, the folder went read-only) is not retried: the
writer stops writing and says why in :meth:`RunWriter.failure`. Its callers are
fire-and-forget remote calls from the workers, so a raise would reach nobody.
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import shutil
import time
from typing import Any, Callable, Optional

from hetero_ray.runs import run_files
from hetero_ray.runs.records import TABLES, to_table

WAL_FILE = "pending.jsonl"  # in <run_dir>/parts/: rows received but not yet in a Parquet part
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and (error.errno in DISK_FULL_ERRNOS or "No space left on device" in str(error))

logger = logging.getLogger(__name__)


class RunWriter:
    """Pending rows, the write-ahead log, Parquet parts and the first failed write of a run."""

    def __init__(self, run_dir: str, flush_interval_s: float = 5.0):
        self.run_dir = run_dir
        self._flush_interval_s = flush_interval_s
        self._pending: dict[str, list[dict]] = {t: [] for t in TABLES}
        self._last_flush = time.monotonic()
        self._failure: Optional[dict[str, Any]] = None  # set once, by the first write that fails
        self._finalized = False
        self._wal_path = os.path.join(run_dir, run_files.PARTS_DIR, WAL_FILE)
        self._wal = None  # opened on first write
        self._set_aside_torn_parts()
        self._part_sequence = self._existing_part_count()
        self._replay_wal()

    def queue(self, table: str, rows: list[dict]) -> None:
        """Rows for ``table``: in the write-ahead log at once, in a Parquet part by the next flush."""
        if not rows or self._failure:
            return  # after a failed write nothing more reaches disk: hold no more rows for it
        if self._finalized:
            logger.warning("dropped %d %s row(s) that arrived after the run's tables were merged in %s",
                           len(rows), table, self.run_dir)
            return
        self._pending[table].extend(rows)
        self._write("the write-ahead log", self._wal_path, lambda: self._append_wal(table, rows))

    def maybe_flush(self, force: bool = False) -> None:
        if force or time.monotonic() - self._last_flush >= self._flush_interval_s:
            self.flush()

    def write_json(self, what: str, filename: str, value: Any) -> None:
        """A small JSON file of the run (attempts, node profiles), replaced whole."""
        path = os.path.join(self.run_dir, filename)
        self._write(what, path, lambda: run_files.write_json(path, value))

    def failure(self) -> Optional[dict[str, Any]]:
        """Why writing stopped (``message``, ``what``, ``path``, ``disk_full``, ``errno``,
        ``error``, ``wall_time``), or None while every write succeeds."""
        return dict(self._failure) if self._failure else None

    def pending_rows(self) -> int:
        return sum(len(rows) for rows in self._pending.values())

    def flush(self) -> None:
        """Pending rows become Parquet parts; then the write-ahead log can start over.

        A part that cannot be written ends all writing (see :meth:`failure`); the parts
        already written stay complete and readable.
        """
        self._last_flush = time.monotonic()
        if self._failure or self._finalized:
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
        self._finalized = True
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
        return merged

    # ---- write-ahead log -----------------------------------------------------------
    # Rows wait in memory up to a flush interval before they reach Parquet. Every row is
    # first appended to a JSON-lines log (one line per row, flushed to the OS at once).
    # A row both in a part and in the log (crash between the two) is read once: readers
    # drop duplicates on each table's key (records.KEY_COLUMNS).

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
        """Runs ``write()``; an OSError becomes the writer's :meth:`failure`, not a raise.

        Returns whether the write succeeded.
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
        self.fail(message, what, path, error, disk_full)

    def fail(self, message: str, what: str, path: str, error: BaseException, disk_full: bool = False) -> None:
        """Stops all writing; ``message`` is what :meth:`failure` reports (the first one wins)."""
        if self._failure:
            return
        self._failure = {
            "message": message, "what": what, "path": path, "disk_full": disk_full,
            "errno": getattr(error, "errno", None), "error": f"{type(error).__name__}: {error}",
            "wall_time": time.time(),
        }
        for rows in self._pending.values():
            rows.clear()  # they cannot be written; hold no memory for them
        self._close_wal()

    def _set_aside_torn_parts(self) -> None:
        try:
            torn = run_files.set_aside_unreadable_parts(self.run_dir)
        except OSError as e:
            self._fail(e, "a torn part set aside", os.path.join(self.run_dir, run_files.PARTS_DIR))
            return
        for path in torn:
            logger.warning("%s could not be read (cut short by a crash); set aside as %s, its rows come back "
                           "from the write-ahead log if they were still in it", path,
                           os.path.basename(path) + run_files.TORN_SUFFIX)

    def _existing_part_count(self) -> int:
        # Set-aside parts count too: their numbers are never reused.
        pattern = os.path.join(self.run_dir, run_files.PARTS_DIR, "*", "part-*.parquet*")
        numbers = [int(os.path.basename(p)[5:13]) for p in glob.glob(pattern)]
        return max(numbers, default=0)


def free_space(path: str) -> str:
    """``"12.5 MiB free there"``: for messages about a full disk."""
    try:
        return f"{shutil.disk_usage(path).free / 1024**2:.1f} MiB free there"
    except OSError:
        return "free space unknown"
