"""Invariant 4 (nothing is lost): a training worker killed with SIGKILL mid-run.

The run must finish, the second attempt must resume at the last checkpoint's step, the
trajectory must have every global step once, and the sample log must still show every
index exactly once per epoch.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pandas as pd
import pytest
import ray

from hetero_ray.constants import METRICS_STORE_ROLE
from hetero_ray.runtime.actors import get_actor

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def kill_a_worker_after(experiment_name: str, global_step: int, rank: int, killed: dict,
                        timeout_s: float = 120) -> threading.Thread:
    """In the background: once training passed ``global_step``, SIGKILL ``rank``'s process."""

    def watch():
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                store = get_actor(experiment_name, METRICS_STORE_ROLE)
                progress = ray.get(store.progress.remote(), timeout=5)
                if progress.get("global_step") is not None and progress["global_step"] >= global_step:
                    worker = ray.get(store.workers.remote(), timeout=5)[rank]
                    os.kill(worker["pid"], signal.SIGKILL)
                    killed.update(progress=progress, worker=worker)
                    return
            except (ValueError, KeyError, ray.exceptions.GetTimeoutError):
                pass  # actor or worker not there yet
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_sigkill_of_a_worker_resumes_at_the_last_checkpoint(ray_session, fast_config):
    from hetero_ray.runtime.driver import run_training

    config = fast_config(
        model="simple_cnn", num_workers=2, num_samples=600, batch_size=20, epochs=2,
        checkpoint_every=10, max_failures=2, record_sample_ids=True, experiment_name="sigkill",
    )
    killed: dict = {}
    watcher = kill_a_worker_after("sigkill", global_step=15, rank=1, killed=killed)
    result = run_training(config)
    watcher.join(timeout=1)

    assert killed, "the worker was never killed (training too fast or never started?)"
    kill_step = killed["progress"]["global_step"]
    with open(os.path.join(result.run_dir, "attempts.json")) as f:
        attempts = json.load(f)
    assert len(attempts) == 2, attempts
    resumed_at = attempts[1]["start_global_step"]
    assert resumed_at % 10 == 0 and 10 <= resumed_at <= kill_step + 1  # the last checkpoint
    assert result.summary["restarts"] == 1

    steps = pd.read_parquet(os.path.join(result.run_dir, "steps.parquet"))
    per_step = steps.groupby("global_step")["rank"].apply(sorted)
    assert per_step.index.tolist() == list(range(60)), "a global step is missing or repeated"
    assert all(ranks == [0, 1] for ranks in per_step)
    redone = steps[(steps["global_step"] >= resumed_at) & (steps["global_step"] <= kill_step)]
    assert (redone["attempt"] == 1).all(), "rows of redone steps must come from the new attempt"

    ids = pd.read_parquet(os.path.join(result.run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert len(rows) == 600 and set(rows["sample_index"]) == set(range(600)), f"epoch {epoch}"
