"""Bad states, each with a clear message and no hang.

- ``--resume`` from a checkpoint that is corrupt or belongs to another model: the driver
  reads it before anything starts (exit 2, nothing written). A worker that still meets a
  bad one (corrupted after those checks) stops the run at once, without Ray Train's
  retries (exit 2).
- ``--resume`` that changes a setting of the training (``--lr``, ``--drop-last``,
  ``--optimizer``…): refused before anything is written, naming each flag with its old
  and new value (exit 2); the settings that may change (more ``--epochs``, other
  ``--num-workers``…) take effect.
- A disk that fills up mid-run (a real, tiny tmpfs): the run stops with a message that
  says what was being written, where, and what to do; the files written before stay
  readable, no temporary or half-written file is left, summary.json (or stdout) says
  ``failed``. Once where the metrics store writes (its write-ahead log or a Parquet
  part), once where Ray Train uploads a checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hetero_ray.builtin.checkpointing import STATE_FILE, load_state, save_state
from hetero_ray.runs import run_files
from hetero_ray.runs.checkpoints import latest_checkpoint_dir, ray_train_dir, registered_checkpoint_names
from tests.cli import run_cli

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The job every checkpoint case resumes: 8 steps of mlp, checkpoints at steps 4 and 8.
JOB = ["--model", "mlp", "--num-samples", "256", "--eval-samples", "64", "--global-batch-size", "32",
       "--num-workers", "2", "--no-profile", "--policy", "static"]


# ---- checkpoints ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_run(ray_session, tmp_path_factory):
    """A real finished run with registered checkpoints; cases copy and damage it."""
    from hetero_ray.builtin.config import TrainConfig
    from hetero_ray.builtin.driver import run_training

    config = TrainConfig(model="mlp", num_samples=256, eval_samples=64, global_batch_size=32, epochs=1, num_workers=2,
                         policy="static", profile=False, checkpoint_every=4, max_failures=0,
                         storage_path=str(tmp_path_factory.mktemp("trained")), name="orig")
    return run_training(config, emit=lambda line: None).run_dir


def copy_run(trained_run: str, output_dir, name: str) -> str:
    run_dir = os.path.join(str(output_dir), name)
    shutil.copytree(trained_run, run_dir)
    return run_dir


def files_of(run_dir: str) -> dict[str, tuple[int, int]]:
    """Every file under the run directory with its size and modification time; not the
    driver lock, which every driver that opens the run takes (and notes its pid in)
    before it checks anything: a run's data, not its lock, must be left unchanged."""
    from hetero_ray.runs.run_lock import LOCK_FILE

    found = {}
    for root, _, names in os.walk(run_dir):
        for name in names:
            if name == LOCK_FILE and root == run_dir:
                continue
            stat = os.stat(os.path.join(root, name))
            found[os.path.relpath(os.path.join(root, name), run_dir)] = (stat.st_size, stat.st_mtime_ns)
    return found


def train_args(output_dir, name: str, *extra: str) -> list[str]:
    """``hetero-ray train`` of JOB; later flags override JOB's (argparse keeps the last)."""
    return ["train", *JOB, "--epochs", "1", "--storage-path", str(output_dir), "--name", name, *extra]


def resume_args(output_dir, name: str, *extra: str) -> list[str]:
    return train_args(output_dir, name, "--resume", *extra)


def other_model_weights(model: str = "simple_cnn") -> dict:
    from hetero_ray.builtin.data import spec_for
    from hetero_ray.builtin.models import build_model

    return build_model(model, spec_for(model)).state_dict()


def truncate(checkpoint_dir: str) -> None:
    with open(os.path.join(checkpoint_dir, STATE_FILE), "r+b") as f:
        f.truncate(1000)


def garbage(checkpoint_dir: str) -> None:
    with open(os.path.join(checkpoint_dir, STATE_FILE), "wb") as f:
        f.write(os.urandom(4096))


def remove_state(checkpoint_dir: str) -> None:
    os.remove(os.path.join(checkpoint_dir, STATE_FILE))


