"""Files a crash can tear: every file is fsynced before its rename, a torn (0-byte) part
is set aside and its rows come back from the write-ahead log, the store's constructor
never dies on a torn file, rows after finalising leave no stray part, and finish_run
writes a summary whatever piece fails. Plain classes, real files, no Ray."""

from __future__ import annotations

import json
import logging
import os

import pandas as pd
import pyarrow as pa

from hetero_ray.metrics.store import MetricsStore
from hetero_ray.runs import run_files
from hetero_ray.runs.records import SCHEMAS
from hetero_ray.runs.writer import WAL_FILE
from hetero_ray.runtime.finishing import Outcome, finish_run
from tests.helpers import step_row

PLAN = {"plan_version": 0, "first_global_step": 0, "epoch": 0, "step": 0, "attempt": 0, "num_workers": 2,
        "global_batch_size": 16, "local_batch_sizes": [8, 8], "reason": "x", "wall_time": 1.0}


def _pairs(df: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted(zip(df["global_step"].astype(int), df["rank"].astype(int)))


def _crash_between_rename_and_log_truncation(run_dir: str, rows: list[dict]) -> None:
    """What a power loss after a part's rename and before its write-ahead log was emptied
    leaves when the part's data never reached the disk: 0-byte parts, full log."""
    store = MetricsStore(run_dir, "torn", parquet_flush_interval_s=3600)
    store.begin_attempt(0, 2)
    store.add(steps=rows)
    store.add_plan(dict(PLAN))
    del store  # nothing flushed: every row is in the log only
    for table in ("steps", "plans"):
        os.makedirs(run_files.parts_dir(run_dir, table), exist_ok=True)
        open(os.path.join(run_files.parts_dir(run_dir, table), "part-00000001.parquet"), "wb").close()


def test_a_zero_byte_part_is_set_aside_and_its_rows_come_back_from_the_log(tmp_path, caplog):
    run_dir = str(tmp_path)
    rows = [step_row(g, r) for g in range(4) for r in range(2)]
    _crash_between_rename_and_log_truncation(run_dir, rows)

    with caplog.at_level(logging.WARNING):
        store = MetricsStore(run_dir, "torn")  # the old code raised here (pyarrow: file is empty)
    assert store.failure() is None
    assert len(store.plans()) == 1
    assert "part-00000001.parquet could not be read" in caplog.text
    torn = os.path.join(run_files.parts_dir(run_dir, "steps"), "part-00000001.parquet" + run_files.TORN_SUFFIX)
    assert os.path.exists(torn)  # kept as evidence, never read again

    store.finalize()
    assert _pairs(run_files.read_table(run_dir, "steps")) == [(g, r) for g in range(4) for r in range(2)]
    assert len(run_files.read_table(run_dir, "plans")) == 1


def test_readers_skip_a_torn_part_and_name_it(tmp_path, caplog):
    run_dir = str(tmp_path)
    run_files.write_part(run_dir, "steps", pa.Table.from_pylist([step_row(0, 0)], schema=SCHEMAS["steps"]), 1)
    open(os.path.join(run_files.parts_dir(run_dir, "steps"), "part-00000002.parquet"), "wb").close()
    with caplog.at_level(logging.WARNING):
        df = run_files.read_table(run_dir, "steps")
    assert _pairs(df) == [(0, 0)]
    assert "part-00000002.parquet" in caplog.text


def test_a_torn_merged_file_is_the_stores_failure_not_a_dead_constructor(tmp_path):
    run_dir = str(tmp_path)
    open(run_files.table_path(run_dir, "plans"), "wb").close()
    store = MetricsStore(run_dir, "torn")
    failure = store.failure()
    assert failure is not None
    assert run_files.table_path(run_dir, "plans") in failure["message"]
    assert "cut short" in failure["message"]
    store.begin_attempt(0, 1)  # a live reader still gets answers
    assert store.info()["status"] == "failed"


def test_a_torn_attempts_file_is_the_stores_failure(tmp_path):
    run_dir = str(tmp_path)
    open(os.path.join(run_dir, run_files.ATTEMPTS_FILE), "w").close()
    store = MetricsStore(run_dir, "torn")
    assert run_files.ATTEMPTS_FILE in store.failure()["message"]


def test_files_are_fsynced_before_their_rename_and_the_folder_after(tmp_path, monkeypatch):
    """The rename is the commit point only if the data is on disk before it, and the
    rename itself only once the folder is synced."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src, dst):
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    run_files.write_part(str(tmp_path), "steps", pa.Table.from_pylist([step_row(0, 0)], schema=SCHEMAS["steps"]), 1)
    assert events == ["fsync-file", "rename", "fsync-dir"]
    events.clear()
    run_files.write_json(str(tmp_path / "x.json"), {"a": 1})
    assert events == ["fsync-file", "rename", "fsync-dir"]


def test_the_log_is_emptied_only_after_the_part_is_durable(tmp_path, monkeypatch):
    run_dir = str(tmp_path)
    store = MetricsStore(run_dir, "order", parquet_flush_interval_s=3600)
    store.begin_attempt(0, 1)
    store.add(steps=[step_row(0, 0)])
    wal = os.path.join(run_dir, run_files.PARTS_DIR, WAL_FILE)
    seen: list[tuple[str, int]] = []
    real_fsync_dir = run_files.fsync_dir

    def fsync_dir(directory):
        seen.append((directory, os.path.getsize(wal)))  # the log still holds the rows here
        real_fsync_dir(directory)

    monkeypatch.setattr(run_files, "fsync_dir", fsync_dir)
    store.flush()
    assert seen and seen[0][0] == run_files.parts_dir(run_dir, "steps") and seen[0][1] > 0
    assert os.path.getsize(wal) == 0


def test_rows_after_finalising_leave_no_stray_part(tmp_path, caplog):
    run_dir = str(tmp_path)
    store = MetricsStore(run_dir, "late", parquet_flush_interval_s=0)
    store.begin_attempt(0, 1)
    store.add(steps=[step_row(0, 0)])
    store.finalize()
    with caplog.at_level(logging.WARNING):
        store.add(steps=[step_row(1, 0)])  # a worker's last fire-and-forget batch, after the end
        store.add_epoch({"epoch": 0, "attempt": 0, "global_step": 1, "steps": 1, "samples": 8, "wall_time": 1.0})
        store.flush()
    assert not os.path.exists(os.path.join(run_dir, run_files.PARTS_DIR))
    assert _pairs(run_files.read_table(run_dir, "steps")) == [(0, 0)]
    assert "after the run's tables were merged" in caplog.text


class _Checkpoint:
    def as_directory(self):
        raise RuntimeError("checkpoint storage went away")


class _Result:
    checkpoint = _Checkpoint()


def test_finish_run_writes_a_summary_whatever_piece_fails(tmp_path):
    """No store or planner to talk to (their calls fail), a torn merged table, a final
    model that cannot be read: each is said, none is raised, and summary.json holds what
    could be read."""
    run_dir = str(tmp_path)
    run_files.write_part(run_dir, "steps",
                         pa.Table.from_pylist([step_row(g, r) for g in range(3) for r in range(2)],
                                              schema=SCHEMAS["steps"]), 1)
    open(run_files.table_path(run_dir, "epochs"), "wb").close()  # torn
    lines: list[str] = []
    summary, failure = finish_run(run_dir, store=None, planner=None, outcome=Outcome(_Result(), wall_time_s=1.0),
                                  summary_base={"experiment_name": "x"}, emit=lines.append,
                                  final_model=lambda directory: {})
    with open(os.path.join(run_dir, run_files.SUMMARY_FILE)) as f:
        on_disk = json.load(f)
    assert on_disk["status"] == "failed" and summary["status"] == "failed"
    assert on_disk["global_steps"] == 3
    assert "checkpoint storage went away" in on_disk["error"]
    assert failure is not None
    assert any("epochs" in line for line in lines)


def test_finish_run_survives_a_summary_that_cannot_be_built(tmp_path, monkeypatch):
    from hetero_ray.runtime import finishing

    def broken(*args, **kwargs):
        raise KeyError("a column the summary needs")

    monkeypatch.setattr(finishing, "build_summary", broken)
    run_dir = str(tmp_path)
    run_files.write_part(run_dir, "steps", pa.Table.from_pylist([step_row(0, 0)], schema=SCHEMAS["steps"]), 1)
    lines: list[str] = []
    summary, failure = finish_run(run_dir, None, None, Outcome(None, 1.0, interrupted_by="SIGTERM"),
                                  {"experiment_name": "x"}, emit=lines.append)
    with open(os.path.join(run_dir, run_files.SUMMARY_FILE)) as f:
        on_disk = json.load(f)
    assert on_disk["status"] == "interrupted" and on_disk["global_steps"] == 1 and failure is None
    assert any("summarising the run failed" in line for line in lines)


def test_the_dashboards_table_cache_skips_a_torn_part_and_reads_the_rest(tmp_path, caplog):
    """A part torn by a crash, before a metrics store set it aside, and one set aside as .torn:
    the app reads every other part (the old cache raised on the torn part)."""
    from hetero_ray.runs.table_cache import TableCache

    run_dir = str(tmp_path)
    for sequence, step in ((1, 0), (3, 2)):
        run_files.write_part(run_dir, "steps", pa.Table.from_pylist([step_row(step, 0)], schema=SCHEMAS["steps"]),
                             sequence)
    parts = run_files.parts_dir(run_dir, "steps")
    open(os.path.join(parts, "part-00000002.parquet"), "wb").close()
    with open(os.path.join(parts, "part-00000000.parquet" + run_files.TORN_SUFFIX), "wb") as f:
        f.write(b"PAR1 cut short")
    cache = TableCache()
    with caplog.at_level(logging.WARNING):
        df, _ = cache.read(run_dir, "steps")
    assert _pairs(df) == [(0, 0), (2, 0)]
    assert "part-00000002.parquet" in caplog.text
    # A store on the run sets the part aside and writes its rows again from the log.
    os.replace(os.path.join(parts, "part-00000002.parquet"), os.path.join(parts, "part-00000002.parquet.torn"))
    run_files.write_part(run_dir, "steps", pa.Table.from_pylist([step_row(1, 0)], schema=SCHEMAS["steps"]), 4)
    df, _ = cache.read(run_dir, "steps")
    assert _pairs(df) == [(0, 0), (1, 0), (2, 0)]


def test_a_table_written_before_a_column_was_added_merges_with_the_column_null(tmp_path):
    """A run resumed by a newer version that added no row to the table: its merged file,
    merged again at the end, lacks the newest column."""
    run_dir = str(tmp_path)
    old_schema = SCHEMAS["decisions"].remove(SCHEMAS["decisions"].get_field_index("rest_of_step_s"))
    row = {"global_step": 8, "policy": "optimal", "adopted": False, "reason": "keep", "plan_version": 0,
           "local_batch_sizes": [8, 8], "predicted_step_time_s": 0.1, "wall_time": 1.0}
    run_files.write_table(run_files.table_path(run_dir, "decisions"),
                          pa.Table.from_pylist([row], schema=old_schema))

    run_files.merge_parts(run_dir, "decisions")

    merged = run_files.read_table(run_dir, "decisions")
    assert merged["global_step"].tolist() == [8] and pd.isna(merged["rest_of_step_s"].iloc[0])
