"""Ray Data through ``HeteroTrainer(datasets=...)`` end to end, on a real local Ray: a loop
written as for Ray Train (``get_dataset_shard("train").iter_torch_batches()``, an
evaluation dataset, checkpoints) on 3 uneven workers with a plan change mid-epoch, a
worker SIGKILLed mid-epoch and the run resumed from the checkpoint before it. One fit
shows: the resume at the exact step, every row once per epoch (the run's own audit), one
device's weights on the same global batches, the evaluation dataset read every row once
across the ranks, the metrics in Ray Train's Result — and bad use refused before any work."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch

from hetero_ray import HeteroConfig, HeteroTrainer
from hetero_ray.errors import UserError
from tests import ray_data_jobs

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NUM_ROWS, VAL_ROWS, BATCH, EPOCHS = 70, 23, 16, 2  # 5 steps an epoch, the last a short window of 6


def _datasets(ray, tmp_path):
    folder = str(tmp_path / "parquet")
    ray.data.range(NUM_ROWS, override_num_blocks=3).map_batches(ray_data_jobs.features).write_parquet(folder)
    # A block a file (left to itself, Ray Data cuts these few rows into ~200 blocks: a task
    # each), read once: Ray 2.60 lists a Parquet folder anew in every execution (10–14 s
    # each on 2 busy cores), and the feed's count, epochs and restart are ~5 executions.
    # The map_batches still runs in every epoch's reading.
    train = ray.data.read_parquet(folder, override_num_blocks=3).materialize().map_batches(ray_data_jobs.augment)
    val = ray.data.range(VAL_ROWS, override_num_blocks=2).map_batches(ray_data_jobs.features)  # else a task a row
    return {"train": train, "val": val}


def _read_order(dataset) -> np.ndarray:
    """The row ids in the order the run's feed reads them (in order, as every reading does)."""
    dataset = dataset.copy(dataset)
    dataset.context.execution_options.preserve_order = True
    return np.concatenate([batch["id"] for batch in dataset.iter_batches(batch_format="numpy")])


def _trainer(tmp_path, name, datasets, **config):
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    hetero = HeteroConfig(global_batch_size=BATCH, policy="static", batch_split=(8, 5, 3), rebalance_interval=1,
                          record_sample_ids=True, plan_changes=({"global_step": 2, "local_batch_sizes": [3, 5, 8]},))
    return HeteroTrainer(
        ray_data_jobs.ray_data_loop, train_loop_config={"epochs": EPOCHS, "checkpoint_every": 3, **config},
        scaling_config=ScalingConfig(num_workers=3), datasets=datasets,
        run_config=RunConfig(name=name, storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=1)),
        hetero_config=hetero)


def test_ray_data_uneven_shares_sigkill_resume_and_evaluation(ray_session, tmp_path):
    run_dir = str(tmp_path / "ray-data")
    crash = {"at_step": 7, "after_checkpoint": "checkpoint_000000006", "run_dir": run_dir}  # epoch 1, step 2
    datasets = _datasets(ray_session, tmp_path)
    result = _trainer(tmp_path, "ray-data", datasets, crash=crash).fit()

    with open(os.path.join(run_dir, "attempts.json")) as f:
        assert [a["start_global_step"] for a in json.load(f)] == [0, 6]  # from the checkpoint after 6 steps (mid-epoch 1)
    assert result.metrics["restored_from"] == 6 and result.metrics["epoch"] == EPOCHS - 1
    assert result.metrics["val_rows"] == VAL_ROWS  # every evaluation row once across the ranks
    ids = pd.read_parquet(os.path.join(run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert sorted(rows["sample_index"]) == list(range(NUM_ROWS)), f"epoch {epoch}"
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    assert steps[steps["global_step"] == 1].sort_values("rank")["local_batch_size"].tolist() == [8, 5, 3]
    assert steps[steps["global_step"] == 3].sort_values("rank")["local_batch_size"].tolist() == [3, 5, 8]
    # Step s of an epoch trains positions [s·B, (s+1)·B) of the dataset's order (no shuffle).
    order = _read_order(datasets["train"])
    windows = [order[s * BATCH:(s + 1) * BATCH].tolist() for s in range(5)] * EPOCHS
    expected = ray_data_jobs.one_device(NUM_ROWS, windows)
    with result.checkpoint.as_directory() as directory:
        weights = torch.load(os.path.join(directory, "state.pt"))["model"]
    worst = max((weights[k].double() - expected[k].double()).abs().max().item() for k in expected)
    assert worst < 1e-10, f"3 uneven workers reading Ray Data diverged from one device by {worst:.2e}"


def test_bad_ray_data_use_is_refused_before_anything_starts(ray_session, tmp_path):
    from ray.train import DataConfig

    datasets = {"train": ray_session.data.range(8)}
    with pytest.raises(UserError, match="must be a ray.data.Dataset"):
        _trainer(tmp_path, "bad", {"train": [1, 2, 3]})
    with pytest.raises(UserError, match="datasets_to_split=.*names \\['test'\\]"):
        HeteroTrainer(ray_data_jobs.ray_data_loop, hetero_config=HeteroConfig(global_batch_size=4), datasets=datasets,
                      dataset_config=DataConfig(datasets_to_split=["test"]))
    with pytest.raises(UserError, match="'train' dataset always follows"):
        HeteroTrainer(ray_data_jobs.ray_data_loop, hetero_config=HeteroConfig(global_batch_size=4),
                      datasets={**datasets, "val": datasets["train"]}, dataset_config=DataConfig(datasets_to_split=["val"]))
    assert not (tmp_path / "bad").exists()  # nothing written
