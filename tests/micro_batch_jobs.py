"""A user loop that trains its shares in micro-batches (importable by Ray workers), and the
one-device reference it must reach. The model has no BatchNorm: micro-batches keep the
mathematics of one device exactly for such a model."""

from __future__ import annotations

import json
import os
import tempfile

import ray.train
import torch
import torch.nn.functional as F
from torch import nn

import hetero_ray.train
from tests import api_jobs
from tests.api_jobs import LR, MOMENTUM, PatternDataset


def make_model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 6 * 6, 16), nn.ReLU(),
                         nn.Linear(16, 4))


def one_device(num_samples: int, global_batch_size: int, epochs: int, seed: int = 0) -> dict:
    """The reference: this file's model trained on one device (api_jobs.one_device)."""
    return api_jobs.one_device(num_samples, global_batch_size, epochs, seed, build=make_model)


def micro_batch_loop(config: dict) -> None:
    """Each step's share through hetero_ray.train.micro_batches, cut at ``max_sizes[rank]``
    samples; every rank writes the micro-batch sizes it trained to ``out_dir``."""
    rank = ray.train.get_context().get_world_rank()
    model = hetero_ray.train.prepare_model(make_model())
    loader = hetero_ray.train.prepare_data_loader(PatternDataset(config["num_samples"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    trained: dict[int, list[int]] = {}
    for epoch in range(loader.epoch, config["epochs"]):
        for inputs, targets in loader:
            step = loader.position.global_step
            for micro_inputs, micro_targets in hetero_ray.train.micro_batches(
                    (inputs, targets), max_size=config["max_sizes"][rank]):
                F.cross_entropy(model(micro_inputs), micro_targets).backward()
                trained.setdefault(step, []).append(len(micro_targets))
            optimizer.step()
            optimizer.zero_grad()
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if rank == 0:
                torch.save({"model": model.module.state_dict()}, os.path.join(directory, "user_state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(directory)
            hetero_ray.train.report({"epoch": epoch}, checkpoint=checkpoint)
    with open(os.path.join(config["out_dir"], f"rank{rank}.json"), "w") as f:
        json.dump({str(step): sizes for step, sizes in trained.items()}, f)
