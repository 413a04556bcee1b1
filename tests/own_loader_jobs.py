"""A Ray Train habit carried over: ``prepare_model`` with the user's own ``DataLoader`` and
``DistributedSampler`` instead of ``prepare_data_loader`` (importable by Ray workers).

``one_device`` is the reference: the same model on the same global batches in one process.
With ``shuffle=False`` a ``DistributedSampler`` deals index ``j`` to rank ``j mod n``, so
global step ``s`` of ``n`` ranks with local batch ``b`` holds exactly indices
``[s·n·b, (s+1)·n·b)``: one device's batch ``s`` of size ``n·b``.
"""

from __future__ import annotations

import os
import tempfile

import ray.train
import torch
import torch.nn.functional as F

import hetero_ray.train
from tests.api_jobs import LR, MOMENTUM, PatternDataset, make_model


def own_loader_loop(config: dict) -> None:
    context = hetero_ray.train.get_context()
    model = hetero_ray.train.prepare_model(make_model())
    dataset = PatternDataset(config["num_samples"])
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=context.get_world_size(),
                                                  rank=context.get_world_rank(), shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=config["local_batch_size"], sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for epoch in range(config["epochs"]):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            loss = F.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = None
        if context.get_world_rank() == 0:
            torch.save(model.module.state_dict(), os.path.join(directory, "model.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        hetero_ray.train.report({"loss": loss.item()}, checkpoint=checkpoint)


def one_device(num_samples: int, global_batch_size: int, epochs: int) -> dict:
    model, data = make_model(), PatternDataset(num_samples)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for _ in range(epochs):
        for start in range(0, num_samples, global_batch_size):
            loss = F.cross_entropy(model(data.inputs[start:start + global_batch_size]),
                                   data.targets[start:start + global_batch_size])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.state_dict()
