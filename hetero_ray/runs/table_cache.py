"""Tables of offline runs, kept in memory and re-read only when their files change.

:class:`TableCache` reads a run directory's tables through :mod:`hetero_ray.runs.run_files`
(merged Parquet files, or the parts of a run that is still being written); new parts of a
running run are read incrementally; a part a crash tore is skipped, as every reader of
run_files skips it. Only Parquet is read; nothing is ever unpickled.
"""

from __future__ import annotations

import glob
import os
import threading

import pandas as pd
import pyarrow.parquet as pq

from hetero_ray.runs import run_files
from hetero_ray.runs.readers import attempt_starts, file_signature, inside
from hetero_ray.runs.records import SCHEMAS, STEP_COLUMN, TRAJECTORY_TABLES
from hetero_ray.runs.trajectory import effective_rows

CACHE_MAX_ROWS = 4_000_000  # rows of offline tables kept in memory (~1 GB of step rows at worst)


class TableCache:
    """Tables of run directories, re-read only when their files change.

    The signature of a table is the merged file's (mtime, size) plus the names of its
    parts; when only new parts appeared (a running run), only those are read. The
    effective trajectory (rows of redone steps dropped) is recomputed on each change.
    """

    def __init__(self, max_rows: int = CACHE_MAX_ROWS):
        self._lock = threading.Lock()
        self._max_rows = max_rows
        self._entries: dict[tuple[str, str], dict] = {}  # least recently read first

    def read(self, run_dir: str, table: str) -> tuple[pd.DataFrame, tuple]:
        """The table's effective rows and a signature that changes when they do."""
        merged = inside(run_dir, run_files.table_path(run_dir, table))
        merged_sig = file_signature(run_dir, merged) if merged is not None else None
        parts_folder = run_files.parts_dir(run_dir, table)
        parts = []
        if inside(run_dir, parts_folder) is not None:  # the folder checked once, then only links
            parts = [p for p in sorted(glob.glob(os.path.join(parts_folder, "part-*.parquet")))
                     if not os.path.islink(p) or inside(run_dir, p) is not None]
        attempts_sig = file_signature(run_dir, os.path.join(run_dir, run_files.ATTEMPTS_FILE))
        key = (run_dir, table)
        with self._lock:
            entry = self._entries.get(key)
        if entry and entry["merged"] == merged_sig and entry["parts"] == parts and entry["attempts"] == attempts_sig:
            with self._lock:
                self._entries[key] = self._entries.pop(key, entry)  # most recently used
            return entry["df"], entry["signature"]
        frames = []
        if entry and entry["merged"] == merged_sig and parts[: len(entry["parts"])] == entry["parts"]:
            raw = entry["raw"]  # only new parts to read
            new_parts = parts[len(entry["parts"]):]
        else:
            raw = None
            new_parts = parts
            if merged_sig is not None:
                frames.append(_read_parquet(merged))
        # A part merged away meanwhile reads empty (the merged file's new signature brings
        # its rows next time); a torn one is skipped until a metrics store sets it aside.
        frames += [run_files.read_part(os.path.realpath(path)) for path in new_parts]
        frames = [f for f in ([raw] if raw is not None else []) + frames if f is not None and not f.empty]
        raw = pd.concat(frames, ignore_index=True) if len(frames) > 1 else (
            frames[0] if frames else SCHEMAS[table].empty_table().to_pandas())
        df = raw
        starts = attempt_starts(run_dir)
        # One attempt: every row is on the trajectory (skip the per-row pass on big tables).
        if table in TRAJECTORY_TABLES and len(starts) > 1:
            df = effective_rows(raw, starts, STEP_COLUMN.get(table, "global_step"))
        signature = (merged_sig, len(parts), parts[-1] if parts else None, attempts_sig)
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = {"merged": merged_sig, "parts": parts, "attempts": attempts_sig,
                                  "raw": raw, "df": df, "signature": signature}
            # Bounded by rows, not files: one long run can outweigh a hundred short ones.
            while len(self._entries) > 1 and sum(len(e["raw"]) for e in self._entries.values()) > self._max_rows:
                self._entries.pop(next(iter(self._entries)))
        return df, signature


def _read_parquet(path: str) -> pd.DataFrame:
    return pq.read_table(path).to_pandas()