def rewrite(checkpoint_dir: str, **changes) -> None:
    state = load_state(checkpoint_dir)
    for key, value in changes.items():
        setattr(state, key, value(state) if callable(value) else value)
    save_state(checkpoint_dir, state)


def unknown_format(checkpoint_dir: str) -> None:
    path = os.path.join(checkpoint_dir, STATE_FILE)
    payload = torch.load(path, weights_only=True)
    torch.save({**payload, "format_version": 99}, path)


def another_models_checkpoint(checkpoint_dir: str) -> None:
    """state.pt replaced by a simple_cnn run's (its own fingerprint says so)."""
    rewrite(checkpoint_dir, model=other_model_weights(),
            fingerprint=lambda s: {**s.fingerprint, "model": "simple_cnn"})


def another_models_weights(checkpoint_dir: str) -> None:
    """simple_cnn's weights under mlp's fingerprint: only their keys and shapes tell."""
    rewrite(checkpoint_dir, model=other_model_weights())


def other_shapes(checkpoint_dir: str) -> None:
    """mlp's keys, but a hidden layer of another width (another version of the model)."""
    rewrite(checkpoint_dir, model=lambda s: {**s.model, "net.1.weight": torch.zeros(128, 3072)})


def corrupt_config(checkpoint_dir: str) -> None:
    run_dir = os.path.dirname(checkpoint_dir)  # Ray Train's checkpoints sit in the run directory
    with open(os.path.join(run_dir, run_files.CONFIG_FILE), "w") as f:
        f.write('{"model": "mlp", ')


def corrupt_snapshot(checkpoint_dir: str) -> None:
    """Ray Train's snapshot cut short, and no checkpoint before the newest to rebuild it from."""
    run_dir = os.path.dirname(checkpoint_dir)
    for name in os.listdir(run_dir):
        folder = os.path.join(run_dir, name)
        if name.startswith("checkpoint_") and os.path.isdir(folder) and folder != checkpoint_dir:
            shutil.rmtree(folder)
    with open(os.path.join(run_dir, "checkpoint_manager_snapshot.json"), "w") as f:
        f.write('{"latest_checkpoint_result": ')


CHECKPOINT_CASES = [
    # (id, damage, extra flags, message fragments)
    ("truncated state.pt", truncate, [], ["state.pt cannot be read", "corrupt"]),
    ("garbage state.pt", garbage, [], ["state.pt cannot be read"]),
    ("missing state.pt", remove_state, [], ["state.pt cannot be read", "No such file"]),
    ("unknown format", unknown_format, [], ["unknown checkpoint format 99"]),
    ("state.pt of another model's run", another_models_checkpoint, [],
     ["belongs to a different run", "model: checkpoint 'simple_cnn' vs now 'mlp'"]),
    ("another model's weights", another_models_weights, [],
     ["holds weights that do not fit --model mlp", "missing: net.1.weight", "unexpected: features.0.weight"]),
    ("weights of other shapes", other_shapes, [],
     ["do not fit --model mlp", "net.1.weight saved (128, 3072) vs model (256, 3072)"]),
    ("config.json not JSON", corrupt_config, [], ["config.json is not valid JSON"]),
    ("Ray's checkpoint list not JSON", corrupt_snapshot, [],
     ["checkpoint_manager_snapshot.json is not valid JSON", "no checkpoint folder before the newest"]),
]


@pytest.mark.ray
@pytest.mark.parametrize("damage,flags,fragments", [c[1:] for c in CHECKPOINT_CASES],
                         ids=[c[0] for c in CHECKPOINT_CASES])
def test_resume_from_a_bad_checkpoint_fails_before_anything_starts(trained_run, tmp_path, capsys, damage, flags,
                                                                   fragments):
    run_dir = copy_run(trained_run, tmp_path, "damaged")
    if damage is not None:
        damage(latest_checkpoint_dir(run_dir))
    before = files_of(run_dir)
    workers_before = count_train_workers()
    code, out, err = run_cli(resume_args(tmp_path, "damaged", *flags), capsys)
    assert code == 2, out + err
    assert err.startswith("hetero-ray train: error: --resume: "), err
    for fragment in fragments:
        assert fragment in err, err
    assert "Traceback" not in out + err  # no worker ran: nothing but the one line
    assert files_of(run_dir) == before, "the run directory changed"
    assert count_train_workers() == workers_before, "a worker group started: the check was a worker's, not the driver's"


