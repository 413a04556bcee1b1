"""Gradients of the global batch from unequal local batches.

Rank i's gradient is the mean over its b_i samples, so the global-batch gradient is

    g = (1/B) Σ_j ∇ℓ_j = Σ_i (b_i / B) · g_i,       g_i = (1/b_i) Σ_{j ∈ rank i} ∇ℓ_j

The communication hook below scales each bucket by w_i = b_i / B and all-reduces with SUM
over the group of the plan's ranks in (``process_group``), which gives exactly g on every
rank; for the last, shorter window of an epoch, B is the window's size. A rank left out
(``b_i = 0``) gets a zero gradient at once. The last bucket ends the rank's busy time
(:mod:`hetero_ray.training.timing.steps`). Why DDP's own average (weights 1/n) is wrong, and
the ranks left out: docs/worker-runtime.md#one-devices-gradient-under-unequal-shares
"""

# No `from __future__ import annotations` here: DDP checks the hook's annotations at
# registration and rejects them as strings.
from typing import Callable, Optional

import torch
import torch.distributed as dist


class WeightedAllReduceState:
    """What the hook (and the batch norm) read every step.

    Attributes:
        weight: ``w_i`` for the gradient now being reduced. Within a step handed out by
            ``prepare_data_loader`` it is the step's ``b_i / B`` (the loader sets it when it
            hands the step out). Outside such a step — the user's own ``DataLoader``, or a
            backward pass between steps — nobody knows the split, and it is ``1/n``: DDP's
            own average, which is the one-device gradient when the ranks' batches are equal
            (as ``DistributedSampler`` and Ray Train make them). A default of 1 would sum the
            ranks' mean gradients: n× the gradient, silently.
        on_bucket_ready: called with ``is_last`` before each bucket is reduced; used for
            timing and for emulated slow devices (which delay here, before communicating).
        on_bucket_reduced: called when a bucket's all-reduce has completed, from the
            communication thread; used for timing.
        grad_scale: a factor on top of ``weight`` for the bucket: 1, except while the last
            micro-batch of a share trained in micro-batches runs, whose accumulated
            gradient it brings back to the mean over the share (see
            :mod:`hetero_ray.training.gradients.micro_batches`).
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, weight: float = 1.0, *,
                 num_workers: int = 1, in_step: Optional[Callable[[], bool]] = None,
                 on_bucket_ready: Optional[Callable[[bool], None]] = None,
                 on_bucket_reduced: Optional[Callable[[], None]] = None):
        """Args:
            weight: the step weight ``b_i / B`` until the loader sets one.
            num_workers: ``n`` of the equal weight ``1/n`` used outside a loader's step.
            in_step: whether a loader's step is in progress; None means always (the
                weight set is always the one to use, as in a hand-built test group).
        """
        self.process_group = process_group
        self._step_weight = weight
        self.num_workers = num_workers
        self.in_step = in_step
        self.on_bucket_ready = on_bucket_ready
        self.on_bucket_reduced = on_bucket_reduced
        self.backward_passes = 0  # gradients handed to the all-reduce in full, this worker group
        self.grad_scale = 1.0
        self.takes_part = True  # False: the plan in force leaves this rank out
        # Ranks in process_group once the loader has said (use_group); None: not said, so
        # all-reduce over the group as given (a hand-built group is never taken for one rank).
        self.group_size: Optional[int] = None

    def use_group(self, process_group: Optional[dist.ProcessGroup], group_size: int, takes_part: bool) -> None:
        """The ranks in the plan in force: their group (None: every rank) and its size, and
        whether this rank is one of them. Set by the loader at each step."""
        self.process_group, self.group_size, self.takes_part = process_group, group_size, takes_part

    @property
    def alone(self) -> bool:
        """Whether this rank is the only one in the plan's group: nothing to all-reduce with."""
        return self.group_size is not None and self.group_size <= 1

    @property
    def weight(self) -> float:
        if self.in_step is None or self.in_step():
            return self._step_weight
        return 1.0 / self.num_workers

    @weight.setter
    def weight(self, value: float) -> None:
        self._step_weight = value


def weighted_allreduce_hook(
    state: WeightedAllReduceState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: ``bucket ← Σ_i w_i · bucket_i`` over the process group."""
    if state.on_bucket_ready is not None:
        state.on_bucket_ready(bucket.is_last())
    if bucket.is_last():
        state.backward_passes += 1
    tensor = bucket.buffer()
    on_reduced = state.on_bucket_reduced
    if not state.takes_part or state.alone:
        # Left out: a zero gradient, no all-reduce. Alone in the group: its gradient is the
        # global batch's already (w = 1).
        tensor.mul_(state.weight * state.grad_scale if state.takes_part else 0.0)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(tensor)
        if on_reduced is not None:
            on_reduced()
        return done
    tensor.mul_(state.weight * state.grad_scale)
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=state.process_group, async_op=True)

    def reduced(fut):
        if on_reduced is not None:
            on_reduced()
        return fut.value()[0]

    return work.get_future().then(reduced)


def rank_weight(local_batch_size: int, window_size: int) -> float:
    """``w_i = b_i / B`` for the samples this rank takes out of a window of ``window_size``."""
    return local_batch_size / window_size
