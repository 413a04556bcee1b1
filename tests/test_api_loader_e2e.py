"""prepare_data_loader end to end, on a real local Ray with real gloo groups and real
DataLoader worker processes: the ways a user's data loop used to go wrong without a word.

- ranks that choose their own DataLoader num_workers (natural on a mixed cluster) agree
  on the steps where plans change, and train every sample once (they used to enter the
  plan broadcast at different steps: a hang until the process group's timeout, or a
  wrong plan read from another collective);
- a batch looked at before training (next(iter(loader))), or left by a break before its
  backward pass, is not counted as trained: every sample is trained exactly once and the
  weights are one device's; a look on rank 0 only does not make the ranks enter
  different collectives;
- Ray Train's Fashion-MNIST example, with each Ray Train call swapped for its hetero_ray
  twin and nothing else changed (a DataLoader for training and one for testing, both
  through prepare_data_loader), runs and reports plain TorchTrainer's test loss.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch

from hetero_ray import HeteroConfig, HeteroTrainer
from tests import api_jobs

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# A hang in a collective must end the test as a failure, not after Ray's 30 minutes.
PROCESS_GROUP_TIMEOUT_S = 60


def _fit_trained_ids(tmp_path, name, num_workers, hetero, **config):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    trained_dir = tmp_path / f"{name}-trained"
    trained_dir.mkdir()
    trainer = HeteroTrainer(
        api_jobs.trained_ids_loop,
        train_loop_config={"trained_dir": str(trained_dir), **config},
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(name=name, storage_path=str(tmp_path)),
        hetero_config=hetero,
        torch_config=TorchConfig(backend="gloo", timeout_s=PROCESS_GROUP_TIMEOUT_S),
    )
    trainer.fit()
    return str(tmp_path / name), trained_dir


def _assert_trained_exactly_once(run_dir, trained_dir, num_workers, num_samples, epochs):
    """Every sample went through one backward pass per epoch, and the run's sample-id
    records say the same samples."""
    trained = {}
    for rank in range(num_workers):
        with open(trained_dir / f"rank{rank}.json") as f:
            for batch in json.load(f):
                trained.setdefault(batch["epoch"], []).extend(batch["indices"])
    assert sorted(trained) == list(range(epochs))
    for epoch, indices in trained.items():
        assert sorted(indices) == list(range(num_samples)), f"epoch {epoch}: trained {len(indices)} samples"
    ids = pd.read_parquet(os.path.join(run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert sorted(rows["sample_index"]) == list(range(num_samples)), f"recorded, epoch {epoch}"
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    assert not steps.duplicated(["global_step", "rank"]).any()


def test_ranks_with_their_own_loader_workers_agree_on_plan_changes_and_a_peek_on_rank_0_only(ray_session, tmp_path):
    """Rank 0 loads in the training process and looks at one batch before training (alone:
    the other rank does not, so a look that entered a collective would split theirs); rank
    1 loads with two DataLoader processes (4 steps of indices ahead); a plan change at
    every rebalance point."""
    num_samples, batch, epochs = 96, 16, 2
    hetero = HeteroConfig(global_batch_size=batch, policy="static", batch_split=(8, 8), rebalance_interval=1,
                          record_sample_ids=True,
                          plan_changes=({"global_step": 1, "local_batch_sizes": [12, 4]},
                                        {"global_step": 5, "local_batch_sizes": [4, 12]},
                                        {"global_step": 9, "local_batch_sizes": [10, 6]}))
    run_dir, trained_dir = _fit_trained_ids(tmp_path, "own-workers", 2, hetero, num_samples=num_samples,
                                            epochs=epochs, loader_workers_by_rank=[0, 2], peek_ranks=[0])

    _assert_trained_exactly_once(run_dir, trained_dir, 2, num_samples, epochs)
    plans = pd.read_parquet(os.path.join(run_dir, "plans.parquet")).sort_values("first_global_step")
    assert plans["first_global_step"].tolist() == [0, 1, 5, 9]
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    assert steps[steps["global_step"] == 6].sort_values("rank")["local_batch_size"].tolist() == [4, 12]


def test_a_peek_before_training_and_a_break_train_every_sample_once(ray_session, tmp_path):
    num_samples, batch, epochs = 96, 24, 2
    hetero = HeteroConfig(global_batch_size=batch, policy="static", record_sample_ids=True)
    run_dir, trained_dir = _fit_trained_ids(tmp_path, "peek", 3, hetero, num_samples=num_samples, epochs=epochs,
                                            loader_workers_by_rank=[0, 2, 0], peek_ranks=[0, 1, 2],
                                            break_before_step=5)

    _assert_trained_exactly_once(run_dir, trained_dir, 3, num_samples, epochs)
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    assert steps["global_step"].nunique() == epochs * num_samples // batch
    # The weights of one device on the same global batches: the peeked step was trained once.
    reference = api_jobs.one_device(num_samples, batch, epochs)
    weights = torch.load(trained_dir / "weights.pt", weights_only=True)
    worst = max((reference[k].float() - weights[k].float()).abs().max().item() for k in reference)
    assert worst < 1e-5, worst


def _fashion_mnist(tmp_path, api, epochs):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    losses_file = tmp_path / f"{api}-losses.jsonl"
    global_batch_size, num_workers = 32, 2
    config = {"api": api, "lr": 1e-2, "epochs": epochs, "batch_size_per_worker": global_batch_size // num_workers,
              "losses_file": str(losses_file)}
    run_config = RunConfig(name=f"fashion-{api}", storage_path=str(tmp_path))
    scaling = ScalingConfig(num_workers=num_workers)
    if api == "ray":
        TorchTrainer(api_jobs.fashion_mnist_loop, train_loop_config=config, scaling_config=scaling,
                     run_config=run_config).fit()
    else:
        HeteroTrainer(api_jobs.fashion_mnist_loop, train_loop_config=config, scaling_config=scaling,
                      run_config=run_config, hetero_config=HeteroConfig(global_batch_size=global_batch_size,
                                                                        policy="static")).fit()
    with open(losses_file) as f:
        return [json.loads(line) for line in f]


def test_ray_trains_fashion_mnist_example_ported_call_for_call_matches_torch_trainer(ray_session, tmp_path):
    epochs = 2
    ray_losses = _fashion_mnist(tmp_path, "ray", epochs)
    hetero_losses = _fashion_mnist(tmp_path, "hetero", epochs)

    assert [r["epoch"] for r in hetero_losses] == list(range(epochs))
    # Rank 0 evaluated the same half of the test set (the DistributedSampler's split).
    assert [r["num_total"] for r in hetero_losses] == [r["num_total"] for r in ray_losses] == [32] * epochs
    # The first epoch sees the same global batches in the same order (hetero_ray's and
    # DistributedSampler's permutations agree for epoch 0 with seed 0): the same loss.
    assert hetero_losses[0]["loss"] == pytest.approx(ray_losses[0]["loss"], abs=1e-5)
    # Later epochs are shuffled by other seeds (same samples, other batches): close.
    for ours, theirs in zip(hetero_losses[1:], ray_losses[1:]):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-2), (ray_losses, hetero_losses)
    reports = pd.read_parquet(tmp_path / "fashion-hetero" / "reports.parquet").sort_values("global_step")
    assert [json.loads(m)["loss"] for m in reports["metrics"]] == [r["loss"] for r in hetero_losses]
