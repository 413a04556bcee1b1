"""A run stopped by hand says so: SIGTERM (what ``ray job stop`` sends the entrypoint), and
Ctrl-C once to the public API's example; Ctrl-C three times quickly, with the ``--resume``
it prints run to the end, is tests/test_failures.py's driver-stopped case (held to the
uninterrupted run's weights, by the same standard as here).

The SIGTERM case starts ``python -m hetero_ray train`` as a subprocess on the session's Ray
(a job's driver on a running cluster, with its own signal handlers), waits for a registered
checkpoint, sends the signal(s), and holds the run to: summary.json says ``interrupted``
and by which signal; the steps recorded so far are readable and count from step 0 without
a gap; no final model; the driver exits 128 + the signal (130, 143) and prints the exact
``--resume`` command (the same whichever signal stopped the run).

Below them, :class:`StopSignals` on its own, with real signals sent to this process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hetero_ray.runs import run_files
from hetero_ray.runs.checkpoint_names import checkpoint_order
from hetero_ray.runs.checkpoints import RAY_CHECKPOINT_SNAPSHOT, latest_checkpoint_dir, registered_checkpoint_names
from tests.helpers import assert_stopped_run

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOTAL_STEPS = 256  # 8192 samples / 32: long enough (~15 s, emulated) to stop in the middle
JOB = ["--model", "mlp", "--num-samples", "8192", "--eval-samples", "64", "--global-batch-size", "32", "--epochs", "1",
       "--num-workers", "2", "--no-profile", "--policy", "static", "--checkpoint-every", "8",
       "--emulate-speeds", "0.25,0.25"]
ENV = {**os.environ, "RAY_ADDRESS": "", "HETERO_RAY_PROGRESS_INTERVAL_S": "1"}


def stop_mid_run(run_dir: str, driver: subprocess.Popen, send, checkpoints: int = 1) -> None:
    """Calls ``send()`` once ``checkpoints`` are registered (the run can be resumed from them)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        if os.path.isdir(run_dir) and latest_checkpoint_dir(run_dir) \
                and len(registered_checkpoint_names(run_dir)) >= checkpoints:
            break
        time.sleep(0.2)
    assert driver.poll() is None, "the run ended before it could be stopped:\n" + driver.stdout.read()[-3000:]
    send()


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_stopped_by_sigterm_says_interrupted(tmp_path, session_ray_address):
    """SIGTERM to the entrypoint process, as `ray job stop` sends it to a driver on a
    running cluster (here the session's)."""
    signum = signal.SIGTERM
    args = ["train", *JOB, "--storage-path", str(tmp_path), "--name", "stopped"]
    run_dir = str(tmp_path / "stopped")
    driver = subprocess.Popen([sys.executable, "-m", "hetero_ray", *args], cwd=REPO_ROOT,
                              env={**ENV, "RAY_ADDRESS": session_ray_address}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    stop_mid_run(run_dir, driver, lambda: os.kill(driver.pid, signum))
    stopped_at = time.monotonic()
    output, _ = driver.communicate(timeout=180)
    took_s = time.monotonic() - stopped_at
    (tmp_path / "first.log").write_text(output)
    recorded = assert_stopped_run(output, driver.returncode, args, run_dir, signum, TOTAL_STEPS)
    print(f"\nSIGTERM: driver exited {took_s:.1f} s after the stop with {len(recorded)} steps recorded")


# ---- StopSignals, without Ray ------------------------------------------------------------


def deliver(signum: int) -> None:
    """Sends ``signum`` to this process; Python runs its handler as the sleep begins (a
    handler that raises ends the sleep)."""
    os.kill(os.getpid(), signum)
    time.sleep(1)


@pytest.fixture
def stop_signals():
    from hetero_ray.runtime.interrupts import StopSignals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signals = StopSignals().install()
    yield signals
    signals.restore()
    assert {s: signal.getsignal(s) for s in before} == before, "the handlers were not put back"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_outside_fit_stops_the_driver(stop_signals, signum):
    with pytest.raises(KeyboardInterrupt):
        deliver(signum)
    assert stop_signals.stopped_by() == signum


def test_sigterm_during_fit_takes_ray_trains_graceful_ctrl_c_path(stop_signals):
    """While fit() runs, Ray Train's handler holds SIGINT (here a stand-in that aborts the
    way it does: SystemExit(0)); a SIGTERM must reach it, not end the driver at once."""
    seen = []

    def ray_trains_handler(signum, frame):
        seen.append(signum)
        raise SystemExit(0)

    signal.signal(signal.SIGINT, ray_trains_handler)
    with pytest.raises(SystemExit):
        deliver(signal.SIGTERM)
    assert seen == [signal.SIGINT] and stop_signals.stopped_by() == signal.SIGTERM


def test_stop_signals_while_finishing_are_noted_not_raised(stop_signals, capfd):
    stop_signals.finishing()
    for signum in (signal.SIGINT, signal.SIGINT, signal.SIGTERM):
        deliver(signum)  # would raise if the handler did
    assert stop_signals.stopped_by() == signal.SIGINT, "the first signal names the stop"
    assert capfd.readouterr().err.count("writing what was recorded first") == 1


def test_a_stop_the_driver_did_not_see_was_ray_trains_ctrl_c():
    from hetero_ray.runtime.interrupts import StopSignals

    assert StopSignals().stopped_by() == signal.SIGINT


@pytest.mark.ray
@pytest.mark.slow
def test_a_stopped_hetero_trainer_says_interrupted_and_fit_again_continues(tmp_path, session_ray_address):
    """The public API the same way: examples/own_model.py (HeteroTrainer, a checkpoint per
    epoch of 5 steps) stopped by Ctrl-C after its second checkpoint, then run again under its
    name, with Ray Train's snapshot emptied in between as a driver lost while Ray rewrote it
    leaves it: fit() rebuilds it from the folders, the newest left out, and continues from
    the one before, each step once."""
    args = [sys.executable, "examples/own_model.py", "--num-workers", "2", "--epochs", "40", "--num-samples", "480",
            "--loader-workers", "0", "--emulate-speeds", "0.25,0.25", "--storage-path", str(tmp_path), "--name", "api"]
    run_dir = str(tmp_path / "api")
    driver = subprocess.Popen(args, cwd=REPO_ROOT, env=ENV, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    stop_mid_run(run_dir, driver, lambda: os.killpg(driver.pid, signal.SIGINT), checkpoints=2)
    output, _ = driver.communicate(timeout=180)

    assert driver.returncode != 0 and "RunInterrupted: interrupted by SIGINT" in output, output[-3000:]
    assert "fit() again with RunConfig(name='api')" in output
    with open(os.path.join(run_dir, run_files.SUMMARY_FILE)) as f:
        summary = json.load(f)
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGINT", summary
    recorded = sorted(run_files.read_table(run_dir, "steps")["global_step"].unique())
    assert recorded == list(range(len(recorded))) and 0 < len(recorded) < 40 * 5, recorded

    registered = sorted(registered_checkpoint_names(run_dir), key=checkpoint_order)
    resumes_at = checkpoint_order(registered[-2])[0]
    open(os.path.join(run_dir, RAY_CHECKPOINT_SNAPSHOT), "w").close()
    epochs = checkpoint_order(registered[-1])[0] // 5 + 1  # past the newest checkpoint, the one left out
    again = subprocess.run([*args[:args.index("--epochs") + 1], str(epochs), *args[args.index("--epochs") + 2:]],
                           cwd=REPO_ROOT, env={**ENV, "RAY_ADDRESS": session_ray_address}, text=True,
                           capture_output=True, timeout=300)  # on a running cluster: the session's
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"{RAY_CHECKPOINT_SNAPSHOT} was cut short" in again.stdout, again.stdout[-3000:]
    with open(os.path.join(run_dir, run_files.ATTEMPTS_FILE)) as f:
        attempts = json.load(f)
    assert len(attempts) == 2 and attempts[1]["start_global_step"] == resumes_at > 0, (attempts, registered)
    steps = run_files.read_table(run_dir, "steps")
    once = steps.groupby(["global_step", "rank"]).size()
    assert sorted(steps["global_step"].unique()) == list(range(epochs * 5)) and (once == 1).all(), once[once > 1]


@pytest.mark.ray
@pytest.mark.slow
def test_a_stop_while_the_nodes_are_profiled_before_the_first_step(tmp_path, session_ray_address):
    """With GPUs the nodes are profiled before the first step. A Ctrl-C 2 s into it writes the
    summary ("interrupted"), leaves no actor of the run alive, and exits 128 + the signal.
    (SIGTERM takes the same handler outside fit(): test_a_stop_signal_outside_fit_stops_the_driver.)"""
    signum = signal.SIGINT
    run_dir = tmp_path / "run"
    driver = subprocess.Popen([sys.executable, "-m", "tests.stop_while_profiling", str(run_dir)], cwd=REPO_ROOT,
                              env={**ENV, "RAY_ADDRESS": session_ray_address}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = ""
        for line in driver.stdout:  # the profiler is being built on the node: 2 s into profiling
            seen += line
            if "[profile] profiling" in line:
                time.sleep(2)
                os.kill(driver.pid, signum)
                break
        output = seen + driver.stdout.read()
        driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 128 + signum, output[-3000:]
    assert json.loads(output.strip().splitlines()[-1]) == {"alive": []}, output[-3000:]
    with open(run_dir / run_files.SUMMARY_FILE) as f:
        summary = json.load(f)
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == signal.Signals(signum).name
