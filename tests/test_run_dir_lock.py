"""One driver per run directory: a lock held for the driver's lifetime, released by the
kernel when the driver ends however it ends.

The first tests hold the lock from another real process and try the three ways in (the
lock itself, ``hetero-ray train --resume``, ``HeteroTrainer.fit()``): each is refused
before it writes, naming the holder's pid and host and what to do; SIGKILL of the holder
frees the directory. The last one runs real CLI drivers on one run directory: a second one
while the first runs, then a resume after the first was SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hetero_ray import HeteroConfig, HeteroTrainer
from hetero_ray.errors import UserError
from hetero_ray.runs import run_files, run_lock
from hetero_ray.runs.checkpoints import latest_checkpoint_dir
from tests import cli

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLD = ("import sys, time; from hetero_ray.runs import run_lock; run_lock.acquire(sys.argv[1], 'x'); "
        "print('held', flush=True); time.sleep(600)")


@pytest.fixture
def held(tmp_path):
    """A run directory ``<tmp>/runs/held`` whose lock another live process holds."""
    run_dir = tmp_path / "runs" / "held"
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=REPO_ROOT, text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert holder.stdout.readline().strip() == "held"
    yield run_dir, holder
    if holder.poll() is None:
        holder.kill()
    holder.wait(timeout=30)


def test_a_held_run_directory_is_refused_naming_the_holder(held):
    run_dir, holder = held
    with pytest.raises(UserError) as refused:
        run_lock.acquire(str(run_dir), "Do this.")
    message = str(refused.value)
    assert f"{run_dir} is in use by another hetero_ray driver (pid {holder.pid} on host {socket.gethostname()}" in message
    assert message.endswith("Do this.")


def test_a_killed_holder_never_leaves_the_directory_stuck(held):
    run_dir, holder = held
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    with run_lock.acquire(str(run_dir), "x"):  # the kernel dropped the lock with the process
        with pytest.raises(UserError, match=f"pid {os.getpid()} on host"):  # a second lock, even in this process
            run_lock.acquire(str(run_dir), "x")
    run_lock.acquire(str(run_dir), "x").release()  # and released again


def test_the_cli_resume_of_a_held_run_exits_2_before_writing(held, capsys):
    run_dir, holder = held
    before = sorted(os.listdir(run_dir))
    code, _, err = cli.run_cli(["train", "--model", "mlp", "--num-samples", "256", "--global-batch-size", "32",
                                "--no-profile", "--storage-path", str(run_dir.parent), "--name", "held",
                                "--resume"], capsys)
    assert code == 2, err
    assert f"is in use by another hetero_ray driver (pid {holder.pid}" in err
    assert "then continue it with --resume" in err and "another --name" in err
    assert sorted(os.listdir(run_dir)) == before


def test_fit_on_a_held_run_directory_raises_before_writing(held):
    run_dir, holder = held
    before = sorted(os.listdir(run_dir))

    def loop():
        pass

    from ray.train import RunConfig

    trainer = HeteroTrainer(loop, run_config=RunConfig(name="held", storage_path=str(run_dir.parent)),
                            hetero_config=HeteroConfig(global_batch_size=8), emit=lambda line: None)
    with pytest.raises(UserError, match=f"in use by another hetero_ray driver \\(pid {holder.pid}") as refused:
        trainer.fit()
    assert "fit() again with the same RunConfig(name=...)" in str(refused.value)
    assert sorted(os.listdir(run_dir)) == before


# ---- two real drivers ---------------------------------------------------------------------------

TOTAL_STEPS = 256  # 8192 samples / 32: long enough (~15 s, emulated) for a second driver to try
JOB = ["--model", "mlp", "--num-samples", "8192", "--eval-samples", "64", "--global-batch-size", "32", "--epochs", "1",
       "--num-workers", "2", "--no-profile", "--policy", "static", "--checkpoint-every", "8",
       "--emulate-speeds", "0.25,0.25"]
FULL_SPEED = ["--emulate-speeds", "1,1"]  # the job's speeds only keep it running long enough to stop it
ENV = {**os.environ, "RAY_ADDRESS": "", "HETERO_RAY_PROGRESS_INTERVAL_S": "1"}


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hetero_ray", *args], cwd=REPO_ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_a_checkpoint(run_dir: str, driver: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        if os.path.isdir(run_dir) and latest_checkpoint_dir(run_dir):
            return
        time.sleep(0.2)
    raise AssertionError("the run ended before a checkpoint:\n" + driver.stdout.read()[-3000:])


def _each_step_once(run_dir: str) -> None:
    steps = run_files.read_table(run_dir, "steps")
    assert sorted(steps["global_step"].unique()) == list(range(TOTAL_STEPS))
    assert not steps.duplicated(["global_step", "rank"]).any()
    assert len(steps) == 2 * TOTAL_STEPS


@pytest.mark.ray
@pytest.mark.slow
def test_a_second_driver_is_refused_and_a_sigkilled_driver_with_a_torn_part_resumes(tmp_path, session_ray_address):
    """A second driver on a running run exits 2 before it writes anything; then the first
    driver's whole process group (its local Ray included) is killed at once, as a lost
    machine would; a part is left at 0 bytes; then --resume runs to the end, each step once."""
    args = ["train", *JOB, "--storage-path", str(tmp_path), "--name", "crashed"]
    run_dir = str(tmp_path / "crashed")
    first = _start(args)
    _wait_for_a_checkpoint(run_dir, first)
    config_before = open(os.path.join(run_dir, run_files.CONFIG_FILE), "rb").read()

    second = subprocess.run([sys.executable, "-m", "hetero_ray", *args, "--resume"], cwd=REPO_ROOT, env=ENV,
                            text=True, capture_output=True, timeout=120)
    assert second.returncode == 2, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"is in use by another hetero_ray driver (pid {first.pid} on host {socket.gethostname()}" in second.stderr
    assert "resuming" not in second.stdout  # refused before it read the checkpoint or wrote anything
    assert open(os.path.join(run_dir, run_files.CONFIG_FILE), "rb").read() == config_before
    assert first.poll() is None, "the first driver ended before it could be killed:\n" + first.stdout.read()[-3000:]

    os.killpg(first.pid, signal.SIGKILL)
    first.communicate(timeout=60)
    assert not os.path.exists(os.path.join(run_dir, run_files.SUMMARY_FILE))
    steps_parts = run_files.parts_dir(run_dir, "steps")
    os.makedirs(steps_parts, exist_ok=True)
    # A part the store was writing when the machine went, 0 bytes. Its number is well past
    # the others: the store's actor process is in its own process group and may outlive the
    # kill by a moment, long enough to write a part or two of its own.
    numbers = [int(name[5:13]) for folder in os.listdir(os.path.join(run_dir, run_files.PARTS_DIR))
               if os.path.isdir(os.path.join(run_dir, run_files.PARTS_DIR, folder))
               for name in os.listdir(os.path.join(run_dir, run_files.PARTS_DIR, folder)) if name.startswith("part-")]
    torn = os.path.join(steps_parts, f"part-{max(numbers, default=0) + 100:08d}.parquet")
    open(torn, "wb").close()

    # the rest at full speed: the speeds may change at a resume (they only pad the steps); on
    # the session's Ray, as on another machine's cluster (the killed driver's went with it)
    resumed = subprocess.run([sys.executable, "-m", "hetero_ray", *args, "--resume", *FULL_SPEED], cwd=REPO_ROOT,
                             env={**ENV, "RAY_ADDRESS": session_ray_address}, text=True, capture_output=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from the checkpoint at global step" in resumed.stdout
    with open(os.path.join(run_dir, run_files.SUMMARY_FILE)) as f:
        summary = json.load(f)
    assert summary["status"] == "finished" and summary["global_steps"] == TOTAL_STEPS, summary
    with open(os.path.join(run_dir, run_files.ATTEMPTS_FILE)) as f:
        assert len(json.load(f)) == 2  # the killed driver's and the resume's: none from the refused one
    assert os.path.exists(torn + run_files.TORN_SUFFIX)  # set aside, not read, not deleted
    _each_step_once(run_dir)
    assert os.path.exists(os.path.join(run_dir, run_files.MODEL_FILE))
