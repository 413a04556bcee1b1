"""One front door: ``hetero-ray train`` is a user of ``HeteroTrainer``.

The built-in job run from the CLI, and the same job run through the public API (a
``HeteroTrainer`` given the built-in loop and the same settings by hand, as a user would),
leave the same run: the same files and tables with the same columns, the same plans, the
same shares and samples at every step, the same losses. What the CLI adds is what only it
has: its settings in config.json, the final model (the built-in checkpoint format is the
CLI's to read), and the names of its model and dataset in the summary.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from tests.cli import run_cli

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SETTINGS = dict(model="mlp", num_samples=256, global_batch_size=32, num_workers=2, batch_split=[20, 12], max_steps=6,
                checkpoint_every=3, seed=3, record_sample_ids=True, profile=False)
FLAGS = ["--model", "mlp", "--num-samples", "256", "--global-batch-size", "32", "--num-workers", "2", "--batch-split", "20,12",
         "--max-steps", "6", "--checkpoint-every", "3", "--seed", "3", "--record-sample-ids", "--no-profile"]
# What the CLI's run has that a user's loop cannot give HeteroTrainer.
CLI_ONLY_FILES = {"model_final.pt"}
# Columns that are measured (times, readings, where and when): they differ from run to run.
MEASURED = {"node_id", "wall_time", "data_time_s", "forward_time_s", "backward_time_s", "pad_time_s",
            "optimizer_time_s", "busy_time_s", "wait_time_s", "step_time_s", "h2d_time_s", "cpu_util", "rss_bytes",
            "cpu_util_from_step", "cpu_quota_cores", "epoch_time_s", "samples_per_s", "metrics"}


def _files(run_dir: str) -> set[str]:
    return {os.path.relpath(os.path.join(folder, name), run_dir)
            for folder, _, names in os.walk(run_dir) for name in names if not name.startswith(".hetero_ray.lock")}


def _table(run_dir: str, name: str) -> pd.DataFrame:
    table = pd.read_parquet(os.path.join(run_dir, name))
    keys = [c for c in ("global_step", "rank", "plan_version", "epoch", "sample_id") if c in table.columns]
    return table.sort_values(keys).reset_index(drop=True)


def test_the_cli_and_the_api_run_of_one_job_leave_the_same_run(ray_session, tmp_path, capsys):
    from ray.train import RunConfig, ScalingConfig

    from hetero_ray import HeteroConfig, HeteroTrainer
    from hetero_ray.builtin.config import TrainConfig
    from hetero_ray.builtin.loop import train_loop_per_worker

    code, out, err = run_cli(["train", *FLAGS, "--storage-path", str(tmp_path / "cli"), "--name", "job"],
                             capsys)
    assert code == 0, err[-3000:]
    config = TrainConfig(**SETTINGS, storage_path=str(tmp_path / "api"), name="job")
    HeteroTrainer(train_loop_per_worker, train_loop_config={"train": config.to_dict()},
                  scaling_config=ScalingConfig(num_workers=2),
                  run_config=RunConfig(name="job", storage_path=str(tmp_path / "api")),
                  hetero_config=HeteroConfig(global_batch_size=32, batch_split=(20, 12), seed=3,
                                             record_sample_ids=True, profile=False)).fit()
    cli_dir, api_dir = str(tmp_path / "cli" / "job"), str(tmp_path / "api" / "job")

    assert _files(cli_dir) - CLI_ONLY_FILES == _files(api_dir), "the two runs left different files"
    tables = sorted(f for f in _files(api_dir) if f.endswith(".parquet"))
    assert {"steps.parquet", "plans.parquet", "epochs.parquet", "sample_ids.parquet"} <= set(tables), tables
    for name in tables:
        cli, api = _table(cli_dir, name), _table(api_dir, name)
        assert list(cli.columns) == list(api.columns), name
        same = [c for c in cli.columns if c not in MEASURED]
        pd.testing.assert_frame_equal(cli[same], api[same], check_exact=False, rtol=1e-5, obj=name)
    steps = _table(api_dir, "steps.parquet")
    assert sorted(steps["global_step"].unique()) == list(range(6)) and set(steps["local_batch_size"]) == {20, 12}

    with open(os.path.join(cli_dir, "summary.json")) as f:
        cli_summary = json.load(f)
    with open(os.path.join(api_dir, "summary.json")) as f:
        api_summary = json.load(f)
    assert cli_summary.keys() == api_summary.keys()
    assert (cli_summary["model"], cli_summary["dataset"]) == ("mlp", "synthetic_image")
    for key in ("status", "global_steps", "attempts", "num_workers", "global_batch_size", "policy"):
        assert cli_summary[key] == api_summary[key], key
    with open(os.path.join(cli_dir, "config.json")) as f:
        assert json.load(f)["batch_split"] == [20, 12]  # the CLI's settings, which --resume compares
