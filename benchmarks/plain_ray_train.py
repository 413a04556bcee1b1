"""The baseline: a plain Ray Train loop, as a user would write it without hetero_ray.

Equal local batches ``B/n``, ``ray.train.torch.prepare_model`` (DDP with its default
equal-weight average), no per-step records, no plan, no emulation. It does get
hetero_ray's allocator setting (:mod:`hetero_ray.training.rank.allocator`), so that the
comparison measures what hetero_ray's machinery costs; what the setting itself gains is
``benchmarks/allocator.py``'s figure. Same model, same
in-memory data and the same global batch as the hetero_ray run it is compared with.
Rank 0 writes its step end times to ``result_path`` (the benchmark runs on one machine).
"""

from __future__ import annotations

import json
import time


def plain_train_loop(loop_config: dict) -> None:
    import ray.train
    import ray.train.torch
    import torch

    from hetero_ray.builtin.data import load_dataset
    from hetero_ray.builtin.models import build_model, compute_loss
    from hetero_ray.builtin.optim import make_optimizer
    from hetero_ray.training.rank.allocator import keep_freed_memory

    keep_freed_memory()
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    data = load_dataset(loop_config["dataset"], num_samples=loop_config["num_samples"],
                        eval_samples=64, seed=loop_config["seed"])
    torch.manual_seed(loop_config["seed"])
    model = ray.train.torch.prepare_model(build_model(loop_config["model"], data.spec))
    optimizer = make_optimizer("sgd", model.parameters(), loop_config["lr"])
    global_batch_size = loop_config["batch_size"]
    local_batch_size = global_batch_size // world_size
    num_samples = len(data.train)
    permutation = torch.randperm(num_samples, generator=torch.Generator().manual_seed(loop_config["seed"]))
    step_ends = []
    for step in range(loop_config["steps"]):
        start = (step * global_batch_size) % (num_samples - global_batch_size + 1)
        mine = permutation[start + rank * local_batch_size:start + (rank + 1) * local_batch_size]
        inputs, targets = data.train.batch(mine)
        loss = compute_loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step_ends.append(time.time())
    if rank == 0:
        with open(loop_config["result_path"], "w") as f:
            json.dump({"step_end_times": step_ends, "global_batch_size": global_batch_size}, f)


def run_plain(model: str, dataset: str, num_samples: int, batch_size: int, steps: int,
              num_workers: int, lr: float, seed: int, result_path: str) -> list[float]:
    """Runs the plain loop on the connected Ray; returns rank 0's step end times."""
    import os
    import sys

    from ray import cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # The loop is shipped by value: Ray's workers need not find benchmarks/ (it is not
    # installed, and the cluster's workers may not start in this checkout).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    trainer = TorchTrainer(
        plain_train_loop,
        train_loop_config=dict(model=model, dataset=dataset, num_samples=num_samples, batch_size=batch_size,
                               steps=steps, lr=lr, seed=seed, result_path=result_path),
        scaling_config=ScalingConfig(num_workers=num_workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name="plain", storage_path=os.path.dirname(result_path)),
    )
    trainer.fit()
    with open(result_path) as f:
        return json.load(f)["step_end_times"]
