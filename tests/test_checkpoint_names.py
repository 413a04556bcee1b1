"""Checkpoint folder names never reuse the name of the checkpoint a worker group resumed
from: that one is Ray Train's registered latest (the only resumable one), and a report
under its name would copy into it. Unit level (the naming rule and the report's use of
it), then a real run whose loop reports right after a restart."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from hetero_ray.runs.checkpoint_names import checkpoint_dir_name, next_checkpoint_count
from hetero_ray.training.rank.loop_report import _checkpoint_dir_name
from tests import api_jobs


@pytest.mark.parametrize("global_step, taken_here, restored, expected", [
    (140, 0, None, 0),  # a fresh run
    (140, 0, "checkpoint_000000140", 1),  # a report right after resuming from step 140
    (140, 0, "checkpoint_000000140_2", 3),  # ...from the third checkpoint at that step
    (140, 4, "checkpoint_000000140", 4),  # this group already took more there
    (148, 0, "checkpoint_000000140", 0),  # a later step: its own name
    (140, 0, "my_checkpoint", 0),  # a name not of this scheme clashes with none of it
])
def test_the_next_count_skips_the_checkpoint_resumed_from(global_step, taken_here, restored, expected):
    assert next_checkpoint_count(global_step, taken_here, restored) == expected


def test_a_report_right_after_a_resume_gets_a_new_name():
    session = SimpleNamespace(checkpoints_at={})  # a new worker group's session
    restored = "checkpoint_000000140"
    names = [_checkpoint_dir_name(session, 140, restored) for _ in range(2)]
    assert names == ["checkpoint_000000140_1", "checkpoint_000000140_2"]
    assert restored not in names
    assert _checkpoint_dir_name(session, 148, restored) == checkpoint_dir_name(148, 0) == "checkpoint_000000148"


def restart_then_report_loop(config):
    """Attempt 0 trains 4 steps, checkpoints, and fails once Ray Train has registered the
    checkpoint; attempt 1 reports a checkpoint at once (the same position), then trains to
    the end."""
    import tempfile

    import ray.train

    import hetero_ray.train

    model = hetero_ray.train.prepare_model(torch.nn.Linear(4, 1))
    loader = hetero_ray.train.prepare_data_loader(torch.utils.data.TensorDataset(torch.randn(64, 4)))
    restored = hetero_ray.train.get_checkpoint()

    def report(tag):
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "tag.txt"), "w") as f:
                f.write(tag)
            hetero_ray.train.report({"tag": tag}, checkpoint=ray.train.Checkpoint.from_directory(directory))

    if restored is not None:
        report("after-restart")
    for step, (inputs,) in enumerate(loader):
        model(inputs).mean().backward()
        if restored is None and step == 3:
            report("before-crash")
            api_jobs.wait_until_registered(config["run_dir"], "checkpoint_000000004")
            # An error a restart cures (a lost peer): the same RuntimeError at the same step on
            # every rank is a bug in the loop, and ends the run without a restart.
            raise ConnectionError("a worker lost its peer")


@pytest.mark.ray
@pytest.mark.slow
def test_the_report_right_after_a_restart_leaves_the_checkpoint_resumed_from_intact(ray_session, tmp_path):
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    from hetero_ray import HeteroConfig, HeteroTrainer
    from hetero_ray.runs.checkpoints import ray_train_dir, registered_checkpoint_names

    trainer = HeteroTrainer(restart_then_report_loop, train_loop_config={"run_dir": str(tmp_path / "names")},
                            scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name="names", storage_path=str(tmp_path),
                                                 failure_config=FailureConfig(max_failures=1)),
                            hetero_config=HeteroConfig(global_batch_size=8, policy="static"))
    trainer.fit()
    run_dir = tmp_path / "names"
    train_dir = ray_train_dir(str(run_dir))
    with open(os.path.join(train_dir, "checkpoint_000000004", "tag.txt")) as f:
        assert f.read() == "before-crash"  # the checkpoint resumed from was not written to
    with open(os.path.join(train_dir, "checkpoint_000000004_1", "tag.txt")) as f:
        assert f.read() == "after-restart"
    assert "checkpoint_000000004_1" in registered_checkpoint_names(str(run_dir))