# ---- --resume with other settings -----------------------------------------------------


CHANGED_SETTINGS_CASES = [
    # (id, flags of the resume, what the message names). trained_run used the defaults
    # --lr 0.05 --optimizer sgd --lr-schedule cosine --seed 0; --max-failures 0 keeps a
    # resume that is wrongly let through from retrying a worker that cannot load the state.
    ("--model", ["--model", "simple_cnn"], ["--model was mlp, now simple_cnn"]),
    ("--lr", ["--lr", "0.1"], ["--lr was 0.05, now 0.1"]),
    ("--optimizer", ["--optimizer", "adamw"], ["--optimizer was sgd, now adamw"]),
    ("--drop-last", ["--drop-last"], ["--drop-last was off, now on"]),
    ("--lr-schedule", ["--lr-schedule", "constant"], ["--lr-schedule was cosine, now constant"]),
    ("--global-batch-size", ["--global-batch-size", "64"], ["--global-batch-size was 32, now 64"]),
    ("--num-samples", ["--num-samples", "512"], ["--num-samples was 256, now 512"]),
    ("--eval-samples", ["--eval-samples", "128"], ["--eval-samples was 64, now 128"]),
    ("--seed", ["--seed", "7"], ["--seed was 0, now 7"]),
    ("several, with settings that may change", ["--epochs", "2", "--drop-last", "--num-workers", "1", "--lr", "0.1"],
     ["training: --lr was 0.05, now 0.1; --drop-last was off, now on. Resume"]),
]


@pytest.mark.ray
@pytest.mark.parametrize("flags,fragments", [c[1:] for c in CHANGED_SETTINGS_CASES],
                         ids=[c[0] for c in CHANGED_SETTINGS_CASES])
def test_resume_with_other_training_settings_is_refused(trained_run, tmp_path, capsys, flags, fragments):
    run_dir = copy_run(trained_run, tmp_path, "changed")
    before = files_of(run_dir)
    code, out, err = run_cli(resume_args(tmp_path, "changed", "--max-failures", "0", *flags), capsys)
    assert code == 2, out[-3000:] + err[-3000:]
    assert err.startswith("hetero-ray train: error: --resume cannot change settings that change the training: "), err
    for fragment in fragments:
        assert fragment in err, err
    assert err.rstrip().endswith("Resume with the original values, or start a new run under another "
                                 "--name"), err
    assert "--epochs" not in err and "--num-workers" not in err, "a setting that may change was named"
    assert "Traceback" not in out + err
    assert files_of(run_dir) == before, "the run directory changed (config.json included)"


@pytest.mark.ray
def test_resume_without_config_json_compares_the_checkpoints_settings(trained_run, tmp_path, capsys):
    """config.json lost: the settings recorded in the checkpoint itself decide."""
    run_dir = copy_run(trained_run, tmp_path, "no-config")
    os.remove(os.path.join(run_dir, run_files.CONFIG_FILE))
    before = files_of(run_dir)
    code, out, err = run_cli(resume_args(tmp_path, "no-config", "--max-failures", "0", "--optimizer", "adamw",
                                         "--lr", "0.1"), capsys)
    assert code == 2, out[-3000:] + err[-3000:]
    assert "--resume cannot change settings that change the training: --lr was 0.05, now 0.1; --optimizer was " \
           "sgd, now adamw." in err, err
    assert files_of(run_dir) == before


