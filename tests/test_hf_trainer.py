"""Hugging Face ``transformers.Trainer`` on hetero_ray shares (``hetero_ray.train.prepare_trainer``),
on a real local Ray with real gloo groups.

- same math: a tiny GPT-2 (built from a config, nothing downloaded) whose loss the
  Trainer counts in tokens across ranks, on token sequences of different lengths, 3
  workers with an uneven split and a mid-run plan change, one killed and restarted
  mid-epoch, ends with the weights of one ``Trainer`` on one device on the same global
  batches and logs its loss. The other kinds (a plain model's local mean; a BERT
  classifier whose ``forward`` takes ``**kwargs``, so the Trainer passes it
  ``num_items_in_batch`` and scales its loss for DDP, but returns the plain mean), every
  kind under plan changes, left-out ranks and bf16, and the Trainer's evaluation losses,
  are tests/test_promise_matrix_hf.py's (in-process ranks on a real gloo group, no Ray);
- which of those kinds a loss is, measured from what twice the items do to it;
- the Trainer's logs and checkpoint reach Ray Train's ``Result``;
- every sample once per epoch (that without hetero_ray's weighting the same shares do not
  match one device is tests/test_promise_matrix_hf.py's negative control);
- the example runs (in bf16, under emulated speeds), mistakes a porter makes are refused
  with what to do, and nothing deprecated in transformers is read.
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
from dataclasses import dataclass

import pandas as pd
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a hub
transformers = pytest.importorskip("transformers")

from hetero_ray import HeteroConfig, HeteroTrainer  # noqa: E402
from hetero_ray.errors import UserError  # noqa: E402
from tests.hf_models import (  # noqa: E402
    EPOCHS, SEED, TokenSequences, make_dataset, make_model, one_device_trainer, training_args,
)

NUM_SAMPLES, BATCH = 66, 24  # 3 steps an epoch, the last a short window of 18
STEPS = EPOCHS * 3
TOLERANCE = 1e-5  # float32 over 6 SGD steps; the unweighted run is off by far more (asserted)


@dataclass(frozen=True)
class Shares:
    """How a run splits its global batches between its workers."""

    num_samples: int
    global_batch_size: int
    batch_split: tuple[int, ...]
    plan_changes: tuple[dict, ...] = ()

    @property
    def num_workers(self) -> int:
        return len(self.batch_split)

    @property
    def steps(self) -> int:
        return EPOCHS * -(-self.num_samples // self.global_batch_size)


# 3 workers, a plan change at step 4, a short last window: the suite's main run.
UNEVEN = Shares(NUM_SAMPLES, BATCH, (12, 8, 4), ({"global_step": 4, "local_batch_sizes": [4, 8, 12]},))


class CrashAfterCheckpoint(transformers.TrainerCallback):
    """Rank 1 SIGKILLs itself once, after the step ``config["crash"]["at_step"]``, as soon
    as Ray Train registered the checkpoint before it (see tests/api_jobs.py)."""

    def __init__(self, config: dict):
        self.config = config

    def on_step_end(self, args, state, control, **kwargs):
        from tests.api_jobs import _maybe_crash

        _maybe_crash(self.config, state.global_step)


def trainer_loop(config: dict) -> None:
    import hetero_ray.train
    from hetero_ray.train.huggingface import RayTrainReportCallback

    os.environ["HF_HUB_OFFLINE"] = "1"
    args = training_args(config["output_dir"], save_steps=config.get("save_steps", 3))
    callbacks = [RayTrainReportCallback()] + ([CrashAfterCheckpoint(config)] if config.get("crash") else [])
    dataset = make_dataset(config["kind"], config["num_samples"])
    model = make_model(config["kind"])
    trainer = hetero_ray.train.prepare_trainer(transformers.Trainer(
        model=model, args=args, train_dataset=dataset, callbacks=callbacks))
    checkpoint = hetero_ray.train.get_checkpoint()
    if checkpoint is None:
        trainer.train()
        return
    with checkpoint.as_directory() as directory:
        trainer.train(resume_from_checkpoint=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME))


def one_device(kind: str, shares: Shares):
    """The one-device reference's weights and logged losses."""
    trainer = one_device_trainer(kind, shares.num_samples, shares.global_batch_size)
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, losses


def _fit(tmp_path, name: str, kind: str, shares: Shares = UNEVEN, **config):
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    hetero = HeteroConfig(global_batch_size=shares.global_batch_size, policy="static", batch_split=shares.batch_split,
                          rebalance_interval=1, record_sample_ids=True, seed=SEED,
                          plan_changes=shares.plan_changes or None)
    trainer = HeteroTrainer(
        trainer_loop, train_loop_config={"output_dir": str(tmp_path / f"{name}-hf"), "kind": kind,
                                         "num_samples": shares.num_samples, **config},
        scaling_config=ScalingConfig(num_workers=shares.num_workers),
        run_config=RunConfig(name=name, storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=1)),
        hetero_config=hetero,
    )
    return trainer.fit()


