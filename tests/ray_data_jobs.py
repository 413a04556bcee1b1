"""The Ray Data tests' model and loop: a float64 model with BatchNorm and a smooth
activation (one device's weights are then a matter of float64 rounding only), the rows
(tests/ray_data_rows.py: made from their id by a ``map_batches`` and augmented by a second
one, as a pipeline does on the cluster), and a user's loop written as for Ray Train, on
``hetero_ray.train``."""

from __future__ import annotations

import os
import tempfile
from typing import Optional

import numpy as np
import ray.train
import torch
import torch.distributed as dist

import hetero_ray.train
from tests import api_jobs
from tests.ray_data_rows import augment, features

SEED = 5
LR, MOMENTUM = 0.05, 0.9


def make_model() -> torch.nn.Module:
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 1)).double()


def one_device(num_rows: int, global_batches: list[list[int]]) -> dict:
    """The weights after training on one device, global batch by global batch (row ids)."""
    rows = augment(features({"id": np.arange(num_rows)}))
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for ids in global_batches:
        x, y = torch.from_numpy(rows["x"][ids]), torch.from_numpy(rows["y"][ids])
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


def restore(model, optimizer) -> Optional[dict]:
    """The checkpoint's model and optimiser state loaded (its whole state returned), if any."""
    checkpoint = hetero_ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        state = torch.load(os.path.join(directory, "state.pt"))
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state


def ray_data_loop(config: dict) -> None:
    """Ray Train's Ray Data recipe on hetero_ray: the shard of "train" each epoch, a
    checkpoint every ``checkpoint_every`` steps and at each epoch's end, and an evaluation
    of "val" (every row once across the ranks: the count is reported)."""
    model = hetero_ray.train.prepare_model(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    state = restore(model, optimizer)
    global_step = state["global_step"] if state else 0
    restored_from = global_step if state else -1
    train, val = hetero_ray.train.get_dataset_shard("train"), hetero_ray.train.get_dataset_shard("val")
    for epoch in range(train.epoch, config["epochs"]):
        for batch in train.iter_torch_batches(batch_size=config.get("batch_size")):
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            api_jobs._maybe_crash(config, global_step)
            global_step += 1
            if global_step % config["checkpoint_every"] == 0:
                _report(model, optimizer, global_step, {"epoch": epoch, "restored_from": restored_from})
        rows, loss_sum = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
        model.eval()
        for batch in val.iter_torch_batches(batch_size=8):
            with torch.no_grad():
                loss_sum += torch.nn.functional.mse_loss(model(batch["x"]), batch["y"], reduction="sum")
            rows += len(batch["x"])
        model.train()
        dist.all_reduce(rows)
        dist.all_reduce(loss_sum)
        _report(model, optimizer, global_step, {"epoch": epoch, "restored_from": restored_from,
                                                "val_rows": int(rows.item()), "val_loss": (loss_sum / rows).item()})


def _report(model, optimizer, global_step: int, metrics: dict) -> None:
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = None
        if ray.train.get_context().get_world_rank() == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "global_step": global_step}, os.path.join(directory, "state.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        hetero_ray.train.report(metrics, checkpoint=checkpoint)
