"""The batch-norm loop's runs through ``HeteroTrainer`` and what they are held to: one
device's weights, every sample once (tests/test_api_e2e.py, tests/test_leave_out_e2e.py).
Driver side; the loop itself is in tests/api_jobs.py, which the workers import."""

from __future__ import annotations

import os

import pandas as pd
import torch

from hetero_ray import HeteroTrainer
from hetero_ray.planning.plan import Plan
from hetero_ray.planning.policies import StaticPolicy
from tests import api_jobs

NUM_SAMPLES, BATCH, EPOCHS = 140, 30, 2  # 5 steps an epoch, the last a short window of 20
STEPS = EPOCHS * 5


def fit(tmp_path, name, hetero_config, **config):
    """api_jobs.batchnorm_loop on 3 workers through HeteroTrainer, one failure allowed."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    trainer = HeteroTrainer(
        api_jobs.batchnorm_loop,
        train_loop_config={"num_samples": NUM_SAMPLES, "epochs": EPOCHS, **config},
        scaling_config=ScalingConfig(num_workers=3),
        run_config=RunConfig(name=name, storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=1)),
        hetero_config=hetero_config,
    )
    return trainer.fit()


def final_weights(result) -> dict:
    """The model of the result's checkpoint, as the loop saved it."""
    with result.checkpoint.as_directory() as directory:
        return torch.load(os.path.join(directory, "user_state.pt"), weights_only=True)["model"]


def assert_one_device(weights: dict) -> None:
    """Within 1e-5 of one device trained on the same global batches (and moved by training)."""
    reference = api_jobs.one_device(NUM_SAMPLES, BATCH, EPOCHS)
    initial = api_jobs.make_model().state_dict()
    moved = max((reference[k].float() - initial[k].float()).abs().max().item() for k in reference)
    assert moved > 1e-2, "training did not move the weights; the comparison would be empty"
    worst = {k: (reference[k].float() - weights[k].float()).abs().max().item() for k in reference}
    assert max(worst.values()) < 1e-5, f"3 uneven workers diverged from one device: {worst}"


def assert_exactly_once(run_dir: str) -> None:
    """Every sample once per epoch, every step's row of every rank once."""
    ids = pd.read_parquet(os.path.join(run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert sorted(rows["sample_index"]) == list(range(NUM_SAMPLES)), f"epoch {epoch}"
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    per_step = steps.groupby("global_step")["local_batch_size"].sum()
    assert per_step.index.tolist() == list(range(STEPS))
    # Every rank's row of every step, once: none lost in a worker's buffer by a crash.
    assert not steps.duplicated(["global_step", "rank"]).any()
    ranks = steps.groupby("global_step")["rank"].nunique()
    assert (ranks == steps["rank"].nunique()).all(), ranks[ranks != steps["rank"].nunique()]


class FirstSplitPolicy(StaticPolicy):
    """``static`` with a first plan of its own, 14/10/6 of 30: a policy that a test registers
    for itself alone (the driver hands its class to the planner actor, which imports it
    from here)."""

    name = "first_split_from_tests"

    def initial_plan(self, global_batch_size, num_workers, capacities=None, caps=None) -> Plan:
        assert (global_batch_size, num_workers) == (30, 3), (global_batch_size, num_workers)
        return Plan(0, (14, 10, 6), f"{self.name}: 14/10/6")
