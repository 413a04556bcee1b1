"""Micro-batches through the public API, on a real local Ray with real gloo groups: a rank
capped at 8 samples and given 32 trains its share as 4 micro-batches of 8 in each step;
the run ends with the weights of one device on the same global batches (no BatchNorm),
and every sample is used exactly once per epoch, across a plan change that moves the big
share to the other rank."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch

from hetero_ray import HeteroConfig, HeteroTrainer
from tests import micro_batch_jobs

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NUM_SAMPLES, BATCH, EPOCHS = 140, 40, 2  # 4 steps an epoch, the last a short window of 20
STEPS = EPOCHS * 4
CAP = 8


def test_a_share_past_the_cap_in_micro_batches_matches_one_device_exactly_once(ray_session, tmp_path):
    from ray.train import RunConfig, ScalingConfig

    out_dir = tmp_path / "ranks"
    out_dir.mkdir()
    hetero = HeteroConfig(global_batch_size=BATCH, policy="static", batch_split=(32, 8), rebalance_interval=1,
                          record_sample_ids=True, plan_changes=({"global_step": 5, "local_batch_sizes": [8, 32]},))
    result = HeteroTrainer(
        micro_batch_jobs.micro_batch_loop,
        train_loop_config={"num_samples": NUM_SAMPLES, "epochs": EPOCHS, "max_sizes": [CAP, CAP],
                           "out_dir": str(out_dir)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="micro", storage_path=str(tmp_path)),
        hetero_config=hetero,
    ).fit()

    trained = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(2)]
    assert trained[0]["0"] == [8, 8, 8, 8] and trained[1]["0"] == [8]  # 32 past the cap of 8: 4 micro-batches
    assert trained[0]["3"] == [8, 8] and trained[1]["3"] == [4]  # the short window of 20: 16 / 4
    assert trained[0]["5"] == [8] and trained[1]["5"] == [8, 8, 8, 8]  # after the plan change

    run_dir = str(tmp_path / "micro")
    ids = pd.read_parquet(os.path.join(run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert sorted(rows["sample_index"]) == list(range(NUM_SAMPLES)), f"epoch {epoch}"
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    assert sorted(steps["global_step"].unique()) == list(range(STEPS))
    assert steps[steps["global_step"] == 0].sort_values("rank")["local_batch_size"].tolist() == [32, 8]
    assert (steps["busy_time_s"] > 0).all()

    with result.checkpoint.as_directory() as directory:
        weights = torch.load(os.path.join(directory, "user_state.pt"), weights_only=True)["model"]
    reference = micro_batch_jobs.one_device(NUM_SAMPLES, BATCH, EPOCHS)
    initial = micro_batch_jobs.make_model().state_dict()
    assert max((reference[k] - initial[k]).abs().max().item() for k in reference) > 1e-2, "nothing was trained"
    worst = max((reference[k] - weights[k]).abs().max().item() for k in reference)
    assert worst < 1e-5, f"micro-batched shares diverged from one device by {worst}"
