"""The online balancer on a real local Ray, against the spine's invariants.

With ``optimal`` moving work mid-epoch (and a device slowing down mid-run), every sample
is still consumed exactly once per epoch, and the final weights equal one worker's. (The
planner actor killed mid-run: tests/test_failures.py.)
"""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch

from hetero_ray.runs import run_files
from tests.helpers import ONE_DEVICE_JOB

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_optimal_plans_mid_epoch_keep_exactly_once_and_the_math(one_worker_run, fast_config):
    from hetero_ray.builtin.driver import run_training

    reference = one_worker_run
    balanced = run_training(
        fast_config(num_workers=3, name="optimal", policy="optimal", batch_split=[16, 16, 16],
                    emulate_speeds=[1.0, 0.5, 0.25], emulate_speed_changes=[{"global_step": 20, "rank": 0, "speed": 0.2}],
                    rebalance_interval=3, record_sample_ids=True, **ONE_DEVICE_JOB),
    )

    plans = run_files.read_table(balanced.run_dir, "plans").sort_values("first_global_step")
    steps_per_epoch = 13  # ceil(600 / 48)
    changes = plans["first_global_step"].iloc[1:]
    assert len(changes) >= 1, "the balancer never moved work"
    assert any(step % steps_per_epoch for step in changes), "no change happened mid-epoch"
    decisions = pd.read_parquet(os.path.join(balanced.run_dir, "decisions.parquet"))
    adopted = decisions[decisions["adopted"]].sort_values("global_step")
    # Every change was adopted by the balancer; one more adoption may reach the workers
    # after its point when the next one is the end of the run: it never ran.
    assert len(adopted) in (len(changes), len(changes) + 1)
    if len(adopted) > len(changes):
        assert pd.isna(adopted["achieved_step_time_s"].iloc[-1])

    ids = pd.read_parquet(os.path.join(balanced.run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert len(rows) == 600 and set(rows["sample_index"]) == set(range(600)), f"epoch {epoch}"

    one = torch.load(os.path.join(reference.run_dir, "model_final.pt"), weights_only=True)
    three = torch.load(os.path.join(balanced.run_dir, "model_final.pt"), weights_only=True)
    worst = max((one[k] - three[k]).abs().max().item() for k in one)
    assert worst < 1e-5, f"balanced run diverged from one worker by {worst}"


def test_emulated_speeds_reach_the_first_plan_only_through_the_ranks_own_measurements(ray_session, fast_config):
    """--emulate-speeds is read by the emulator alone: the node profile measures one machine
    (both ranks alike), and the first plan comes from each rank timing its own padded step."""
    from hetero_ray.builtin.driver import run_training

    run = run_training(fast_config(name="warm-up", model="simple_cnn", policy="optimal", profile=True,
                                   emulate_speeds=[1.0, 0.25], global_batch_size=64, num_samples=128,
                                   profile_batch_sizes=[8, 32, 64]))

    first = run_files.read_table(run.run_dir, "plans").sort_values("first_global_step").iloc[0]
    assert first["reason"] == "optimal: split for the profiled cost model, measured by each rank's warm-up"
    fast, slow = first["local_batch_sizes"]
    # The slower rank measured itself slower. How much slower is the machine's figure, not
    # this test's: the emulator pads busy time on top of real compute, and a loaded
    # machine slows the compute but not the padding, and the ratio shrinks.
    assert slow < fast, f"a rank at a quarter of the speed got {slow} of {fast + slow} samples"
    print(f"\nfirst plan {fast}:{slow} for emulated speeds 1 : 0.25")
