"""The promise matrix's Lightning rows: a LightningModule with BatchNorm (tests/lightning_models.py)
fitted by a ``lightning.Trainer`` with ``hetero_ray.train.lightning``'s strategy, on three
ranks of a real gloo group (without Ray: tests/inprocess_session.py), against one Trainer
on one device over the same global batches. Every epoch ends with a short window (66
samples, global batch 24: windows of 24, 24, 18). Cases: a plan that changes mid-epoch
(fp32, bf16-mixed); a rank left out and brought back across an epoch's end, while
validation runs (fp32, 16-mixed, which Lightning runs as bf16-mixed on a CPU); a rank
left out from the first plan and again when ``fit`` ends (fp32); a run stopped mid-epoch
after a checkpoint, and one at an epoch's end, each resumed from its last checkpoint with
``ckpt_path``; and Lightning's own DDP over the same uneven shares, which does not match
(the reason the strategy exists).

On every rank: one device's weights, logged losses (per step and per epoch, through
``self.log(..., sync_dist=True)``), learning rate, and validation/test losses after ``fit``;
and every sample once per epoch.
"""

from __future__ import annotations

import collections
import os

import pytest

lightning = pytest.importorskip("lightning")

from tests.inprocess_session import ScriptedPlanner, run_cases_on_ranks, run_in_session  # noqa: E402
from tests.lightning_models import EPOCHS, SEED, BatchNormClassifier, one_device_trainer  # noqa: E402

pytestmark = pytest.mark.slow

NUM_WORKERS, NUM_SAMPLES, GLOBAL_BATCH, EVAL_SAMPLES = 3, 66, 24, 24
STEPS = EPOCHS * 3
PLANS = {
    "change": {0: (8, 8, 8), 1: (12, 4, 8), 4: (4, 14, 6)},  # mid-epoch, in both epochs
    "out_and_back": {0: (8, 8, 8), 1: (16, 0, 8), 4: (8, 8, 8)},  # rank 1 out at steps 1–3 (an epoch's end)
    "out_from_first": {0: (16, 8, 0), 2: (8, 8, 8), 5: (20, 4, 0)},  # rank 2 out at the start and at the end
}
CASES = [
    {"name": "change-fp32", "plan": "change", "precision": "32-true"},
    {"name": "out_and_back-fp32", "plan": "out_and_back", "precision": "32-true"},
    {"name": "out_from_first-fp32", "plan": "out_from_first", "precision": "32-true"},
    {"name": "change-bf16", "plan": "change", "precision": "bf16-mixed"},
    {"name": "out_and_back-16", "plan": "out_and_back", "precision": "16-mixed"},
    # A GPU rank beside CPU ranks, all asked for "16-mixed": Lightning gives the GPU rank fp16
    # with a GradScaler and the CPU ranks bf16 without one. Rank 0 here holds the GPU's
    # plugin (fp16 and a GradScaler, on the CPU).
    {"name": "gpu_beside_cpu-16", "plan": "change", "precision": "16-mixed", "scaler_on_rank_0": True},
    # Stopped after global step 4 (checkpoints every 2 steps: the last at step 4, mid-epoch 1) ...
    {"name": "resume-first", "plan": "change", "precision": "32-true", "max_steps": 4, "every_n_train_steps": 2},
    # ... and resumed from that checkpoint by a new worker group.
    {"name": "resume-rest", "plan": "change", "precision": "32-true", "resume_from": "resume-first"},
    # Stopped at the end of epoch 0 (Ray's callback's checkpoint, at the epoch's end) and resumed.
    {"name": "resume-epoch-first", "plan": "out_and_back", "precision": "32-true", "max_steps": 3},
    {"name": "resume-epoch-rest", "plan": "out_and_back", "precision": "32-true", "resume_from": "resume-epoch-first"},
    {"name": "lightning_ddp", "plan": "change", "precision": "32-true", "lightning_ddp": True},
]
TOLERANCE = 1e-5  # float32 with tanh: one device's math
BF16_LOSS_TOLERANCE = 0.05  # as tests/test_precision.py: bf16 against fp32, on the loss
REPLICA_TOLERANCE = 1e-6


def case_name(case: dict) -> str:
    return case["name"]


