"""A NaN or infinite loss stops the run with a message naming the step and the rank
(unless HeteroConfig(allow_non_finite_loss=True), or `hetero-ray train
--allow-non-finite-loss` for the built-in job); a user's loop reports it through
hetero_ray.train.report's "loss", the built-in loop through its step. The rank-0
registration of a worker-group start waits for the store with a timeout that says what
it awaited."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hetero_ray import HeteroConfig, HeteroTrainer
from hetero_ray.errors import UserError
from hetero_ray.training.rank.loop_report import check_loss_is_finite
from tests.helpers import built_in_job_trainer


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf, torch.tensor(math.nan), torch.tensor([math.inf])])
def test_a_non_finite_loss_is_refused_naming_step_and_rank(loss):
    with pytest.raises(UserError, match=r"the loss is (nan|inf|-inf) at global step 7 on rank 1, so training "
                                        r"stopped.*allow_non_finite_loss=True"):
        check_loss_is_finite(loss, 7, 1)


@pytest.mark.parametrize("loss", [None, 0.5, 3, torch.tensor(0.25), torch.ones(2), "n/a", True])
def test_finite_or_unknown_losses_pass(loss):
    check_loss_is_finite(loss, 0, 0)


def nan_loss_loop(config):
    import hetero_ray.train

    model = hetero_ray.train.prepare_model(torch.nn.Linear(4, 1))
    loader = hetero_ray.train.prepare_data_loader(torch.utils.data.TensorDataset(torch.randn(32, 4)))
    for step, (inputs,) in enumerate(loader):
        loss = model(inputs).mean() * (math.nan if step == 1 else 1.0)
        loss.backward()
        hetero_ray.train.report({"loss": loss.item(), "step": step})


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("allowed", [False, True], ids=["stops", "allowed"])
def test_a_nan_loss_reported_by_the_users_loop_stops_the_run(ray_session, tmp_path, allowed):
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    name = f"nan-{allowed}"
    trainer = HeteroTrainer(nan_loss_loop, scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name=name, storage_path=str(tmp_path),
                                                 failure_config=FailureConfig(max_failures=2)),
                            hetero_config=HeteroConfig(global_batch_size=8, policy="static",
                                                       allow_non_finite_loss=allowed))
    if allowed:
        trainer.fit()
        with open(tmp_path / name / "summary.json") as f:
            assert json.load(f)["status"] == "finished"
        return
    with pytest.raises(UserError, match=r"the loss is nan at global step 1 on rank \d") as raised:
        trainer.fit()
    assert "without retrying" in str(raised.value)
    with open(tmp_path / name / "attempts.json") as f:
        assert len(json.load(f)) == 1, "a non-finite loss comes back on a retry: none is made"
    with open(tmp_path / name / "summary.json") as f:
        summary = json.load(f)
    assert summary["status"] == "failed" and "loss is nan" in summary["error"]


@pytest.mark.ray
def test_registering_a_start_with_a_store_that_never_answers_times_out_saying_what(ray_session, monkeypatch):
    import ray

    from hetero_ray.constants import REGISTER_ATTEMPT_TIMEOUT_S_ENV_VAR
    from hetero_ray.training.rank.identity import _begin_attempt

    @ray.remote
    class SilentStore:
        def begin_attempt(self, global_step, num_workers):
            import time

            time.sleep(60)

    store = SilentStore.remote()
    monkeypatch.setenv(REGISTER_ATTEMPT_TIMEOUT_S_ENV_VAR, "0.5")
    try:
        with pytest.raises(RuntimeError, match=r"rank 0 waited 0.5 s for the metrics store to register this "
                                               r"worker-group start \(at global step 40, 3 workers\)"):
            _begin_attempt(store, 40, 3)
    finally:
        ray.kill(store)


@pytest.mark.parametrize("flags, allowed", [([], False), (["--allow-non-finite-loss"], True)])
def test_the_cli_flag_reaches_every_worker_of_the_built_in_job(monkeypatch, tmp_path, flags, allowed):
    """The flag is in the settings each worker of `hetero-ray train`'s job gets (built as
    the driver builds them; no Ray needed: the trainer is only made, not run)."""
    _, worker_settings = built_in_job_trainer(monkeypatch, tmp_path, "nan", *flags)
    assert worker_settings["allow_non_finite_loss"] is allowed


@pytest.mark.ray
@pytest.mark.slow
def test_the_built_in_job_stops_on_a_nan_loss(ray_session, fast_config):
    """The built-in loop reports its loss through the same check as a user's loop (an absurd
    learning rate makes the weights, and so the loss, overflow within a few steps). That
    `--allow-non-finite-loss` turns the check off there too is the user's loop's run above
    with the setting, and the flag reaching every worker's settings (no run needed)."""
    from hetero_ray.builtin.driver import run_training

    config = fast_config(lr=1e30, name="nan-builtin")
    with pytest.raises(UserError, match=r"the loss is (nan|inf) at global step \d+ on rank \d.*"
                                        r"--allow-non-finite-loss"):
        run_training(config)
