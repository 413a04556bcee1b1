"""The run directory: where each file lives, and how tables are written and read.

The layout of ``<output-dir>/<experiment-name>/`` (``config.json``, ``attempts.json``,
``planner_state.json``, the Parquet tables, ``summary.json``, ``model_final.pt``, Ray
Train's ``checkpoint_*/``) is docs/run-files.md. A table's rows land in
``parts/<table>/*.parquet`` while the run goes, which readers merge, and are merged into
``<table>.parquet`` at its end. Every file is written to a temporary name, fsynced and
renamed into place, its folder fsynced after: the rename is the commit point, so nobody
sees a half-written file under its final name. Readers skip a torn part with a warning;
the metrics store sets it aside (:func:`set_aside_unreadable_parts`) and recovers its rows
from the write-ahead log. Why: docs/run-files.md#written-whole-or-not-at-all
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import tempfile
from typing import Any, Optional

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from hetero_ray.runs.records import KEY_COLUMNS, SCHEMAS, STEP_COLUMN, TRAJECTORY_TABLES
from hetero_ray.runs.trajectory import effective_rows

CONFIG_FILE = "config.json"
ATTEMPTS_FILE = "attempts.json"
SUMMARY_FILE = "summary.json"
NODES_FILE = "nodes.json"
MODEL_FILE = "model_final.pt"
# The planner actor keeps what it cannot learn again after a restart here (see
# hetero_ray/runtime/planner_actor.py).
PLANNER_STATE_FILE = "planner_state.json"
PARTS_DIR = "parts"
TORN_SUFFIX = ".torn"  # a part that cannot be read, set aside under its own name plus this

logger = logging.getLogger(__name__)


def table_path(run_dir: str, table: str) -> str:
    return os.path.join(run_dir, f"{table}.parquet")


def parts_dir(run_dir: str, table: str) -> str:
    return os.path.join(run_dir, PARTS_DIR, table)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates 0600 files; results are meant to be read by others like any file.
_FILE_MODE = 0o666 & ~_umask()


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes ``path`` whole or not at all; on any error (ENOSPC too) no temporary file stays."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _FILE_MODE)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    """Makes a rename in ``directory`` durable: until the folder's entry is on disk, a
    power loss may bring back the old name (or none)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        # Some filesystems (FUSE mounts, a few network ones) cannot sync a folder; the
        # rename is then as durable as they make it, and the write itself succeeded.
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    """Makes a file's data durable (before the rename that publishes it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str, value: Any) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode())


def read_json(path: str, default: Any = None) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def write_table(path: str, table: pa.Table) -> None:
    """Writes a Parquet file atomically (temporary file, fsync, rename, fsync of the folder).

    On any error (a full disk included) the temporary file is removed and ``path`` keeps
    its previous content, if any.
    """
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".parquet")
    os.close(fd)
    try:
        os.chmod(tmp, _FILE_MODE)
        pq.write_table(table, tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    fsync_dir(directory)


def write_part(run_dir: str, table: str, part: pa.Table, sequence: int) -> str:
    directory = parts_dir(run_dir, table)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"part-{sequence:08d}.parquet")
    write_table(path, part)
    return path


def attempt_starts(run_dir: str) -> dict[int, int]:
    attempts = read_json(os.path.join(run_dir, ATTEMPTS_FILE), default=[]) or []
    return {int(a["attempt"]): int(a["start_global_step"]) for a in attempts}


def read_raw_table(run_dir: str, table: str) -> pd.DataFrame:
    """All rows of a table as written: the merged file plus any parts not merged yet.

    A torn part (0 bytes, cut short by a crash) is skipped with a warning naming it: its
    rows are either in the write-ahead log, which the metrics store replays, or lost with
    the crash. A torn merged file is an error that names it: it held the whole table.
    """
    return _read_raw(run_dir, table)[0]


def _read_raw(run_dir: str, table: str) -> tuple[pd.DataFrame, list[str], list[str]]:
    """The table's rows, the parts they came from, and the parts that could not be read."""
    frames = []
    merged = table_path(run_dir, table)
    if os.path.exists(merged):
        try:
            frames.append(pq.read_table(merged).to_pandas())
        except pa.ArrowException as e:
            raise TornFileError(f"{merged} cannot be read ({e}): the file was cut short, so the {table} table "
                                "is lost; rename or remove it to read the rest of the run") from None
    read, torn = [], []
    for path in part_files(run_dir, table):
        frame = read_part(path)
        (read if frame is not None else torn).append(path)
        if frame is not None:
            frames.append(frame)
    frames = [f for f in frames if not f.empty]
    if not frames:
        df = SCHEMAS[table].empty_table().to_pandas()
    else:
        df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if read and not df.empty:  # a merged file is already clean; parts may repeat a retried or replayed batch
        df = df.drop_duplicates(subset=list(KEY_COLUMNS[table]), keep="last", ignore_index=True)
    return df, read, torn


