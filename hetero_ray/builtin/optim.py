"""Optimiser and learning-rate schedule: functions of the global batch only.

Nothing here sees the number of workers or their speeds, so the trajectory of the
optimiser is the one a single device would follow on the same global batches.
"""

from __future__ import annotations

import math

import torch

MOMENTUM = 0.9
ADAMW_WEIGHT_DECAY = 0.01


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=ADAMW_WEIGHT_DECAY)
    raise ValueError(f"unknown optimizer {name!r}")


def make_lr_scheduler(name: str, optimizer, total_steps: int):
    """``constant``, or ``cosine``: lr · ½(1 + cos(π·t/T)) over the run's T global steps."""
    if name == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    if name == "cosine":
        horizon = max(1, total_steps)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, horizon) / horizon))
        )
    raise ValueError(f"unknown lr schedule {name!r}")


def total_steps(epochs: int, steps_per_epoch: int, max_steps) -> int:
    planned = epochs * steps_per_epoch
    return planned if max_steps is None else min(planned, max_steps)


def run_steps(config, num_samples: int) -> int:
    """The run's length in global steps: ``config.epochs`` over ``num_samples`` training
    samples (a :class:`~hetero_ray.builtin.config.TrainConfig`), at most its ``max_steps``."""
    from hetero_ray.sampler import GlobalSampler

    sampler = GlobalSampler(num_samples, config.global_batch_size, config.seed, config.drop_last)
    return total_steps(config.epochs, sampler.steps_per_epoch, config.max_steps)
