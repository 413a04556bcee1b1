"""``hetero_ray.train.prepare_model``: the user's model on this rank's device, in DDP, with
the gradient weighting, the busy-time clock and (where it has BatchNorm) exact
statistics of the whole global batch.

The communication hook (:mod:`hetero_ray.training.gradients.weighting`) weights each rank by
``b_i / B``, set by the loader before each step (``1/n`` outside the loader's steps); the
clock's hooks mark the step in progress of the session's
:class:`~hetero_ray.training.rank.current_step.CurrentStep`; BatchNorm layers become
:class:`~hetero_ray.training.gradients.batchnorm.HeteroSyncBatchNorm`, and such a model is
never cut into micro-batches (:mod:`hetero_ray.training.gradients.micro_batches`).
Why: docs/worker-runtime.md#one-devices-gradient-under-unequal-shares and the sections after it
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hetero_ray.errors import UserError
from hetero_ray.training.gradients.batchnorm import HeteroSyncBatchNorm, convert_batchnorm, has_batchnorm
from hetero_ray.training.gradients.micro_batches import MicroBatchPolicy
from hetero_ray.training.gradients.weighting import WeightedAllReduceState, weighted_allreduce_hook
from hetero_ray.training.rank.current_step import CurrentStep
from hetero_ray.training.rank.session import WorkerSession
from hetero_ray.training.timing import steps as timing

logger = logging.getLogger("hetero_ray.worker")

# DDP's switch for its buffer broadcast before each forward pass: renamed in newer torch
# (the old name warns there); both keep the one broadcast at construction.
_FORWARD_BUFFER_SYNC = ("forward_sync_buffers" if "forward_sync_buffers" in
                        inspect.signature(DistributedDataParallel.__init__).parameters else "broadcast_buffers")


@dataclass(frozen=True)
class PreparedModel:
    """What ``prepare_model`` makes, once per worker: the DDP model and what hangs on it."""

    ddp: DistributedDataParallel
    weight_state: WeightedAllReduceState  # the gradient hook's state, shared with the BatchNorm layers
    micro_batching: MicroBatchPolicy  # how a share past the memory cap is cut (training/gradients/micro_batches.py)


def prepare_model(session: WorkerSession, model: nn.Module, *, sync_batchnorm: bool = True,
                  ddp_kwargs: Optional[dict[str, Any]] = None) -> DistributedDataParallel:
    if not isinstance(model, nn.Module):
        raise UserError(f"hetero_ray.train.prepare_model takes a torch.nn.Module, got {type(model).__name__}")
    if session.parts.model is not None:
        raise UserError("hetero_ray.train.prepare_model was called twice on this worker: the gradient "
                        "weighting belongs to one model per run; prepare the model once (wrap several "
                        "networks in one nn.Module)")
    if not any(p.requires_grad for p in model.parameters()):
        raise UserError("hetero_ray.train.prepare_model: the model has no parameter that requires a "
                        "gradient, so there is nothing to train")
    state = WeightedAllReduceState(num_workers=session.identity.num_workers, in_step=_InLoaderStep(session))
    synced_batchnorm = False
    if has_batchnorm(model):
        if sync_batchnorm:
            model = convert_batchnorm(model, state)
            synced_batchnorm = True
        elif session.identity.rank == 0:
            logger.warning("sync_batchnorm=False: this model's BatchNorm layers normalise each rank's "
                           "local batch on its own, so with unequal shares training no longer follows "
                           "the mathematics of one device on the global batch")
    device = session.identity.device
    model = model.to(device)
    ddp_kwargs = dict(ddp_kwargs or {})
    if _buffers_all_synced(model):
        # DDP's default re-broadcast of buffers from rank 0 before every forward pass is a
        # collective of all ranks, which would tie a rank left out to every step; the exact
        # BatchNorm's buffers are the same on every rank in by construction, and a rank
        # brought back receives them (training/rank/rejoin.py).
        if "broadcast_buffers" not in ddp_kwargs:
            ddp_kwargs.setdefault(_FORWARD_BUFFER_SYNC, False)
    ddp_model = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, **ddp_kwargs,
    )
    ddp_model.register_comm_hook(state, weighted_allreduce_hook)
    clock = timing.BucketClock(session.current_step, session.emulator)
    state.on_bucket_ready = clock
    state.on_bucket_reduced = clock.reduced
    ddp_model.register_forward_hook(_forward_clock(session.current_step))
    session.parts.model = PreparedModel(ddp_model, state, MicroBatchPolicy(synced_batchnorm, session.identity.rank))
    return ddp_model


def _buffers_all_synced(model: nn.Module) -> bool:
    """Whether every buffer of ``model`` belongs to an exact BatchNorm (the same on every rank)."""
    synced = {id(b) for m in model.modules() if isinstance(m, HeteroSyncBatchNorm) for b in m.buffers()}
    return all(id(b) in synced for b in model.buffers())


class _InLoaderStep:
    """Whether the rank is inside a step that ``prepare_data_loader`` handed out (so the
    step's ``b_i / B`` applies); called by the hook and the batch norm at every bucket and
    layer. The first time a gradient is taken on a worker that never made that loader,
    rank 0 says what the run does instead of planning."""

    def __init__(self, session: WorkerSession):
        self._session = session
        self._said = session.identity.rank != 0

    def __call__(self) -> bool:
        if self._session.current_step.timeline is not None:
            return True
        if not self._said and self._session.parts.loader is None:
            self._said = True
            logger.warning("prepare_model without prepare_data_loader: the ranks' gradients are averaged as DDP "
                           "averages them (right for equal local batches, e.g. a DistributedSampler); hetero_ray's "
                           "unequal shares, and its step timings, need hetero_ray.train.prepare_data_loader")
        return False


def _forward_clock(current: CurrentStep):
    def mark_forward_done(module, inputs, output) -> None:
        timeline = current.timeline
        if timeline is not None and torch.is_grad_enabled() and not timeline.has(timing.FORWARD_DONE):
            timeline.mark(timing.FORWARD_DONE)

    return mark_forward_done
