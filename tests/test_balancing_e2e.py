"""The online balancer on a real local Ray, against the spine's invariants.

- with ``optimal`` moving work mid-epoch (and a device slowing down mid-run), every sample
  is still consumed exactly once per epoch, and the final weights equal one worker's;
- the balancer actor killed mid-run: training goes on with the plan it has, Ray restarts
  the actor, which restores its state from the last checkpoint and decides again.
"""

from __future__ import annotations

import os
import threading
import time

import pandas as pd
import pytest
import ray
import torch

from hetero_ray.constants import BALANCER_ROLE, METRICS_STORE_ROLE
from hetero_ray.metrics import run_files
from hetero_ray.runtime.actors import get_actor

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_optimal_plans_mid_epoch_keep_exactly_once_and_the_math(ray_session, fast_config):
    from hetero_ray.runtime.driver import run_training

    common = dict(model="mlp", num_samples=600, batch_size=48, epochs=3, seed=5, lr=0.1)
    reference = run_training(fast_config(num_workers=1, experiment_name="reference", **common))
    balanced = run_training(
        fast_config(num_workers=3, experiment_name="optimal", policy="optimal", batch_split=[16, 16, 16],
                    emulate_speeds=[1.0, 0.5, 0.25], rebalance_interval=3, record_sample_ids=True, **common),
        speed_changes=[{"global_step": 20, "rank": 0, "speed": 0.2}],
    )

    plans = run_files.read_table(balanced.run_dir, "plans").sort_values("first_global_step")
    steps_per_epoch = 13  # ceil(600 / 48)
    changes = plans["first_global_step"].iloc[1:]
    assert len(changes) >= 1, "the balancer never moved work"
    assert any(step % steps_per_epoch for step in changes), "no change happened mid-epoch"
    decisions = pd.read_parquet(os.path.join(balanced.run_dir, "decisions.parquet"))
    assert decisions["adopted"].sum() == len(changes)

    ids = pd.read_parquet(os.path.join(balanced.run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert len(rows) == 600 and set(rows["sample_index"]) == set(range(600)), f"epoch {epoch}"

    one = torch.load(os.path.join(reference.run_dir, "model_final.pt"), weights_only=True)
    three = torch.load(os.path.join(balanced.run_dir, "model_final.pt"), weights_only=True)
    worst = max((one[k] - three[k]).abs().max().item() for k in one)
    assert worst < 1e-5, f"balanced run diverged from one worker by {worst}"


def test_balancer_killed_mid_run_is_restored_and_training_goes_on(ray_session, fast_config):
    from hetero_ray.runtime.driver import run_training

    config = fast_config(model="simple_cnn", num_workers=2, num_samples=2400, batch_size=32, epochs=1,
                         policy="optimal", batch_split=[16, 16], emulate_speeds=[1.0, 0.4],
                         rebalance_interval=5, checkpoint_every=10, experiment_name="balancer-kill")
    seen: dict = {}

    def kill_balancer_once_past_a_checkpoint():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                store = get_actor("balancer-kill", METRICS_STORE_ROLE)
                progress = ray.get(store.progress.remote(), timeout=5)
                if (progress.get("global_step") or 0) >= 25:
                    balancer = get_actor("balancer-kill", BALANCER_ROLE)
                    seen["killed_at_step"] = progress["global_step"]
                    seen["killed_at"] = time.time()
                    ray.kill(balancer, no_restart=False)  # a crash: Ray restarts it
                    time.sleep(3)
                    seen["info"] = ray.get(get_actor("balancer-kill", BALANCER_ROLE).info.remote(), timeout=30)
                    return
            except (ValueError, ray.exceptions.GetTimeoutError):
                pass
            time.sleep(0.2)

    watcher = threading.Thread(target=kill_balancer_once_past_a_checkpoint, daemon=True)
    watcher.start()
    result = run_training(config)
    watcher.join(timeout=60)

    assert "info" in seen, "the balancer was not killed (or did not come back)"
    assert seen["info"]["restored_from"] and "checkpoint_" in seen["info"]["restored_from"]
    assert seen["info"]["attempt"] == 0  # it found the attempt in progress
    assert result.summary["restarts"] == 0, "training must not restart because the balancer died"
    steps = pd.read_parquet(os.path.join(result.run_dir, "steps.parquet"))
    assert sorted(steps["global_step"].unique()) == list(range(75))
    decisions = pd.read_parquet(os.path.join(result.run_dir, "decisions.parquet"))
    assert (decisions["wall_time"] > seen["killed_at"]).any(), "no decision after the restart"
