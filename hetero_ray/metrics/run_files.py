"""The run directory: where each file lives, and how tables are written and read.

Layout of ``<output-dir>/<experiment-name>/``::

    config.json          the resolved configuration
    attempts.json        one entry per worker-group start: attempt id, resume step, workers
    planner_state.json   the planner's plan, version counter, caps, node profiles, scripted
                         changes to come, and the worker group it serves with the run's end
    steps.parquet        one row per step and rank            } merged from parts/ at the end;
    plans.parquet        plan history                         } while running, readers merge
    epochs.parquet       one row per epoch                    } parts/<table>/*.parquet
    decisions.parquet    balancer decisions                   }
    sample_ids.parquet   with --record-sample-ids             }
    summary.json         totals and steady throughput
    model_final.pt       the final model's state_dict
    ray_train/           Ray Train's checkpoints (what --resume continues from)

Every file is written to a temporary name and renamed into place, so a reader (or a run
that fails) never sees a half-written file.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
from typing import Any, Optional

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from hetero_ray.metrics.records import KEY_COLUMNS, SCHEMAS, STEP_COLUMN, TRAJECTORY_TABLES
from hetero_ray.metrics.trajectory import effective_rows

CONFIG_FILE = "config.json"
ATTEMPTS_FILE = "attempts.json"
SUMMARY_FILE = "summary.json"
NODES_FILE = "nodes.json"
MODEL_FILE = "model_final.pt"
# The planner actor keeps what it cannot learn again after a restart here (see
# hetero_ray/runtime/planner_actor.py).
PLANNER_STATE_FILE = "planner_state.json"
PARTS_DIR = "parts"


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


def write_json(path: str, value: Any) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode())


def read_json(path: str, default: Any = None) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def write_table(path: str, table: pa.Table) -> None:
    """Writes a Parquet file atomically (temporary file, then rename).

    On any error (a full disk included) the temporary file is removed and ``path`` keeps
    its previous content, if any.
    """
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".parquet")
    os.close(fd)
    try:
        os.chmod(tmp, _FILE_MODE)
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


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
    """All rows of a table as written: the merged file plus any parts not merged yet."""
    frames = []
    merged = table_path(run_dir, table)
    if os.path.exists(merged):
        frames.append(pq.read_table(merged).to_pandas())
    part_paths = sorted(glob.glob(os.path.join(parts_dir(run_dir, table), "part-*.parquet")))
    frames.extend(pq.read_table(path).to_pandas() for path in part_paths)
    frames = [f for f in frames if not f.empty]
    if not frames:
        return SCHEMAS[table].empty_table().to_pandas()
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if part_paths:  # a merged file is already clean; parts may repeat a retried or replayed batch
        df = df.drop_duplicates(subset=list(KEY_COLUMNS[table]), keep="last", ignore_index=True)
    return df


def read_table(run_dir: str, table: str) -> pd.DataFrame:
    """A table of a finished or running run, restricted to its effective trajectory."""
    df = read_raw_table(run_dir, table)
    if table in TRAJECTORY_TABLES:
        df = effective_rows(df, attempt_starts(run_dir), STEP_COLUMN.get(table, "global_step"))
    return df


def merge_parts(run_dir: str, table: str) -> Optional[str]:
    """Replaces the table's parts by one Parquet file of its effective rows."""
    part_paths = sorted(glob.glob(os.path.join(parts_dir(run_dir, table), "part-*.parquet")))
    merged = table_path(run_dir, table)
    if not part_paths and not os.path.exists(merged):
        return None
    df = read_table(run_dir, table)
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