@pytest.mark.ray
@pytest.mark.slow  # a real resumed run
def test_resume_applies_the_settings_that_may_change_after_a_snapshot_cut_short(trained_run, tmp_path, capsys):
    """The finished 1-epoch, 2-worker run goes on for a second epoch on one worker — after
    Ray Train's snapshot was cut short, as a machine lost while Ray rewrote it leaves it: it
    is rebuilt from the checkpoint folders without the newest (step 8, whose copy the loss
    may have cut), so the resume continues from step 4, and each step is recorded once."""
    run_dir = copy_run(trained_run, tmp_path, "longer")
    with open(os.path.join(run_dir, "checkpoint_manager_snapshot.json"), "w"):
        pass  # Ray truncates, then writes
    code, out, err = run_cli(resume_args(tmp_path, "longer", "--epochs", "2", "--num-workers", "1",
                                         "--max-failures", "0", "--no-verify-checksums"), capsys)
    assert code == 0, out[-3000:] + err[-3000:]
    assert "checkpoint_manager_snapshot.json was cut short" in out and "checkpoint_000000004" in out, out[-3000:]
    steps = run_files.read_table(run_dir, "steps")
    assert sorted(steps["global_step"].unique()) == list(range(16)), "the second epoch was not trained"
    assert not steps.duplicated(["global_step", "rank"]).any()
    assert set(steps[steps["global_step"] >= 4]["rank"]) == {0}, "the resumed run did not use one worker"
    with open(os.path.join(run_dir, run_files.ATTEMPTS_FILE)) as f:
        attempts = json.load(f)
    assert [(a["num_workers"], a["start_global_step"]) for a in attempts] == [(2, 0), (1, 4)], attempts
    with open(os.path.join(run_dir, run_files.SUMMARY_FILE)) as f:
        summary = json.load(f)
    assert summary["status"] == "finished" and summary["epochs_completed"] == 2, summary
    with open(os.path.join(run_dir, run_files.CONFIG_FILE)) as f:
        config = json.load(f)
    assert (config["epochs"], config["num_workers"], config["verify_checksums"]) == (2, 1, False)


def test_every_setting_is_compared_or_may_change_on_resume():
    """One list decides: every TrainConfig setting is either allowed to change on a resume,
    names the run, or is compared (and recorded in every checkpoint's fingerprint)."""
    from hetero_ray.builtin.config import (
        RESUME_MAY_CHANGE, RUN_IDENTITY, TrainConfig, changed_on_resume, resume_fixed_fields, setting_names,
    )
    from hetero_ray.builtin.checkpointing import run_fingerprint

    fields = list(setting_names())
    assert RESUME_MAY_CHANGE <= set(fields) and RUN_IDENTITY <= set(fields), "a listed name is not a field"
    assert not RESUME_MAY_CHANGE & RUN_IDENTITY
    fixed = resume_fixed_fields()
    assert set(fixed) | RESUME_MAY_CHANGE | RUN_IDENTITY == set(fields)
    assert {"model", "dataset", "global_batch_size", "lr", "optimizer", "lr_schedule", "drop_last", "seed",
            "num_samples"} <= set(fixed)
    config = TrainConfig(name="a")
    assert set(run_fingerprint(config)) == set(fixed)
    recorded = config.to_dict()
    may_change = dict(epochs=5, max_steps=3, num_workers=4, min_workers=2, policy="static", batch_split=[16] * 4,
                      verify_checksums=False, profile=False, checkpoint_every=7, max_failures=0,
                      allow_non_finite_loss=True, name="b", storage_path="elsewhere", resume=True)
    assert changed_on_resume(recorded, TrainConfig(**may_change)) == []
    assert changed_on_resume(recorded, TrainConfig(name="a", drop_last=True, lr=0.5)) == [
        "--lr was 0.05, now 0.5", "--drop-last was off, now on"]
    assert changed_on_resume({"model": "simple_cnn"}, TrainConfig(name="a", lr=0.5)) == [], \
        "a setting an older run did not record is not compared"


def count_train_workers() -> int:
    """Ray Train worker actors this session's cluster has ever started (dead ones too)."""
    from ray.util.state import list_actors

    return len(list_actors(filters=[("class_name", "=", "RayTrainWorker")], limit=10_000,
                           raise_on_missing_output=False))


