"""`--resume` after the driver was stopped (Ctrl-C): the run continues at its last
checkpoint, and the sample log still shows every sample exactly once per epoch.

The real user flow, through the CLI in a subprocess that starts its own local Ray.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from hetero_ray.preflight import latest_checkpoint_dir

pytestmark = [pytest.mark.slow]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_command(output_dir, *extra) -> list[str]:
    return [sys.executable, "-m", "hetero_ray", "train", "--model", "simple_cnn", "--num-workers", "2",
            "--num-samples", "800", "--batch-size", "20", "--epochs", "2", "--checkpoint-every", "10",
            "--policy", "static", "--emulate-speeds", "1,0.5", "--record-sample-ids",
            "--output-dir", str(output_dir), "--experiment-name", "stopped", *extra]


def test_resume_after_the_driver_was_stopped(tmp_path):
    env = {**os.environ, "RAY_ADDRESS": "", "HETERO_RAY_PROGRESS_INTERVAL_S": "1"}
    run_dir = tmp_path / "stopped"
    driver = subprocess.Popen(train_command(tmp_path), cwd=REPO_ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    # Stop the driver once a checkpoint past step 20 exists (but well before the end at 80).
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        latest = latest_checkpoint_dir(str(run_dir)) if run_dir.exists() else None
        if latest and int(os.path.basename(latest).split("_")[1]) >= 20:
            break
        time.sleep(0.5)
    assert driver.poll() is None, "the first run finished before it could be stopped:\n" + driver.stdout.read()
    os.killpg(driver.pid, signal.SIGINT)
    first_output, _ = driver.communicate(timeout=120)
    assert driver.returncode != 0, first_output

    resumed = subprocess.run(train_command(tmp_path, "--resume"), cwd=REPO_ROOT, env=env, text=True,
                             capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming from the checkpoint at global step" in resumed.stdout

    attempts = json.loads((run_dir / "attempts.json").read_text())
    assert len(attempts) == 2 and attempts[1]["start_global_step"] >= 20
    assert attempts[1]["start_global_step"] % 10 == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["global_steps"] == 80
    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert sorted(steps["global_step"].unique()) == list(range(80))
    assert steps.groupby("global_step").size().eq(2).all()
    ids = pd.read_parquet(run_dir / "sample_ids.parquet")
    for epoch, rows in ids.groupby("epoch"):
        assert len(rows) == 800 and set(rows["sample_index"]) == set(range(800)), f"epoch {epoch}"
    assert (run_dir / "model_final.pt").exists()
