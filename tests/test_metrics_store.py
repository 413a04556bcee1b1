"""The metrics store as the app uses it: increments by cursor, a bounded window, Parquet
parts merged at the end, and the query methods (info, updates_since, rank_summaries,
plan_history, capabilities). Plain class, real files, no Ray."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from hetero_ray.metrics.store import MetricsStore
from hetero_ray.runs import run_files
from hetero_ray.runs.records import STEP_COLUMNS
from tests.helpers import step_row


def steps(first: int, last: int, ranks=(0, 1), **kw) -> list[dict]:
    return [step_row(g, r, **kw) for g in range(first, last) for r in ranks]


@pytest.fixture
def store(tmp_path):
    s = MetricsStore(str(tmp_path), "exp", max_recent_steps=1000, parquet_flush_interval_s=3600)
    s.begin_attempt(0, num_workers=2)
    return s


# ---- existing behaviour the app relies on ---------------------------------------------------

def test_steps_since_returns_only_new_rows_and_advances_the_cursor(store):
    store.add(steps=steps(0, 5))
    rows, cursor = store.steps_since(0)
    assert len(rows) == 10 and cursor == 10
    store.add(steps=steps(5, 7))
    rows, cursor = store.steps_since(cursor)
    assert [r["global_step"] for r in rows] == [5, 5, 6, 6] and cursor == 14
    assert store.steps_since(cursor) == ([], cursor)


def test_steps_since_respects_the_limit(store):
    store.add(steps=steps(0, 10))
    rows, cursor = store.steps_since(0, limit=3)
    assert len(rows) == 3 and cursor == 3
    rows, cursor = store.steps_since(cursor, limit=100)
    assert len(rows) == 17 and cursor == 20


def test_the_window_is_bounded_and_a_late_reader_gets_the_oldest_rows_held(tmp_path):
    store = MetricsStore(str(tmp_path), "exp", max_recent_steps=10, parquet_flush_interval_s=3600)
    store.begin_attempt(0, num_workers=2)
    store.add(steps=steps(0, 20))  # 40 rows, 10 kept
    rows, cursor = store.steps_since(0)
    assert len(rows) == 10 and cursor == 40
    assert rows[0]["global_step"] == 15


def test_parts_are_written_and_merged_into_one_file(store, tmp_path):
    store.add(steps=steps(0, 3))
    store.flush()
    store.add(steps=steps(3, 5))
    store.flush()
    assert len(os.listdir(run_files.parts_dir(str(tmp_path), "steps"))) == 2
    assert len(run_files.read_table(str(tmp_path), "steps")) == 10  # readers merge parts themselves
    store.finalize()
    assert not os.path.exists(os.path.join(str(tmp_path), run_files.PARTS_DIR))
    merged = run_files.read_table(str(tmp_path), "steps")
    assert list(merged["global_step"]) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


# ---- queries --------------------------------------------------------------------------------

def test_info_names_the_run_and_the_cursor_range(store, tmp_path):
    store.add(steps=steps(0, 3))
    info = store.info()
    assert info["experiment_name"] == "exp" and info["run_dir"] == str(tmp_path)
    assert info["status"] == "running" and info["attempt"] == 0 and info["num_workers"] == 2
    assert info["cursor"] == 6 and info["oldest_cursor"] == 1 and info["steps_held"] == 6
    assert info["global_step"] == 2 and info["attempt_starts"] == {0: 0}
    store.finalize()
    assert store.info()["status"] == "finalized"


def test_updates_since_sends_only_what_is_new_as_arrow(store):
    store.add(steps=steps(0, 2))
    store.add_plan({"plan_version": 0, "first_global_step": 0, "attempt": 0, "local_batch_sizes": [8, 8]})
    first = store.updates_since({})
    assert isinstance(first["steps"], pa.Table) and first["steps"].num_rows == 4
    assert first["steps"].schema.names == list(STEP_COLUMNS)
    assert len(first["plans"]) == 1 and first["missed_steps"] == 0 and not first["more"]
    store.add(steps=steps(2, 3))
    store.add_decision({"global_step": 2, "adopted": False, "reason": "gain below threshold"})
    second = store.updates_since(first["cursors"])
    assert second["steps"].num_rows == 2 and second["plans"] == [] and len(second["decisions"]) == 1
    third = store.updates_since(second["cursors"])
    assert third["steps"].num_rows == 0 and third["decisions"] == [] and third["plans"] == []


def test_updates_since_pages_through_a_backlog(store):
    store.add(steps=steps(0, 10))
    update = store.updates_since({}, limit=8)
    assert update["steps"].num_rows == 8 and update["more"]
    update = store.updates_since(update["cursors"], limit=8)
    assert update["steps"].num_rows == 8 and update["more"]
    update = store.updates_since(update["cursors"], limit=8)
    assert update["steps"].num_rows == 4 and not update["more"]


def test_updates_since_says_how_many_rows_left_memory(tmp_path):
    store = MetricsStore(str(tmp_path), "exp", max_recent_steps=6, parquet_flush_interval_s=3600)
    store.begin_attempt(0, num_workers=2)
    store.add(steps=steps(0, 5))  # 10 rows, 6 kept: rows 1..4 are on disk only
    update = store.updates_since({})
    assert update["missed_steps"] == 4 and update["steps"].num_rows == 6


def test_rank_summaries_cover_the_recent_window_of_the_current_attempt(store):
    store.add(steps=steps(0, 100, ranks=(0,), batch=12, busy=0.01) + steps(0, 100, ranks=(1,), batch=4, busy=0.02))
    summaries = store.rank_summaries(window_steps=10)
    assert [s["rank"] for s in summaries] == [0, 1]
    assert summaries[0]["local_batch_size"] == 12
    assert summaries[0]["samples_per_s"] == pytest.approx(1200)
    assert summaries[1]["samples_per_s"] == pytest.approx(200)
    assert len(store.recent_steps(window_steps=10)) == 20


def test_recent_steps_ignore_a_dead_attempt(store):
    store.add(steps=steps(0, 20))
    store.begin_attempt(10, num_workers=2)
    store.add(steps=steps(10, 12, attempt=1))
    recent = store.recent_steps(window_steps=50)
    assert {r["attempt"] for r in recent} == {1} and len(recent) == 4


def test_plan_history_drops_plans_of_redone_steps(store):
    store.add_plan({"plan_version": 0, "first_global_step": 0, "attempt": 0, "local_batch_sizes": [8, 8]})
    store.add_plan({"plan_version": 1, "first_global_step": 30, "attempt": 0, "local_batch_sizes": [10, 6]})
    store.begin_attempt(20, num_workers=2)  # resumed at step 20: the plan from step 30 was never kept
    store.add_plan({"plan_version": 1, "first_global_step": 20, "attempt": 1, "local_batch_sizes": [9, 7]})
    history = store.plan_history()
    assert [(p["plan_version"], p["first_global_step"], p["attempt"]) for p in history] == [(0, 0, 0), (1, 20, 1)]


def test_capabilities_is_a_list_whether_set_now_or_read_from_disk(store, tmp_path):
    assert store.capabilities() == []
    nodes = [{"node_id": "n1", "devices": [{"kind": "cpu", "name": "x86"}]}]
    store.set_nodes(nodes)
    assert store.capabilities() == nodes
    reopened = MetricsStore(str(tmp_path), "exp")  # an actor restart reads nodes.json ({"nodes": [...]})
    assert reopened.capabilities() == nodes


def test_a_restarted_store_still_knows_the_current_attempts_workers(tmp_path):
    """Each rank's pid and node come with its attempt: a restarted store answers workers()
    as before (the progress line's node-lost check reads it), and a new attempt starts empty."""
    store = MetricsStore(str(tmp_path), "exp", parquet_flush_interval_s=3600)
    store.begin_attempt(0, num_workers=2)
    store.begin_attempt(10, num_workers=2)
    ranks = [{"rank": r, "pid": 100 + r, "node_id": f"n{r}", "hostname": "h", "device": "cpu", "attempt": 1}
             for r in (1, 0)]
    for info in ranks:
        store.register_worker(info)

    reopened = MetricsStore(str(tmp_path), "exp")
    assert reopened.workers() == {0: ranks[1], 1: ranks[0]}
    assert run_files.read_json(os.path.join(str(tmp_path), run_files.ATTEMPTS_FILE))[1]["workers"] == [ranks[1], ranks[0]]
    reopened.begin_attempt(20, num_workers=2)
    assert reopened.workers() == {}
    assert MetricsStore(str(tmp_path), "exp").workers() == {}


def test_a_restarted_store_loses_no_row(tmp_path):
    """Rows wait in memory for the next flush; a store that dies before it (no finalize,
    no flush) must not lose them: the write-ahead log brings them back."""
    from hetero_ray.metrics.store import MetricsStore
    from hetero_ray.runs import run_files

    run_dir = str(tmp_path)
    store = MetricsStore(run_dir, "wal", parquet_flush_interval_s=3600)
    attempt = store.begin_attempt(0, 2)
    rows = [{"epoch": 0, "step": s, "global_step": s, "rank": r, "node_id": "n", "attempt": attempt,
             "local_batch_size": 8, "global_batch_size": 16, "plan_version": 0, "busy_time_s": 0.01,
             "step_time_s": 0.02, "loss": 1.0, "wall_time": 1.0 + s} for s in range(5) for r in range(2)]
    store.add(steps=rows[:6])
    store.flush()  # some rows reach a part...
    store.add(steps=rows[6:], sample_ids=[{"epoch": 0, "step": 4, "global_step": 4, "rank": 0,
                                           "attempt": attempt, "sample_indices": [3, 1, 4]}])
    store.add(steps=rows[6:8])  # ...a retried call delivers a batch twice...
    store.add_plan({"plan_version": 0, "first_global_step": 0, "epoch": 0, "step": 0, "attempt": attempt,
                    "num_workers": 2, "global_batch_size": 16, "local_batch_sizes": [8, 8], "reason": "x",
                    "wall_time": 1.0})
    del store  # ...and the actor dies: nothing else was flushed

    revived = MetricsStore(run_dir, "wal")
    assert len(revived.plans()) == 1
    revived.finalize()
    steps = run_files.read_table(run_dir, "steps")
    assert sorted(zip(steps["global_step"], steps["rank"])) == [(s, r) for s in range(5) for r in range(2)]
    assert sorted(run_files.read_table(run_dir, "sample_ids")["sample_index"]) == [1, 3, 4]
    assert len(run_files.read_table(run_dir, "plans")) == 1
