"""A share larger than the rank's memory cap, trained as several micro-batches in one step.

:func:`micro_batches` cuts a share of ``b_i`` samples past the cap ``cap_i`` into
``m = ⌈b_i / cap_i⌉`` micro-batches of nearly equal sizes ``k_1 … k_m``; the loop runs
forward and backward on each, the gradients accumulate under DDP's ``no_sync``, and only
the last backward all-reduces: still one weighted all-reduce per step. After micro-batch j
the accumulated gradient is rescaled by ``k_j / k_{j+1}``, and the hook weights the last by
``w_i · k_m / b_i`` (``WeightedAllReduceState.grad_scale``), so the all-reduce gives
``Σ_i w_i · ĝ_i`` with ``ĝ_i = Σ_j (k_j / b_i) · g_j``: one device's step on the global
batch. A model with hetero_ray's synced BatchNorm is never cut (its statistics are the
global batch's); ``prepare_model(model, sync_batchnorm=False)`` opts in.

Why, and what the busy time covers: docs/worker-runtime.md#micro-batches
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterator, Optional, Sequence

import torch

from hetero_ray.errors import UserError
from hetero_ray.planning.plan import equal_split

logger = logging.getLogger("hetero_ray.worker")


def micro_batch_sizes(batch_size: int, max_size: Optional[int]) -> list[int]:
    """``⌈b / max_size⌉`` nearly equal sizes that sum to ``batch_size`` (one: no cap, or it fits)."""
    if max_size is None or batch_size <= max_size:
        return [batch_size]
    return equal_split(batch_size, math.ceil(batch_size / max_size))


def split_batch(batch: Any, sizes: Sequence[int]) -> list[Any]:
    """``batch`` cut along the first dimension of its tensors into pieces of ``sizes``.

    Tensors in nested tuples, lists (named tuples too) and dicts are cut; other values
    (a flag, a name) go to every piece as they are.

    Raises:
        UserError: a tensor whose first dimension is not the batch's size, or a list of
            the batch's length that holds no tensor (it cannot be told from a value).
    """
    total = sum(sizes)
    starts = [sum(sizes[:j]) for j in range(len(sizes))]

    def cut(value: Any, j: int) -> Any:
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 or value.size(0) != total:
                raise UserError(f"micro_batches: a tensor of shape {tuple(value.shape)} in a batch of {total} samples; "
                                "every tensor of the batch must have the samples along its first dimension")
            return value[starts[j]:starts[j] + sizes[j]]
        if isinstance(value, (list, tuple)):
            if len(value) == total and not any(isinstance(v, (torch.Tensor, list, tuple, dict)) for v in value) \
                    and not hasattr(value, "_fields"):
                raise UserError(f"micro_batches: a {type(value).__name__} of {total} values in a batch of {total} "
                                "samples cannot be told from a per-batch value; collate it into a tensor")
            pieces = [cut(v, j) for v in value]
            return type(value)(*pieces) if hasattr(value, "_fields") else type(value)(pieces)
        if isinstance(value, dict):
            return type(value)({k: cut(v, j) for k, v in value.items()})
        return value

    return [cut(batch, j) for j in range(len(sizes))]


def batch_size_of(batch: Any) -> int:
    """The first dimension of the batch's first tensor.

    Raises:
        UserError: no tensor in the batch.
    """
    if isinstance(batch, torch.Tensor) and batch.dim() > 0:
        return batch.size(0)
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        try:
            return batch_size_of(value)
        except UserError:
            continue
    raise UserError(f"micro_batches needs a batch of tensors (a tensor, or tuples, lists, dicts of them), got "
                    f"{type(batch).__name__}")


def accumulate(model: torch.nn.parallel.DistributedDataParallel, weight_state: Any, pieces: Sequence[Any],
               sizes: Sequence[int]) -> Iterator[Any]:
    """Yields ``pieces``; the loop runs forward and backward on each (see the module
    docstring for the rescaling and ``grad_scale``). Every piece but the last runs under
    ``model.no_sync()``."""
    if len(pieces) == 1:
        yield pieces[0]
        return
    try:
        for j, piece in enumerate(pieces):
            if j == len(pieces) - 1:
                weight_state.grad_scale = sizes[j] / sum(sizes)
                yield piece
                continue
            with model.no_sync():
                yield piece
            _rescale_gradients(model, sizes[j] / sizes[j + 1], j)
    finally:
        weight_state.grad_scale = 1.0


def _rescale_gradients(model: torch.nn.Module, factor: float, index: int) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        raise UserError(f"micro_batches: no gradient after micro-batch {index}: run loss.backward() on every "
                        "micro-batch, and call optimizer.step() and zero_grad() once, after the last one")
    if factor != 1.0:
        torch._foreach_mul_(grads, factor)


class MicroBatchPolicy:
    """Whether and how this worker cuts a batch; what its session knows of the model.

    Args:
        synced_batchnorm: the prepared model normalises with hetero_ray's synced BatchNorm
            (never cut: see the module docstring).
        rank: for the one warning.
    """

    def __init__(self, synced_batchnorm: bool, rank: int):
        self.synced_batchnorm = synced_batchnorm
        self.rank = rank
        self.cuts = False  # the loop called micro_batches on a model that may be cut
        self._warned = False

    def sizes(self, batch_size: int, cap: Optional[int], max_size: Optional[int]) -> list[int]:
        """The micro-batch sizes of a batch of ``batch_size``: cut at ``max_size`` when the
        loop gives one, else at the rank's memory ``cap``.

        Raises:
            UserError: ``max_size`` on a model with synced BatchNorm.
        """
        if self.synced_batchnorm:
            if max_size is not None:
                raise UserError("micro_batches(max_size=...) on a model with hetero_ray's synced BatchNorm: its "
                                "statistics are those of the whole global batch, which micro-batches cannot keep; "
                                "leave max_size out (shares then stay within each device's memory cap), or prepare "
                                "the model with hetero_ray.train.prepare_model(model, sync_batchnorm=False) to "
                                "normalise each micro-batch on its own")
            if cap is not None and batch_size > cap and not self._warned:
                self._warned = True
                logger.warning("rank %d: a batch of %d samples is past this rank's memory cap %d, but the model's "
                               "BatchNorm is synced over the global batch, so it is trained whole (the planner "
                               "keeps such a model's shares within the caps; this share was set by hand); "
                               "prepare_model(model, sync_batchnorm=False) trains it in micro-batches, each "
                               "normalised on its own", self.rank, batch_size, cap)
            return [batch_size]
        self.cuts = True
        return micro_batch_sizes(batch_size, max_size if max_size is not None else cap)


def micro_batches(session: Any, batch: Any, max_size: Optional[int] = None) -> Iterator[Any]:
    """What ``hetero_ray.train.micro_batches`` does on the worker whose ``session`` runs
    (see its docstring); the checks run at the call, the cutting as it is iterated."""
    model = session.parts.model
    if model is None:
        raise UserError("hetero_ray.train.micro_batches needs the model prepared by hetero_ray.train.prepare_model "
                        "(it holds back the all-reduce until the last micro-batch): prepare it first")
    if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1):
        raise UserError(f"micro_batches(max_size=...) must be a positive integer (samples), got {max_size!r}")
    loader = session.parts.loader
    sizes = model.micro_batching.sizes(batch_size_of(batch), loader.memory_cap if loader is not None else None,
                                       max_size)
    pieces = split_batch(batch, sizes) if len(sizes) > 1 else [batch]
    return accumulate(model.ddp, model.weight_state, pieces, sizes)