class TornFileError(OSError):
    """A merged table file that cannot be read; the message names it and what to do."""


def part_files(run_dir: str, table: str) -> list[str]:
    return sorted(glob.glob(os.path.join(parts_dir(run_dir, table), "part-*.parquet")))


def read_part(path: str) -> Optional[pd.DataFrame]:
    """One part's rows; an empty frame if it was merged away since it was listed (its rows
    are in the merged file now); None, with a warning naming it, if a crash tore it (every
    reader skips it; a metrics store sets it aside as ``.torn`` and replays its rows)."""
    try:
        return pq.read_table(path).to_pandas()
    except FileNotFoundError:
        return pd.DataFrame()  # merged away since it was listed: its rows are in the merged file
    except (pa.ArrowException, OSError) as e:
        logger.warning("skipping the unreadable part %s (%s): a crash cut it short", path, e)
        return None


def set_aside_unreadable_parts(run_dir: str) -> list[str]:
    """Renames each part that cannot be read to ``<name>.torn`` (readers and merges then
    skip it, and the evidence stays); returns their paths.

    Called when a metrics store starts on an existing run directory, before it replays
    its write-ahead log: a part is written before the log is emptied, so rows of a part
    torn by a crash are still in the log.
    """
    torn = [path for path in sorted(glob.glob(os.path.join(run_dir, PARTS_DIR, "*", "part-*.parquet")))
            if read_part(path) is None]
    _set_aside(torn)
    return torn


def _set_aside(paths: list[str]) -> None:
    for path in paths:
        os.replace(path, path + TORN_SUFFIX)


def read_table(run_dir: str, table: str) -> pd.DataFrame:
    """A table of a finished or running run, restricted to its effective trajectory."""
    return _effective(run_dir, table, read_raw_table(run_dir, table))


def _effective(run_dir: str, table: str, df: pd.DataFrame) -> pd.DataFrame:
    if table in TRAJECTORY_TABLES:
        df = effective_rows(df, attempt_starts(run_dir), STEP_COLUMN.get(table, "global_step"))
    return df


def merge_parts(run_dir: str, table: str) -> Optional[str]:
    """Replaces the table's parts by one Parquet file of its effective rows (written
    durably before any part is removed). A torn part is set aside, not deleted."""
    merged = table_path(run_dir, table)
    if not part_files(run_dir, table) and not os.path.exists(merged):
        return None
    raw, part_paths, torn = _read_raw(run_dir, table)
    _set_aside(torn)
    df = _effective(run_dir, table, raw)
    for name in SCHEMAS[table].names:  # a file written before a column was added: null there
        if name not in df.columns:
            df[name] = None
    sort_keys = [k for k in ("global_step", "rank", "sample_index") if k in df.columns]
    if sort_keys and not df.empty:
        df = df.sort_values(sort_keys, kind="stable").reset_index(drop=True)
    write_table(merged, pa.Table.from_pandas(df, schema=SCHEMAS[table], preserve_index=False))
    for path in part_paths:
        _remove_quietly(path)
    _remove_empty_dirs(os.path.join(run_dir, PARTS_DIR))
    return merged


def _remove_empty_dirs(root: str) -> None:
    if not os.path.isdir(root):
        return
    for name in os.listdir(root):
        sub = os.path.join(root, name)
        if os.path.isdir(sub) and not os.listdir(sub):
            os.rmdir(sub)
    if not os.listdir(root):
        os.rmdir(root)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