def lightning_loop(config: dict) -> dict:
    import hetero_ray.train
    from hetero_ray.train.lightning import (
        RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer,
    )

    case = config["case"]
    module = BatchNormClassifier(NUM_SAMPLES, EVAL_SAMPLES)
    if case.get("lightning_ddp"):
        strategy, module = _lightning_ddp(), _own_ddp_module()
    else:
        strategy = RayDDPStrategy()
    precision, plugins = case["precision"], [RayLightningEnvironment()]
    if case.get("scaler_on_rank_0") and hetero_ray.train.get_context().get_world_rank() == 0:
        from lightning.pytorch.plugins.precision import MixedPrecision

        precision, plugins = None, [*plugins, MixedPrecision("16-mixed", "cpu")]
    trainer = lightning.Trainer(
        accelerator="cpu", devices="auto", max_epochs=EPOCHS, max_steps=case.get("max_steps", -1),
        precision=precision, strategy=strategy, plugins=plugins,
        callbacks=[RayTrainReportCallback(every_n_train_steps=case.get("every_n_train_steps"))],
        enable_checkpointing=False, logger=False, enable_model_summary=False)
    if not case.get("lightning_ddp"):
        trainer = prepare_trainer(trainer)
    checkpoint = hetero_ray.train.get_checkpoint()
    if checkpoint is None:
        trainer.fit(module)
    else:
        with checkpoint.as_directory() as directory:
            trainer.fit(module, ckpt_path=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME))
    fitted = {"params": {k: v.detach().clone() for k, v in module.state_dict().items()},
              "losses": list(module.logged_losses), "val_losses": list(module.val_losses), "loss_epoch": float(trainer.callback_metrics["loss_epoch"]),
              "progress_bar": sorted(trainer.progress_bar_metrics), "global_step": trainer.global_step,
              "lr": trainer.optimizers[0].param_groups[0]["lr"]}
    fitted["val_loss"] = trainer.validate(module, verbose=False)[0]["val_loss"]
    fitted["test_loss"] = trainer.test(module, verbose=False)[0]["test_loss"]
    return fitted


def _lightning_ddp():
    """Lightning's own DDP as Ray's RayDDPStrategy sets it up (its device, Ray's ranks)."""
    import torch
    from lightning.pytorch.strategies import DDPStrategy

    class LightningDDP(DDPStrategy):
        @property
        def root_device(self):
            return torch.device("cpu")

        @property
        def distributed_sampler_kwargs(self):
            return {"num_replicas": self.world_size, "rank": self.global_rank}

    return LightningDDP()


def _own_ddp_module():
    """The module whose training data is hetero_ray's loader (the same uneven shares), under
    Lightning's DDP: equal weights 1/n, BatchNorm on each rank's own batch."""
    import hetero_ray.train

    class OnHeteroShares(BatchNormClassifier):
        def train_dataloader(self):
            return hetero_ray.train.prepare_data_loader(super().train_dataloader())

    return OnHeteroShares(NUM_SAMPLES, EVAL_SAMPLES)


def _run_case(case: dict, rank: int, case_dir: str) -> dict:
    restored = None
    if case.get("resume_from"):
        storage = os.path.join(os.path.dirname(case_dir), case["resume_from"], "storage")
        restored = os.path.join(storage, max(os.listdir(storage)), "rank0")  # the latest checkpoint
    result, store, ray_train = run_in_session(
        lightning_loop, {"case": case}, rank=rank, num_workers=NUM_WORKERS, global_batch_size=GLOBAL_BATCH,
        planner=ScriptedPlanner(PLANS[case["plan"]]), storage=os.path.join(case_dir, "storage"), seed=SEED,
        restored_checkpoint=restored)
    return {**result, "restored": restored, "reports": [r["name"] for r in ray_train.reports],
            "sample_ids": [(r["epoch"], r["global_step"], r["sample_indices"]) for r in store.sample_ids]}


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("promise_matrix_lightning")
    return run_cases_on_ranks(_run_case, CASES, case_name, NUM_WORKERS, str(out_dir))


_REFERENCES: dict = {}


def reference(precision: str = "32-true"):
    if precision not in _REFERENCES:
        _REFERENCES[precision] = one_device_trainer(NUM_SAMPLES, GLOBAL_BATCH, precision=precision,
                                                    eval_samples=EVAL_SAMPLES)
    return _REFERENCES[precision]


def _largest(a: dict, b: dict) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _results(per_rank, name: str) -> list[dict]:
    results = [ranks[name] for ranks in per_rank]
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank}: {result.get('error')}"
    return results


def _every_sample_once(*runs: list[dict]) -> None:
    seen = collections.defaultdict(list)
    for results in runs:
        for result in results:
            for epoch, _, indices in result["sample_ids"]:
                seen[epoch].extend(indices)
    assert sorted(seen) == list(range(EPOCHS))
    assert all(sorted(indices) == list(range(NUM_SAMPLES)) for indices in seen.values())