def _final_weights(result) -> dict:
    from safetensors.torch import load_file

    with result.checkpoint.as_directory() as directory:
        return load_file(os.path.join(directory, "checkpoint", "model.safetensors"))


def _worst_difference(weights: dict, reference: dict) -> float:
    assert weights, "no weights in the checkpoint"
    return max((reference[k].float() - weights[k].float()).abs().max().item() for k in weights)


_REFERENCES: dict = {}


def reference(kind: str, shares: Shares = UNEVEN):
    """The one-device weights and logged losses of ``kind`` on the global batches of
    ``shares`` (computed once per session)."""
    key = kind, shares.num_samples, shares.global_batch_size  # one device does not see the split
    if key not in _REFERENCES:
        weights, losses = one_device(kind, shares)
        initial = make_model(kind).state_dict()
        moved = max((weights[k] - initial[k]).abs().max().item() for k in weights)
        assert moved > 1e-2, "training did not move the weights; the comparison would be empty"
        assert len(losses) == shares.steps
        _REFERENCES[key] = weights, losses
    return _REFERENCES[key]


@pytest.mark.ray
@pytest.mark.slow
def test_a_killed_worker_resumes_the_trainer_mid_epoch_exactly_once(ray_session, tmp_path):
    """A loss the Trainer counts in tokens, on three uneven workers whose plan changes:
    checkpoints every 2 steps (3 an epoch), rank 1 dies after step 3, the group restarts
    from step 2's checkpoint in the middle of epoch 0, and the Trainer resumes from it —
    and ends where one device ends."""
    weights, losses = reference("token_loss")
    run_dir = str(tmp_path / "hf-kill")
    result = _fit(tmp_path, "hf-kill", "token_loss", save_steps=2,
                  crash={"at_step": 3, "after_checkpoint": "checkpoint_000000002", "run_dir": run_dir})

    with open(os.path.join(run_dir, "attempts.json")) as f:
        assert [a["start_global_step"] for a in json.load(f)] == [0, 2]
    worst = _worst_difference(_final_weights(result), weights)
    print(f"restarted mid-epoch vs one device: largest weight difference {worst:.2e}")
    assert worst < TOLERANCE, f"the resumed run diverged from one device by {worst:g}"
    # The Trainer's logged loss is the global batch's, as one device logs it.
    assert result.metrics["step"] == STEPS and result.metrics["loss"] == pytest.approx(losses[-1], rel=1e-4)
    assert "learning_rate" in result.metrics
    ids = pd.read_parquet(os.path.join(run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert sorted(rows["sample_index"]) == list(range(NUM_SAMPLES)), f"epoch {epoch}"
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    shares = steps.sort_values("rank").groupby("global_step")["local_batch_size"].apply(list)
    assert shares[0] == [12, 8, 4] and shares[4] == [4, 8, 12] and shares[5] == [3, 6, 9]  # short window, same rule
    reports = pd.read_parquet(os.path.join(run_dir, "reports.parquet"))
    assert len(reports) >= STEPS  # every log of the Trainer reached the run's table


@pytest.mark.ray
@pytest.mark.slow
def test_example_fine_tunes_in_bf16_on_emulated_speeds(ray_session, tmp_path):
    example = importlib.import_module("examples.hf_trainer")  # the loop travels to the workers by reference
    result = example.main(["--num-workers", "2", "--global-batch-size", "16", "--epochs", "1", "--num-samples", "64",
                           "--logging-steps", "2", "--save-steps", "4", "--emulate-speeds", "1,0.5", "--bf16",
                           "--storage-path", str(tmp_path), "--name", "hf-example"])

    assert result.metrics["step"] == 4 and result.metrics["loss"] > 0
    weights = _final_weights(result)
    model = example.make_model()
    model.load_state_dict(weights, strict=False)  # the tied lm_head is saved once, as the embedding
    assert torch.equal(model.transformer.wte.weight, weights["transformer.wte.weight"])
    steps = pd.read_parquet(os.path.join(tmp_path, "hf-example", "steps.parquet"))
    assert sorted(steps["global_step"].unique()) == [0, 1, 2, 3]


def _trainer(tmp_path, **overrides):
    return transformers.Trainer(model=make_model(), args=training_args(str(tmp_path), **overrides),
                                train_dataset=TokenSequences(8))


@pytest.mark.parametrize("loss_at_n, loss_at_twice_n, kind", [
    (3.0, 1.5, "COUNTS_ITEMS"),  # a sum over items divided by N
    (3.0, 1.5 * (1 + 1e-4), "COUNTS_ITEMS"),  # float rounding
    (3.0, 3.0, "MEAN"),  # N ignored
    (3.0, 3.0 * (1 - 1e-4), "MEAN"),
    (3.0, 2.0, "PARTLY"),  # a counted part and one that is not
    (3.0, 4.0, "PARTLY"),  # grows with N: nothing a bridge could weight
    (0.0, 0.0, "UNKNOWN"),  # every rank's loss 0: judged again at the next step
    (float("nan"), float("nan"), "UNKNOWN"),
    (float("inf"), 1.0, "UNKNOWN"),
])
def test_a_loss_is_judged_by_what_twice_the_items_do_to_it(loss_at_n, loss_at_twice_n, kind):
    from hetero_ray.train.huggingface import LossKind, judge_loss_kind

    assert judge_loss_kind(loss_at_n, loss_at_twice_n) is LossKind[kind]


@pytest.mark.parametrize("kind, label_smoothing, verdict", [
    ("token_loss", 0.0, "COUNTS_ITEMS"),
    ("kwargs_mean_loss", 0.0, "MEAN"),
    ("kwargs_mean_loss", 0.1, "COUNTS_ITEMS"),  # the Trainer's label smoother divides by the items itself
])
def test_the_trainers_loss_is_measured_at_twice_the_items_without_changing_the_model(tmp_path, kind, label_smoothing,
                                                                                      verdict):
    """GPT-2 and BERT both take ``**kwargs`` (the Trainer counts items for both); GPT-2's
    loss divides by them, BERT's does not unless the Trainer computes it (label smoothing).
    Measuring leaves the modes of the modules, the inputs and the gradients as they were."""
    from hetero_ray.train.huggingface import LossKind, judge_loss_kind, losses_at_n_and_twice_n

    model = make_model(kind)
    trainer = transformers.Trainer(model=model, args=training_args(str(tmp_path),
                                                                   label_smoothing_factor=label_smoothing))
    assert trainer.model_accepts_loss_kwargs  # what the Trainer believes of both
    batch = transformers.default_data_collator([make_dataset(kind, 4)[i] for i in range(4)])
    model.train()
    frozen = next(m for m in model.modules() if isinstance(m, torch.nn.Dropout))
    frozen.eval()
    losses = losses_at_n_and_twice_n(trainer.compute_loss, model, batch, torch.tensor(7))

    assert judge_loss_kind(*losses.tolist()) is LossKind[verdict]
    assert not losses.requires_grad and all(p.grad is None for p in model.parameters())
    assert model.training and not frozen.training
    assert all(m.training for m in model.modules() if m is not frozen)
    assert "labels" in batch  # the label smoother's compute_loss pops them from the dict it is given


def test_the_ddp_options_read_no_deprecated_attribute(tmp_path):
    """The Trainer's rule for find_unused_parameters, read as transformers 5 reads it
    (``is_gradient_checkpointing`` warns on every rank, where Ray Train's recipe does not)."""
    from hetero_ray.train.huggingface import _ddp_kwargs

    trainer = _trainer(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ddp_kwargs(trainer) == {"find_unused_parameters": True}
        trainer.model.activation_checkpointing_enable()
        assert _ddp_kwargs(trainer) == {"find_unused_parameters": False}  # it would break the checkpointing
    assert _ddp_kwargs(_trainer(tmp_path, activation_checkpointing=True))["find_unused_parameters"] is False


def test_gradient_accumulation_is_refused_with_what_to_set(tmp_path):
    from hetero_ray.train import prepare_trainer

    with pytest.raises(UserError, match=r"gradient_accumulation_steps=1 and HeteroConfig\(global_batch_size"):
        prepare_trainer(_trainer(tmp_path, gradient_accumulation_steps=4))


def test_ray_trains_own_report_callback_is_refused(tmp_path):
    from ray.train.huggingface.transformers import RayTrainReportCallback as RayCallback

    from hetero_ray.train import prepare_trainer

    trainer = _trainer(tmp_path)
    trainer.add_callback(RayCallback())
    with pytest.raises(UserError, match="use hetero_ray.train.huggingface.RayTrainReportCallback"):
        prepare_trainer(trainer)


def test_not_a_trainer_is_refused():
    from hetero_ray.train import prepare_trainer

    with pytest.raises(UserError, match="takes a transformers.Trainer, got Module"):
        prepare_trainer(torch.nn.Module())


def test_without_transformers_the_error_says_what_to_install(monkeypatch):
    from hetero_ray.train import huggingface

    monkeypatch.setattr(huggingface, "_IMPORT_ERROR", ImportError("No module named 'transformers'"))
    with pytest.raises(UserError, match=r"pip install '\.\[hf\]'"):
        huggingface.prepare_trainer(object())
    with pytest.raises(UserError, match=r"pip install '\.\[hf\]'"):
        huggingface.RayTrainReportCallback()


def test_a_trainer_on_another_device_than_the_rank_is_refused():
    from hetero_ray.train.huggingface import _check_device

    _check_device(torch.device("cuda"), torch.device("cuda", 0))  # the same device, spelled two ways
    with pytest.raises(UserError, match=r"placed this rank on cpu.*TrainingArguments\(use_cpu=True\)"):
        _check_device(torch.device("cuda", 0), torch.device("cpu"))


def test_prepare_trainer_outside_a_run_says_where_it_belongs(tmp_path):
    from hetero_ray.train import prepare_trainer

    with pytest.raises(UserError, match="inside the train_loop_per_worker"):
        prepare_trainer(_trainer(tmp_path))
