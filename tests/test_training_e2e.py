"""End to end on a real local Ray: invariants 1 and 2 through the whole product.

- same math: 3 workers with an uneven split whose plan changes mid-epoch twice reach the
  weights of 1 worker; in bf16 (the --precision flag) with a plan change they follow its
  fp32 losses within bf16's rounding, the bf16 run's first plan made by a policy of the
  user's own (``--policy-module``: a file the driver, the workers and, by value, the planner
  actor get);
- exactly once: in that same fp32 run, sample_ids.parquet holds every index once per
  epoch, every rank's piece matches the plan in force, and every rank runs every step.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from hetero_ray.runs import run_files
from tests.helpers import ONE_DEVICE_JOB, user_policy_file

pytestmark = [pytest.mark.ray, pytest.mark.slow]


STEPS = 3 * 13  # ONE_DEVICE_JOB: 3 epochs of ceil(600 / 48) steps
# bf16 keeps 8 bits of mantissa (relative rounding 2^-8 ≈ 0.4 %); a loss of ~1 that drifts
# through a few dozen steps of rounded forward passes stays within a few hundredths.
BF16_LOSS_TOLERANCE = 0.05


def test_uneven_workers_under_plan_changes_train_each_sample_once_to_one_workers_weights_and_in_bf16(
        one_worker_run, fast_config, tmp_path, monkeypatch):
    from hetero_ray.builtin.driver import run_training

    one = one_worker_run
    # Plan changes mid-epoch 0 and mid-epoch 1 (13 steps an epoch), the second one giving
    # rank 0 the largest share; the last window of each epoch is short (24 of 48).
    three = run_training(fast_config(num_workers=3, batch_split=[26, 14, 8], name="three",
                                     rebalance_interval=1, record_sample_ids=True,
                                     plan_changes=[{"global_step": 4, "local_batch_sizes": [8, 16, 24]},
                                                   {"global_step": 17, "local_batch_sizes": [30, 10, 8]}],
                                     **ONE_DEVICE_JOB))
    policy_module = user_policy_file(tmp_path, monkeypatch)
    bf16 = run_training(fast_config(num_workers=3, policy="back_loaded", policy_module=policy_module, precision="bf16",
                                    name="bf16", rebalance_interval=1,
                                    plan_changes=[{"global_step": 6, "local_batch_sizes": [8, 16, 24]}],
                                    **ONE_DEVICE_JOB))

    assert one.summary["global_steps"] == three.summary["global_steps"] == STEPS  # crosses the short last windows
    weights_one = torch.load(os.path.join(one.run_dir, "model_final.pt"), weights_only=True)
    weights_three = torch.load(os.path.join(three.run_dir, "model_final.pt"), weights_only=True)
    worst = max((weights_one[k] - weights_three[k]).abs().max().item() for k in weights_one)
    initial = _initial_weights("mlp", seed=ONE_DEVICE_JOB["seed"])
    moved = max((weights_one[k] - initial[k]).abs().max().item() for k in weights_one)
    assert moved > 1e-2, "training did not move the weights; the comparison would be empty"
    assert worst < 1e-5, f"3 uneven workers diverged from 1 worker by {worst}"
    _assert_every_sample_once_at_the_plans_shares(three.run_dir, num_samples=ONE_DEVICE_JOB["num_samples"],
                                                  plans=[(0, [26, 14, 8]), (4, [8, 16, 24]), (17, [30, 10, 8])])

    bf16_loss, one_loss = _step_losses(bf16.run_dir), _step_losses(one.run_dir)
    assert len(bf16_loss) == len(one_loss) == STEPS
    plans = run_files.read_table(bf16.run_dir, "plans").sort_values("first_global_step")
    # back_loaded's first plan, then the scripted change
    assert [list(s) for s in plans["local_batch_sizes"]] == [[12, 12, 24], [8, 16, 24]]
    assert plans["reason"].iloc[0] == "back_loaded: half on the last rank"
    assert np.abs(bf16_loss - one_loss).max() < BF16_LOSS_TOLERANCE, (bf16_loss, one_loss)
    assert not np.array_equal(bf16_loss, one_loss), "bf16 computed exactly as fp32: autocast did not run"


def _step_losses(run_dir: str) -> np.ndarray:
    """The loss of each global step over the whole global batch: Σ b_i·loss_i / B."""
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    steps = steps[steps["local_batch_size"] > 0]
    weighted = (steps["loss"] * steps["local_batch_size"]).groupby(steps["global_step"]).sum()
    return (weighted / steps.groupby("global_step")["local_batch_size"].sum()).sort_index().to_numpy()


def _initial_weights(model: str, seed: int) -> dict:
    from hetero_ray.builtin.data import load_dataset
    from hetero_ray.builtin.models import build_model

    spec = load_dataset("synthetic_image", num_samples=64, eval_samples=8, seed=seed).spec
    torch.manual_seed(seed)
    return build_model(model, spec).state_dict()


def _assert_every_sample_once_at_the_plans_shares(run_dir: str, num_samples: int, plans: list) -> None:
    """Each epoch trains every sample once; the plans took effect at their steps; every rank
    ran every step; each rank's piece of each step holds as many samples as its share."""
    ids = pd.read_parquet(os.path.join(run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert len(rows) == num_samples and set(rows["sample_index"]) == set(range(num_samples)), f"epoch {epoch}"
    recorded = run_files.read_table(run_dir, "plans").sort_values("first_global_step")
    assert list(zip(recorded["first_global_step"], map(list, recorded["local_batch_sizes"]))) == plans
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    first, sizes = plans[-1]
    assert steps.groupby("rank")["global_step"].count().tolist() == [STEPS] * len(sizes)  # equal step counts
    assert steps[steps["global_step"] == first + 1].sort_values("rank")["local_batch_size"].tolist() == sizes
    per_piece = ids.groupby(["global_step", "rank"]).size()
    shares = steps.set_index(["global_step", "rank"])["local_batch_size"]
    assert (per_piece.reindex(shares.index, fill_value=0) == shares).all()