@pytest.mark.ray
@pytest.mark.slow  # a real run up to the worker's failure
def test_a_worker_meeting_a_bad_checkpoint_stops_the_run_without_retries(trained_run, tmp_path, capsys,
                                                                         monkeypatch):
    from hetero_ray.builtin import preflight

    run_dir = copy_run(trained_run, tmp_path, "corrupted-later")
    truncate(latest_checkpoint_dir(run_dir))
    # The file is damaged after the driver's checks passed (as by a crash of the disk or a
    # person): the driver's own read of it is what is skipped here.
    monkeypatch.setattr(preflight, "check_checkpoint_loads", lambda checkpoint_dir, config: None)
    workers_before = count_train_workers()
    started = time.monotonic()
    code, out, err = run_cli(resume_args(tmp_path, "corrupted-later", "--epochs", "2", "--max-failures", "3"),
                             capsys)
    took_s = time.monotonic() - started
    assert code == 2, out[-3000:] + err[-3000:]
    message = final_message(err)
    assert message.startswith("hetero-ray train: error: checkpoint "), err[-3000:]
    assert "state.pt cannot be read" in message and "without retrying" in message
    assert run_dir in message
    assert count_train_workers() - workers_before == 2, "Ray Train retried the worker group"
    with open(os.path.join(run_dir, run_files.SUMMARY_FILE)) as f:
        summary = json.load(f)
    assert summary["status"] == "failed" and "cannot be read" in summary["error"]
    print(f"\nbad checkpoint met by the workers: exit 2 after {took_s:.1f} s (one worker group, no retries)")


# ---- disk full ------------------------------------------------------------------------


