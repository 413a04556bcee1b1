"""The run's tables on URI storage follow each checkpoint, and come back for a resume
elsewhere (hetero_ray/runs/remote_copy.py), on a real file:// filesystem through pyarrow.fs."""

from __future__ import annotations

import os

from hetero_ray.runs import remote_copy, storage


def _files(root) -> set[str]:
    return {os.path.relpath(os.path.join(folder, f), root) for folder, _, files in os.walk(root) for f in files}


def _write(path, text="x") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_upload_mirrors_the_tables_and_leaves_ray_trains_files(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "bucket" / "run"
    _write(local / "attempts.json")
    _write(local / "parts" / "steps" / "part-000001.parquet")
    _write(local / ".hetero_ray.lock")
    _write(remote / "checkpoint_000000003" / "state.pt")  # Ray Train's, written there directly
    _write(remote / "checkpoint_manager_snapshot.json")
    remote_copy.upload_tables(str(local), f"file://{remote}")
    assert _files(remote) == {"attempts.json", "parts/steps/part-000001.parquet", "checkpoint_000000003/state.pt",
                              "checkpoint_manager_snapshot.json"}

    os.remove(local / "parts" / "steps" / "part-000001.parquet")  # merged at the end
    _write(local / "steps.parquet")
    remote_copy.upload_tables(str(local), f"file://{remote}")
    assert _files(remote) == {"attempts.json", "steps.parquet", "checkpoint_000000003/state.pt",
                              "checkpoint_manager_snapshot.json"}, "a merged part stayed beside its table"


def test_a_resume_elsewhere_takes_the_tables_back_but_not_the_checkpoints(tmp_path):
    remote = tmp_path / "bucket"
    _write(remote / "run" / "attempts.json", "[]")
    _write(remote / "run" / "parts" / "steps" / "part-000001.parquet")
    _write(remote / "run" / "checkpoint_000000003" / "state.pt")
    _write(remote / "run" / "checkpoint_manager_snapshot.json")
    run = storage.resolve(f"file://{remote}", "run", str(tmp_path / "elsewhere"))
    assert storage.take_back_tables(run) == ["attempts.json", "parts"]
    assert _files(run.run_dir) == {"attempts.json", "parts/steps/part-000001.parquet"}
    assert storage.take_back_tables(run) == []  # this machine has them now: its own copy wins


def test_a_copy_cut_short_leaves_the_uris_table_whole(tmp_path, monkeypatch):
    """A driver killed while a table is on its way leaves the URI's previous copy of it
    whole: it was overwritten in place before, and the rows merged into it were lost."""
    import pyarrow.fs

    local, remote = tmp_path / "local", tmp_path / "bucket" / "run"
    _write(local / "steps.parquet", "rows 0 to 9")
    remote_copy.upload_tables(str(local), f"file://{remote}")
    _write(local / "steps.parquet", "rows 0 to 19")

    real_copy = pyarrow.fs.copy_files

    def killed_half_way(source, destination, **kwargs):  # writes half the file, then the crash
        with open(source) as f:
            text = f.read()
        _write(destination.removeprefix("file://"), text[: len(text) // 2])
        raise KeyboardInterrupt("killed mid-copy")

    monkeypatch.setattr(pyarrow.fs, "copy_files", killed_half_way)
    try:
        remote_copy.upload_tables(str(local), f"file://{remote}")
    except KeyboardInterrupt:
        pass
    assert (remote / "steps.parquet").read_text() == "rows 0 to 9"

    monkeypatch.setattr(pyarrow.fs, "copy_files", real_copy)
    remote_copy.upload_tables(str(local), f"file://{remote}")  # the next checkpoint's copy
    assert _files(remote) == {"steps.parquet"}, "the cut-off copy's temporary file stayed"
    assert (remote / "steps.parquet").read_text() == "rows 0 to 19"


def test_a_fit_that_looks_before_ray_trains_snapshot_is_written_still_takes_the_tables_back(tmp_path):
    """The tables reach the URI only after a checkpoint was registered; a crashed driver's
    Ray Train controller may write its snapshot a moment after the next fit() looked."""
    remote = tmp_path / "bucket"
    run = storage.resolve(f"file://{remote}", "run", str(tmp_path / "elsewhere"))
    assert not run.continues_a_run()  # a new run
    _write(remote / "run" / "attempts.json", "[]")
    _write(remote / "run" / "checkpoint_000000003" / "state.pt")
    assert not run.has_ray_snapshot() and run.continues_a_run()


def test_the_store_says_when_the_tables_did_not_reach_the_uri(tmp_path):
    """checkpoint_reached is False when the copy fails, so that rank 0 leaves the checkpoint
    unreported (training/rank/loop_report.py): a resume from it would lack its steps' rows."""
    from hetero_ray.metrics.store import MetricsStore

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the run's folder would go")
    for name in ("run-a", "run-b"):
        (tmp_path / name).mkdir()  # the driver makes the run's folder before its store
    good = MetricsStore(str(tmp_path / "run-a"), "a", remote_run_uri=f"file://{tmp_path / 'bucket' / 'a'}")
    bad = MetricsStore(str(tmp_path / "run-b"), "b", remote_run_uri=f"file://{blocker / 'b'}")
    for store in (good, bad):
        store.begin_attempt(0, 1)
    assert good.checkpoint_reached() is True
    assert bad.checkpoint_reached() is False
