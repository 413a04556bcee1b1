"""PyTorch Lightning on hetero shares (``hetero_ray.train.lightning``), on a real local Ray:
one fit that proves several things at once, and the mistakes a porter makes, each refused
before any step with what to do.

The fit: Ray Train's Lightning recipe (RayDDPStrategy, RayLightningEnvironment,
RayTrainReportCallback, prepare_trainer) with hetero_ray's imports, under
``HeteroTrainer``; 3 workers at shares 12/8/4, a plan change mid-epoch, a short last
window each epoch, a LightningModule with BatchNorm. Rank 1 is SIGKILLed mid-epoch after
the checkpoint of step 2; the group restarts and Lightning resumes from it
(``ckpt_path`` from ``hetero_ray.train.get_checkpoint()``). The final weights in
``Result.checkpoint`` are one Lightning Trainer's on one device within 1e-5, every sample
is used once per epoch, and the logged metrics reach ``Result.metrics`` and the run's
``reports`` table. The example runs standalone (``--help``). (The math in every combination — left-out ranks, precisions,
Lightning's own DDP being off — is the promise matrix's: tests/test_promise_matrix_lightning.py.)
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch

lightning = pytest.importorskip("lightning")

from hetero_ray import HeteroConfig, HeteroTrainer  # noqa: E402
from hetero_ray.errors import UserError  # noqa: E402
from tests.lightning_models import EPOCHS, SEED, BatchNormClassifier, one_device_trainer  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_SAMPLES, BATCH, EVAL_SAMPLES = 66, 24, 24  # 3 steps an epoch, the last a short window of 18
STEPS = EPOCHS * 3
TOLERANCE = 1e-5


class CrashAfterCheckpoint(lightning.Callback):
    """Rank 1 SIGKILLs itself once, after step ``config["crash"]["at_step"]``, as soon as Ray
    Train registered the checkpoint before it (see tests/api_jobs.py)."""

    def __init__(self, config: dict):
        self.config = config

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from tests.api_jobs import _maybe_crash

        _maybe_crash(self.config, trainer.global_step)


def lightning_loop(config: dict) -> None:
    import hetero_ray.train
    from hetero_ray.train.lightning import (
        RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer,
    )

    trainer = lightning.Trainer(
        devices="auto", accelerator="auto", max_epochs=EPOCHS, strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()], enable_checkpointing=False, logger=False, enable_progress_bar=False,
        callbacks=[RayTrainReportCallback(every_n_train_steps=2), CrashAfterCheckpoint(config)])
    trainer = prepare_trainer(trainer)
    module = BatchNormClassifier(NUM_SAMPLES, EVAL_SAMPLES)
    checkpoint = hetero_ray.train.get_checkpoint()
    if checkpoint is None:
        trainer.fit(module)
        return
    with checkpoint.as_directory() as directory:
        trainer.fit(module, ckpt_path=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME))


@pytest.mark.ray
@pytest.mark.slow
def test_a_killed_worker_resumes_lightning_mid_epoch_as_one_device_exactly_once(ray_session, tmp_path):
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    one = one_device_trainer(NUM_SAMPLES, BATCH, eval_samples=EVAL_SAMPLES)
    run_dir = str(tmp_path / "lightning-kill")
    hetero = HeteroConfig(global_batch_size=BATCH, policy="static", batch_split=(12, 8, 4), rebalance_interval=1,
                          record_sample_ids=True, seed=SEED,
                          plan_changes=({"global_step": 1, "local_batch_sizes": [4, 8, 12]},))
    result = HeteroTrainer(
        lightning_loop,
        train_loop_config={"crash": {"at_step": 3, "after_checkpoint": "checkpoint_000000002", "run_dir": run_dir}},
        scaling_config=ScalingConfig(num_workers=3),
        run_config=RunConfig(name="lightning-kill", storage_path=str(tmp_path),
                             failure_config=FailureConfig(max_failures=1)),
        hetero_config=hetero,
    ).fit()

    with open(os.path.join(run_dir, "attempts.json")) as f:
        assert [a["start_global_step"] for a in json.load(f)] == [0, 2]  # resumed at the checkpoint's step
    with result.checkpoint.as_directory() as directory:
        saved = torch.load(os.path.join(directory, "checkpoint.ckpt"), weights_only=False)
    want = one.state_dict()
    worst = max((saved["state_dict"][k].double() - want[k].double()).abs().max().item() for k in want)
    print(f"killed mid-epoch and resumed: largest weight difference from one device {worst:.2e}")
    assert worst < TOLERANCE, f"the resumed run diverged from one device by {worst:g}"
    assert saved["global_step"] == STEPS
    assert result.metrics["step"] == STEPS and result.metrics["epoch"] == EPOCHS - 1
    assert result.metrics["loss_epoch"] == pytest.approx(one.loss_epoch, abs=TOLERANCE)  # the global batch's

    ids = pd.read_parquet(os.path.join(run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert sorted(rows["sample_index"]) == list(range(NUM_SAMPLES)), f"epoch {epoch}"
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    shares = steps.sort_values("rank").groupby("global_step")["local_batch_size"].apply(list)
    assert shares[0] == [12, 8, 4] and shares[1] == [4, 8, 12]  # the plan changed mid-epoch
    reports = pd.read_parquet(os.path.join(run_dir, "reports.parquet"))
    logged = [json.loads(metrics) for metrics in reports["metrics"]]
    assert any("loss_step" in m for m in logged) and max(m["step"] for m in logged) == STEPS


# --- what a porter gets wrong ------------------------------------------------------------


def _trainer(**options):
    return lightning.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, **options)


def test_another_strategy_is_refused_with_the_import_to_change():
    from hetero_ray.train.lightning import prepare_trainer

    with pytest.raises(UserError, match="RayDDPStrategy and RayLightningEnvironment from hetero_ray.train.lightning"):
        prepare_trainer(_trainer())


@pytest.mark.parametrize("options, message", [
    ({"accumulate_grad_batches": 4}, r"set accumulate_grad_batches=1 and HeteroConfig\(global_batch_size"),
    ({"limit_train_batches": 0.5}, "stop with max_steps instead"),
    ({"limit_train_batches": 1}, "stop with max_steps instead"),  # an int: one batch an epoch
    ({"overfit_batches": 2}, "stop with max_steps instead"),
])
def test_options_that_break_one_global_batch_per_step_are_refused(options, message):
    from hetero_ray.train.lightning.checks import check_trainer

    with pytest.raises(UserError, match=message):
        check_trainer(_trainer(**options))


def test_ray_trains_own_report_callback_is_refused():
    from ray.train.lightning import RayTrainReportCallback as RayCallback

    from hetero_ray.train.lightning.checks import check_trainer

    ray_callback = RayCallback.__new__(RayCallback)  # its __init__ needs a Ray Train worker
    with pytest.raises(UserError, match="use hetero_ray.train.lightning.RayTrainReportCallback instead"):
        check_trainer(_trainer(callbacks=[ray_callback]))


def test_a_communication_hook_is_refused():
    from hetero_ray.train.lightning import RayDDPStrategy

    with pytest.raises(UserError, match=r"HeteroDDPStrategy\(ddp_comm_hook=...\).*Leave these options out"):
        RayDDPStrategy(ddp_comm_hook=lambda state, bucket: None)


@pytest.mark.parametrize("every", [0, -1, 1.5, True])
def test_a_bad_checkpoint_interval_is_refused(every):
    from hetero_ray.train.lightning import RayTrainReportCallback

    with pytest.raises(UserError, match="must be a positive integer or None"):
        RayTrainReportCallback(every_n_train_steps=every)


def test_ray_trains_recipe_names_are_all_here():
    """Porting changes the imports only: every name of Ray's recipe exists here (FSDP and
    DeepSpeed aside), and the strategy and environment are Ray's kinds of Lightning objects."""
    import ray.train.lightning as ray_lightning
    from lightning.pytorch.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy

    import hetero_ray.train.lightning as hetero_lightning

    wanted = set(ray_lightning.__all__) - {"RayFSDPStrategy", "RayDeepSpeedStrategy"}
    assert wanted <= set(hetero_lightning.__all__)
    assert issubclass(hetero_lightning.RayDDPStrategy, DDPStrategy)
    assert issubclass(hetero_lightning.RayLightningEnvironment, LightningEnvironment)
    assert hetero_lightning.RayTrainReportCallback.CHECKPOINT_NAME == ray_lightning.RayTrainReportCallback.CHECKPOINT_NAME


def test_the_hugging_face_prepare_trainer_points_a_lightning_trainer_to_its_own():
    from hetero_ray.train import prepare_trainer

    with pytest.raises(UserError, match="use hetero_ray.train.lightning.prepare_trainer"):
        prepare_trainer(_trainer())


def test_lightning_is_an_optional_extra_pinned_for_the_tests():
    """The core install does not pull Lightning; the extra's range holds the version the
    tests pin (and run with)."""
    import tomllib

    from packaging.requirements import Requirement

    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert not any(Requirement(d).name in ("lightning", "pytorch-lightning") for d in project["dependencies"])
    (extra,) = [Requirement(r) for r in project["optional-dependencies"]["lightning"]]
    with open(os.path.join(REPO_ROOT, "requirements-dev.txt")) as f:
        pins = [Requirement(line.split("#")[0]) for line in f if line.startswith("lightning==")]
    assert len(pins) == 1 and extra.name == "lightning"
    pinned = next(iter(pins[0].specifier)).version
    assert extra.specifier.contains(pinned) and lightning.__version__ == pinned
