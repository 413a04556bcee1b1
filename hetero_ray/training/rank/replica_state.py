"""A replica's whole training state, copied from rank 0 to every rank.

A rank the plan leaves out still steps its optimiser, scaler and scheduler on a probe of
weight 0, so its replica drifts. Where that could reach the user — a rank brought back,
the end of an epoch, an evaluation (:class:`StaleRanks`) — every rank receives rank 0's
model parameters and buffers, every optimiser of the model's parameters (state and
``param_groups``), their learning-rate schedulers and every enabled ``GradScaler``. The
user hands none of these to hetero_ray: they are found among the worker's live objects by
type (:func:`~hetero_ray.training.rank.heap.live_instances`) and sent in one table keyed by
what is the same on every rank. Why, and how the objects are found and paired:
docs/worker-runtime.md#the-replica-state-and-rejoining
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from hetero_ray.errors import UserError
from hetero_ray.training.rank.heap import live_instances

SOURCE_RANK = 0
# What a replica's state is made of besides the model (found by class among the live objects).
TRAINING_STATE_KINDS = (torch.optim.Optimizer, LRScheduler, torch.amp.GradScaler)


class StaleRanks:
    """The ranks whose replica may differ from rank 0's: left out at a step since their last
    copy. Every rank keeps the same set, from the plans all ranks agreed on, so every rank
    knows without asking when a copy is due (and enters it at the same point)."""

    def __init__(self):
        self.ranks: set[int] = set()

    def note_plan(self, local_batch_sizes) -> None:
        """A step runs under these shares: the ranks at 0 fall behind."""
        self.ranks.update(rank for rank, share in enumerate(local_batch_sizes) if share == 0)

    def __bool__(self) -> bool:
        return bool(self.ranks)

    def copied(self) -> None:
        """Every rank holds rank 0's state now (a rank still out falls behind at its next step)."""
        self.ranks = set()


@torch.no_grad()
def copy_from_rank0(model: nn.Module, rank: int, device: torch.device) -> None:
    """Collective of all ranks: rank 0's model, optimisers, schedulers and scalers everywhere.

    ``device`` is the one collectives take (CPU under gloo, the GPU under NCCL)."""
    for tensor in [*model.parameters(), *model.buffers()]:
        moved = tensor.data if tensor.device == device else tensor.data.to(device)
        dist.broadcast(moved, src=SOURCE_RANK)
        if moved is not tensor.data:
            tensor.data.copy_(moved)
    parts = find_training_state(model)
    box = [_to_cpu(parts.state_dicts()) if rank == SOURCE_RANK else None]
    dist.broadcast_object_list(box, src=SOURCE_RANK, device=device if device.type == "cuda" else None)
    if rank != SOURCE_RANK:
        parts.load(box[0], rank)


class TrainingState:
    """The optimisers, schedulers and scalers of one worker, each under a key that names the
    same object on every rank."""

    def __init__(self, optimizers: dict, schedulers: dict, scalers: dict):
        self.optimizers, self.schedulers, self.scalers = optimizers, schedulers, scalers

    def state_dicts(self) -> dict:
        return {kind: {key: part.state_dict() for key, part in parts.items()}
                for kind, parts in (("optimizers", self.optimizers), ("schedulers", self.schedulers),
                                    ("scalers", self.scalers))}

    def load(self, sent: dict, rank: int) -> None:
        for kind, parts in (("optimizers", self.optimizers), ("schedulers", self.schedulers),
                            ("scalers", self.scalers)):
            theirs = sent[kind]
            if set(theirs) != set(parts):
                raise UserError(
                    f"rank {rank} holds other {kind} than rank 0 ({_described(parts)} here, {_described(theirs)} "
                    f"on rank 0), so a rank brought back cannot take rank 0's state: make the same {kind} on every "
                    "rank, in train_loop_per_worker")
            for key, part in parts.items():
                part.load_state_dict(theirs[key])  # an optimiser's state moves to its parameters' device


def find_training_state(model: nn.Module) -> TrainingState:
    """This worker's optimisers of ``model``'s parameters, their schedulers, and its enabled
    gradient scalers, found among the live objects (see the module docstring)."""
    found = _keyed(model, live_instances(TRAINING_STATE_KINDS))
    if found is None:  # two of a kind where one is usual: one may have died while frozen
        objects = live_instances(TRAINING_STATE_KINDS, collect_frozen=True)
        found = _keyed(model, objects) or _keyed(model, objects, allow_twins=True)  # or there are two
    return found


def _keyed(model: nn.Module, objects: list, allow_twins: bool = False) -> Optional[TrainingState]:
    """The training state among ``objects``; None when it holds two optimisers of the same
    parameters, two enabled scalers, or two schedulers of one class on one optimiser (unless
    ``allow_twins``)."""
    positions = {id(p): i for i, p in enumerate(model.parameters())}
    optimizers, schedulers, scalers = {}, {}, {}
    for obj in objects:
        kind = type(obj)  # not isinstance: it reads __class__, which some lazy module objects warn on
        if issubclass(kind, torch.optim.Optimizer) and not _wraps_an_optimizer(obj):
            key = _optimizer_key(obj, positions)
            if key is not None:
                if key in optimizers and not allow_twins:
                    return None
                optimizers[key] = obj
        elif issubclass(kind, LRScheduler):
            schedulers.setdefault(id(obj), obj)
        elif issubclass(kind, torch.amp.GradScaler) and obj.is_enabled():
            if scalers and not allow_twins:
                return None
            scalers[len(scalers)] = obj
    by_optimizer = {id(o): key for key, o in optimizers.items()}
    keyed_schedulers: dict[Any, LRScheduler] = {}
    for scheduler in schedulers.values():
        optimizer_key = by_optimizer.get(id(_inner_optimizer(scheduler.optimizer)))
        if optimizer_key is None:
            continue  # schedules an optimiser of something else
        base = (optimizer_key, type(scheduler).__name__)
        count = sum(1 for k in keyed_schedulers if k[:2] == base)
        if count and not allow_twins:
            return None
        keyed_schedulers[(*base, count)] = scheduler
    return TrainingState(optimizers, keyed_schedulers, scalers)


def _wraps_an_optimizer(optimizer) -> bool:
    # Accelerate's AcceleratedOptimizer is an Optimizer around the real one (which is found too).
    return isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer)


def _inner_optimizer(optimizer):
    while _wraps_an_optimizer(optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def _optimizer_key(optimizer, positions: dict[int, int]) -> Optional[tuple]:
    """The positions of its parameters in the model, group by group (None: none of the model's)."""
    groups = tuple(tuple(positions.get(id(p), -1) for p in group["params"]) for group in optimizer.param_groups)
    if not any(i >= 0 for group in groups for i in group):
        return None
    return groups


def _described(parts) -> str:
    return str(len(parts)) if parts else "none"


def _to_cpu(value):
    # A CUDA rank's state must unpickle on a CPU rank too; load_state_dict moves it back.
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