@pytest.mark.parametrize("name", ["change-fp32", "out_and_back-fp32", "out_from_first-fp32"])
def test_three_uneven_ranks_are_one_trainer_on_one_device(per_rank, name):
    results, one = _results(per_rank, name), reference()
    want = {k: v.detach() for k, v in one.state_dict().items()}
    worst = max(_largest(r["params"], want) for r in results)
    losses = max(abs(a - b) for r in results for a, b in zip(r["losses"], one.logged_losses))
    print(f"{name}: weights {worst:.2e}, logged losses {losses:.2e} off one device")
    for rank, result in enumerate(results):
        assert _largest(result["params"], want) < TOLERANCE, f"rank {rank}: weights"
        assert _largest(result["params"], results[0]["params"]) < REPLICA_TOLERANCE, f"rank {rank}: replicas"
        assert result["global_step"] == STEPS
        assert result["lr"] == pytest.approx(one.trainer.optimizers[0].param_groups[0]["lr"])
        # self.log(..., sync_dist=True): the global batch's loss at every step, and the epoch's mean.
        assert len(result["losses"]) == STEPS
        assert result["losses"] == pytest.approx(one.logged_losses, abs=TOLERANCE), f"rank {rank}: logged losses"
        assert result["loss_epoch"] == pytest.approx(one.loss_epoch, abs=TOLERANCE)
        assert "loss_step" in result["progress_bar"]
        # Validation at each epoch's end, also while a rank is out (it evaluates rank 0's weights).
        assert result["val_losses"] == pytest.approx(one.val_losses, abs=TOLERANCE), f"rank {rank}: validation"
        # trainer.validate / trainer.test after fit: Lightning's equal shares of the evaluation data.
        assert result["test_loss"] == pytest.approx(one.test_loss, abs=TOLERANCE)
        assert result["val_loss"] == pytest.approx(one.test_loss, abs=TOLERANCE)  # the same data
    _every_sample_once(results)


@pytest.mark.parametrize("name", ["change-bf16", "out_and_back-16", "gpu_beside_cpu-16"])
def test_mixed_precision_trains_to_the_loss_of_fp32(per_rank, name):
    results, one = _results(per_rank, name), reference()
    one_bf16 = reference("bf16-mixed")
    off = max(abs(a - b) for r in results for a, b in zip(r["losses"], one.logged_losses))
    off_bf16 = max(abs(a - b) for r in results for a, b in zip(r["losses"], one_bf16.logged_losses))
    print(f"{name}: logged losses {off:.2e} off one fp32 device, {off_bf16:.2e} off one bf16 device")
    for rank, result in enumerate(results):
        assert len(result["losses"]) == STEPS
        assert result["losses"] == pytest.approx(one.logged_losses, abs=BF16_LOSS_TOLERANCE), f"rank {rank}"
        assert _largest(result["params"], results[0]["params"]) < REPLICA_TOLERANCE, f"rank {rank}: replicas"
    _every_sample_once(results)


@pytest.mark.parametrize("first_name, rest_name, checkpoints, resumed_at", [
    ("resume-first", "resume-rest", ["checkpoint_000000002", "checkpoint_000000003", "checkpoint_000000004"], 4),
    ("resume-epoch-first", "resume-epoch-rest", ["checkpoint_000000003"], 3),
])
def test_a_stopped_run_resumes_at_its_checkpoints_step(per_rank, first_name, rest_name, checkpoints, resumed_at):
    first, rest, one = _results(per_rank, first_name), _results(per_rank, rest_name), reference()
    assert [name for name in first[0]["reports"] if name] == checkpoints
    assert rest[0]["restored"].endswith(os.path.join(checkpoints[-1], "rank0"))
    want = {k: v.detach() for k, v in one.state_dict().items()}
    print(f"stopped at step {resumed_at} and resumed: weights {max(_largest(r['params'], want) for r in rest):.2e} "
          "off one device")
    for rank, result in enumerate(rest):
        assert result["global_step"] == STEPS
        assert _largest(result["params"], want) < TOLERANCE, f"rank {rank}: weights"
        assert first[rank]["losses"] + result["losses"] == pytest.approx(one.logged_losses, abs=TOLERANCE)
        assert {step for _, step, _ in result["sample_ids"]} == set(range(resumed_at, STEPS)), "the checkpoint's step"
    _every_sample_once(first, rest)


def test_lightnings_own_ddp_over_the_same_uneven_shares_is_off(per_rank):
    """Equal weights 1/n for unequal local batches, BatchNorm on each rank's own batch: the
    same data, visibly not one device's training."""
    results, one = _results(per_rank, "lightning_ddp"), reference()
    want = {k: v.detach() for k, v in one.state_dict().items()}
    worst = max(_largest(r["params"], want) for r in results)
    losses = max(abs(a - b) for r in results for a, b in zip(r["losses"], one.logged_losses))
    print(f"Lightning's own DDP on the uneven shares: weights {worst:.2e}, logged losses {losses:.2e} off one "
          "device")
    assert worst > 1000 * TOLERANCE
    _every_sample_once(results)  # the data was right; the weighting was not