@contextlib.contextmanager
def tiny_disk(path: str, size: str):
    """A real filesystem of ``size`` at ``path`` (tmpfs); skips where mounting is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("the disk-full tests mount a small tmpfs, which needs root")
    os.makedirs(path, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); the disk-full tests need one")
    try:
        yield path
    finally:
        if subprocess.run(["umount", path], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", path], capture_output=True)  # a process still holds a file


def fill(path: str) -> int:
    """Writes a ballast file until the filesystem is full; returns the bytes written."""
    written = 0
    with open(os.path.join(path, "ballast"), "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                written += f.write(b"\0" * (1 << 16))
    return written


def fill_when(mount: str, ready, timeout_s: float = 240) -> dict:
    """Fills the disk from a thread once ``ready()`` is true; returns what it saw."""
    seen: dict = {}

    def watch():
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # files not there yet, or being replaced
                if ready():
                    seen["bytes"] = fill(mount)
                    seen["time"] = time.monotonic()
                    return
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    return seen


RAY_ACTOR_LINE = re.compile(r"^(\x1b\[\d+m)?\(\w+ pid=\d+")  # a line of an actor's log, relayed by Ray


def driver_lines(text: str) -> list[str]:
    """What the driver itself printed (Ray relays the workers' logs into the same streams)."""
    return [line for line in text.splitlines() if not RAY_ACTOR_LINE.match(line)]


def final_message(err: str) -> str:
    """The CLI's last word: the one line a person reads to know what happened."""
    return next((line for line in reversed(err.splitlines()) if line.startswith("hetero-ray train:")), "")


def assert_failed_cleanly(run_dir: str, out: str, err: str) -> None:
    """The part of the standard shared by every disk-full case."""
    message = final_message(err)
    assert message.startswith("hetero-ray train: training stopped: "), err[-3000:]
    # One line, no traceback of the driver's own (Ray Train logs the workers' errors and
    # the collateral ones of its shutdown; those lines carry the worker's prefix).
    assert not [line for line in driver_lines(out + err) if "Traceback" in line], err[-3000:]
    for fragment in ("disk full at", "free space or choose another --storage-path", f"are in {run_dir}"):
        assert fragment in message, message
    # Nothing half-written is visible: no temporary file, no unregistered checkpoint.
    leftovers = [os.path.join(root, name) for root, _, names in os.walk(run_dir) for name in names
                 if name.startswith(".tmp-") or name.endswith(".tmp")]
    assert not leftovers, leftovers
    train_dir = ray_train_dir(run_dir)
    names = os.listdir(train_dir) if os.path.isdir(train_dir) else []
    folders = {n for n in names if n.startswith("checkpoint_") and os.path.isdir(os.path.join(train_dir, n))}
    assert folders <= registered_checkpoint_names(run_dir), "a checkpoint cut short is still there"
    for folder in folders:  # the checkpoints kept are whole
        load_state(os.path.join(train_dir, folder))
    # Every Parquet file written before the disk filled opens.
    for root, _, names in os.walk(run_dir):
        for name in names:
            if name.endswith(".parquet"):
                pq.read_table(os.path.join(root, name))
    summary_path = os.path.join(run_dir, run_files.SUMMARY_FILE)
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
        assert summary["status"] == "failed" and "disk full at" in summary["error"], summary
    else:
        assert "summary.json could not be written" in out and "status: failed" in out, out[-3000:]


@pytest.mark.ray
@pytest.mark.slow  # a real run
def test_disk_full_where_the_metrics_store_writes(ray_session, tmp_path, capsys):
    """mlp slowed to a quarter speed, 1024 steps; the disk fills once 20 steps are on disk.
    The run is long enough that it cannot reach its final checkpoint (which would meet the
    full disk first) in the seconds the store's failure takes to stop it."""
    with tiny_disk(str(tmp_path / "disk"), "48m") as mount:
        run_dir = os.path.join(mount, "runs", "full")
        seen = fill_when(mount, lambda: run_files.read_table(run_dir, "steps")["global_step"].nunique() >= 20)
        code, out, err = run_cli(train_args(os.path.join(mount, "runs"), "full", "--num-samples", "32768",
                                            "--checkpoint-every", "1000", "--emulate-speeds", "0.25,0.25"), capsys)
        ended = time.monotonic()
        assert "time" in seen, "the disk was never filled:\n" + out[-3000:] + err[-3000:]
        assert code == 1, out[-3000:] + err[-3000:]
        assert_failed_cleanly(run_dir, out, err)
        # Which write meets the full disk first depends on timing: the log or a table's part.
        assert re.search(r"while writing the (write-ahead log|\w+ part) ", final_message(err)), err[-3000:]
        steps = run_files.read_table(run_dir, "steps")
        on_disk = sorted(steps["global_step"].unique())
        assert len(on_disk) >= 20 and on_disk == list(range(len(on_disk))), "steps before the fill were lost"
        assert len(on_disk) < 1024, "training went on to the end"
        assert f"up to step {len(on_disk)} " in final_message(err)
        # It stopped at the store's write, not later at the final checkpoint (the regex above);
        # how soon is a figure, not a check.
        stopped_s = ended - seen["time"]
        print(f"\nstore disk full: stopped {stopped_s:.1f} s after the disk filled; {len(on_disk)} steps on disk")


@pytest.mark.ray
@pytest.mark.slow
def test_disk_full_where_ray_train_uploads_a_checkpoint(tmp_path):
    """The store is kept from writing (records every 60 s) so that the next checkpoint is
    the first write to meet the full disk; a subprocess, for its own Ray and exit code."""
    with tiny_disk(str(tmp_path / "disk"), "48m") as mount:
        run_dir = os.path.join(mount, "runs", "full-ckpt")
        seen = fill_when(mount, lambda: latest_checkpoint_dir(run_dir) is not None)
        env = {**os.environ, "RAY_ADDRESS": "", "HETERO_RAY_PROGRESS_INTERVAL_S": "1",
               "HETERO_RAY_RECORD_FLUSH_INTERVAL_S": "60", "HETERO_RAY_PARQUET_FLUSH_INTERVAL_S": "60"}
        completed = subprocess.run(
            [sys.executable, "-m", "hetero_ray", *train_args(os.path.join(mount, "runs"), "full-ckpt", "--num-samples",
                                                             "8192", "--checkpoint-every", "10", "--emulate-speeds",
                                                             "0.25,0.25", "--max-failures", "3")],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
        ended = time.monotonic()
        out, err = completed.stdout, completed.stderr
        assert "time" in seen, "the disk was never filled:\n" + out[-3000:] + err[-3000:]
        assert completed.returncode == 1, out[-3000:] + err[-3000:]
        assert_failed_cleanly(run_dir, out, err)
        assert "while saving a checkpoint" in final_message(err)
        assert "restarted" not in out, "Ray Train retried on a full disk"
        stopped_s = ended - seen["time"]  # a figure, not a check: the message and no retry are the checks
        print(f"\ncheckpoint disk full: the run ended {stopped_s:.1f} s after the disk filled")


# ---- the pieces, on a full disk, without Ray --------------------------------------------


def step_row(global_step: int, rank: int) -> dict:
    return {"epoch": 0, "step": global_step, "global_step": global_step, "rank": rank, "attempt": 0,
            "plan_version": 0, "local_batch_size": 16, "node_id": "n", "busy_time_s": 0.01, "step_time_s": 0.02,
            "wall_time": time.time(), "loss": 1.0}


def test_atomic_writes_leave_no_temporary_file_on_a_full_disk(tmp_path):
    with tiny_disk(str(tmp_path / "disk"), "1m") as mount:
        json_path, table_path = os.path.join(mount, "a.json"), os.path.join(mount, "t.parquet")
        run_files.write_json(json_path, {"kept": True})
        run_files.write_table(table_path, pa.table({"x": [1, 2, 3]}))
        fill(mount)
        with pytest.raises(OSError) as full_json:
            run_files.write_json(json_path, {"kept": False, "pad": "x" * 200_000})
        with pytest.raises(OSError) as full_table:
            run_files.write_table(table_path, pa.table({"x": list(range(200_000))}))
        assert full_json.value.errno == errno.ENOSPC and full_table.value.errno == errno.ENOSPC  # the disk, not another error
        assert sorted(os.listdir(mount)) == ["a.json", "ballast", "t.parquet"]  # no .tmp-*
        assert run_files.read_json(json_path) == {"kept": True}
        assert pq.read_table(table_path).column("x").to_pylist() == [1, 2, 3]


def test_the_store_stops_writing_on_a_full_disk_and_says_where(tmp_path):
    from hetero_ray.metrics.store import MetricsStore

    with tiny_disk(str(tmp_path / "disk"), "1m") as mount:
        run_dir = os.path.join(mount, "run")
        os.makedirs(run_dir)
        store = MetricsStore(run_dir, "full", parquet_flush_interval_s=3600)
        store.begin_attempt(0, 2)
        store.add(steps=[step_row(s, r) for s in range(10) for r in range(2)])
        store.flush()
        fill(mount)
        for first in range(10, 2000, 10):  # until a write meets the full disk
            store.add(steps=[step_row(s, r) for s in range(first, first + 10) for r in range(2)])
            store.flush()
            if store.failure():
                break
        failure = store.failure()
        assert failure and failure["disk_full"], failure
        assert failure["message"].startswith("disk full at " + run_dir), failure
        assert failure["what"] in ("the write-ahead log", "the steps part")
        store.add(steps=[step_row(5000, 0)])  # after the failure: nothing held for the disk, no raise
        assert store.memory()["pending_rows"] == 0
        assert store.info()["status"] == "failed"
        store.finalize()  # merges what it can; never raises for the disk it already reported
        steps = run_files.read_table(run_dir, "steps")
        assert set(range(10)) <= set(steps["global_step"]), "the part written before the disk filled is lost"
        leftovers = [n for _, _, names in os.walk(run_dir) for n in names if n.startswith(".tmp-")]
        assert not leftovers


def test_failures_become_one_message_a_person_can_act_on():
    from ray.train import ControllerError, WorkerGroupError

    from hetero_ray.errors import TrainingFailed, UserError
    from hetero_ray.metrics.store import StoreWriteFailed
    from hetero_ray.runtime.failures import failure_for_user

    bad = UserError("checkpoint /r/ray_train/checkpoint_1/state.pt cannot be read (…)")
    for error in (ControllerError(bad), WorkerGroupError("rank 0 failed", {0: bad, 1: RuntimeError("gloo")})):
        failure = failure_for_user(error, "/r", 12)
        assert isinstance(failure, UserError)
        assert str(failure).startswith(str(bad)) and "without retrying" in str(failure) and "step 12" in str(failure)

    store = failure_for_user(ControllerError(StoreWriteFailed("disk full at /r/parts/steps/part-00000003.parquet "
                                                              "while writing the steps part (0.0 MiB free there)")),
                             "/r", 40)
    assert isinstance(store, TrainingFailed)
    assert str(store) == ("training stopped: the metrics store could not write: disk full at "
                          "/r/parts/steps/part-00000003.parquet while writing the steps part (0.0 MiB free there); "
                          "free space or choose another --storage-path; the run's files up to step 40 are in /r")

    upload = failure_for_user(WorkerGroupError("rank 0 failed", {0: OSError(errno.ENOSPC, "No space left on device")}),
                              "/r", 30)
    assert isinstance(upload, TrainingFailed)
    assert "disk full at /r while saving a checkpoint" in str(upload)

    other = failure_for_user(WorkerGroupError("rank 1 failed", {1: RuntimeError("gloo timeout")}), "/r", 3)
    assert isinstance(other, TrainingFailed) and str(other).startswith("training failed: ")


def test_fit_joins_the_cluster_ray_start_runs_here_only_while_it_answers(monkeypatch):
    """HeteroTrainer.fit() with no address joins the cluster `ray start` left its address
    for, as ray.init() does; an address file left by a stopped cluster starts a Ray of our own."""
    import socket

    import ray._private.services

    from hetero_ray.runtime.cluster import running_local_cluster

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    address = f"127.0.0.1:{listening.getsockname()[1]}"
    monkeypatch.setattr(ray._private.services, "find_bootstrap_address", lambda temp_dir: address)
    try:
        assert running_local_cluster() == address
    finally:
        listening.close()
    assert running_local_cluster() is None  # the same file, nothing listening any more
    monkeypatch.setattr(ray._private.services, "find_bootstrap_address", lambda temp_dir: None)
    assert running_local_cluster() is None


def test_a_snapshot_rebuilt_from_the_folders_is_one_ray_train_restores(tmp_path):
    """Three checkpoint folders, Ray Train's snapshot cut short: the rebuilt one lists the
    two before the newest, in order, in Ray Train's own schema; the newest is removed."""
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import _CheckpointManagerState

    from hetero_ray.runs.checkpoints import latest_checkpoint_dir, rebuild_torn_snapshot

    for step, count in ((4, 0), (8, 0), (8, 1)):
        folder = tmp_path / (f"checkpoint_{step:09d}" + (f"_{count}" if count else ""))
        folder.mkdir()
        (folder / "position.json").write_text(json.dumps({"position": {"epoch": 0, "step": step, "global_step": step}}))
    (tmp_path / "checkpoint_000000002").mkdir()  # no position: not hetero_ray's, not listed
    (tmp_path / "checkpoint_manager_snapshot.json").write_text('{"checkpoint_results": [')

    assert rebuild_torn_snapshot(str(tmp_path)) == str(tmp_path / "checkpoint_000000008")
    snapshot = _CheckpointManagerState.model_validate_json((tmp_path / "checkpoint_manager_snapshot.json").read_text())
    assert [r.checkpoint_dir_name for r in snapshot.checkpoint_results] == ["checkpoint_000000004",
                                                                           "checkpoint_000000008"]
    assert snapshot.latest_checkpoint_result.metrics["global_step"] == 8 and snapshot.current_report_index == 2
    assert latest_checkpoint_dir(str(tmp_path)) == str(tmp_path / "checkpoint_000000008")
    assert not (tmp_path / "checkpoint_000000008_1").exists()
