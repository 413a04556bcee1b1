"""Ranks left out and brought back: the groups of the ranks in, and the state a rank
receives when it rejoins.

A plan that leaves ranks out (``b_i = 0``) all-reduces over a process group of the ranks in
only. ``torch.distributed.new_group`` must be called by every rank, in the same order, for
every group; so every rank makes the group of each plan right after agreeing on it
(:meth:`Groups.for_plan`, inside the agreed plan protocol), and keeps it for the next plan
with the same ranks in.

A rank left out skips the gradient all-reduce (its hook returns a zero gradient), yet the
user's loop still runs its optimiser step: momentum, weight decay and Adam's moments move
its parameters away from the group's. Nothing of that survives: at the step a plan brings
ranks back, before its forward pass, every rank enters one broadcast of the model's
parameters and buffers and of every optimiser's state from rank 0, which a plan never
leaves out (it holds the run's state: it writes the checkpoints, and it is the source
here). The broadcast is a collective of all ranks at the same step, like the plan's own.

The optimisers are found by a global optimiser step hook (the user makes them after
``prepare_model``): any optimiser that steps a parameter of the prepared model.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from hetero_ray.planning.plan import Plan

SOURCE_RANK = 0  # never left out (planning/policies.py), so its state is the group's


class Groups:
    """The process group of each set of ranks in, made once by all ranks together."""

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self._groups: dict[tuple[int, ...], Optional[dist.ProcessGroup]] = {}

    def for_plan(self, plan: Plan) -> None:
        """Collective (every rank, the same plans in the same order): makes the group of
        ``plan``'s ranks in unless it exists. Every rank in: the default group."""
        ranks = plan.in_ranks
        if ranks in self._groups or len(ranks) == self.num_workers:
            return
        self._groups[ranks] = dist.new_group(list(ranks))

    def of(self, plan: Plan) -> Optional[dist.ProcessGroup]:
        """The group of ``plan``'s ranks in (None: every rank); made by :meth:`for_plan`."""
        ranks = plan.in_ranks
        if len(ranks) == self.num_workers:
            return None
        if ranks not in self._groups:
            raise RuntimeError(f"no process group for ranks {list(ranks)}: every plan's group is made when the ranks "
                               "agree on it")
        return self._groups[ranks]


class OptimizerWatch:
    """The optimisers that step the prepared model's parameters, in the order they first step."""

    def __init__(self, model: nn.Module):
        self._params = {id(p) for p in model.parameters()}
        self.optimizers: list[torch.optim.Optimizer] = []
        self._handle = register_optimizer_step_post_hook(self._seen)

    def _seen(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        if any(o is optimizer for o in self.optimizers):
            return
        if any(id(p) in self._params for group in optimizer.param_groups for p in group["params"]):
            self.optimizers.append(optimizer)

    def close(self) -> None:
        self._handle.remove()


def brings_back(previous: Optional[Plan], plan: Plan) -> tuple[int, ...]:
    """The ranks ``plan`` puts in that ``previous`` left out."""
    if previous is None or previous.num_workers != plan.num_workers:
        return ()
    return tuple(r for r in plan.in_ranks if previous.local_batch_sizes[r] == 0)


@torch.no_grad()
def bring_back(model: nn.Module, optimizers: list, rank: int, device: torch.device) -> None:
    """Collective of all ranks: rank 0's parameters, buffers and optimiser states everywhere.

    ``device`` is the one collectives take (CPU under gloo, the GPU under NCCL)."""
    for tensor in [*model.parameters(), *model.buffers()]:
        moved = tensor.data if tensor.device == device else tensor.data.to(device)
        dist.broadcast(moved, src=SOURCE_RANK)
        if moved is not tensor.data:
            tensor.data.copy_(moved)
    for optimizer in optimizers:
        box = [_to_cpu(optimizer.state_dict()) if rank == SOURCE_RANK else None]
        dist.broadcast_object_list(box, src=SOURCE_RANK, device=device if device.type == "cuda" else None)
        if rank != SOURCE_RANK:
            optimizer.load_state_dict(box[0])  # casts the state to each parameter's device


def _to_cpu(value):
    # A CUDA rank's state must unpickle on a CPU rank too; load_state_dict moves it back.
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
