"""BatchNorm over the global batch when ranks hold unequal local batches.

:class:`HeteroSyncBatchNorm` normalises as one device would on all B samples. Forward: per
channel, one all-reduce (SUM, float64) of [Σx, Σx², n] over the ranks in,

    N = Σ_i n_i,   mean = S / N,   var = Q / N − mean²      (biased, to normalise)
    running ← (1 − m) · running + m · (mean, var · N / (N − 1))

Backward: one all-reduce of the weighted per-channel sums of the upstream gradient, from
which each rank builds the true dx of its samples and hands autograd dx / w_i (the unscaled
units of :mod:`hetero_ray.training.gradients.weighting`). Why not ``torch.nn.SyncBatchNorm``,
and what empty shares and ranks left out do: docs/worker-runtime.md#exact-batch-norm
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.lazy import LazyModuleMixin

# Sums over a global batch of feature maps run to millions of terms per channel;
# float32 would keep only the leading digits of each.
STAT_DTYPE = torch.float64

# torch's BatchNorm takes `bias` only from 2.14 on (torch_range.TORCH_MIN is older): without
# it, a BatchNorm with affine=True always has a β, and none of an older torch lacks one.
_BATCHNORM_TAKES_BIAS = "bias" in inspect.signature(_BatchNorm.__init__).parameters


def _reduced_dims(x: Tensor) -> list[int]:
    """Every dimension but the channels (dim 1): batch and spatial."""
    return [0, *range(2, x.dim())]


def _per_channel(values: Tensor, x: Tensor) -> Tensor:
    """A (C,) tensor shaped to broadcast against x of shape (N, C, *)."""
    return values.view(1, -1, *([1] * (x.dim() - 2)))


def _compute_dtype(x: Tensor) -> torch.dtype:
    # Half-precision inputs are normalised in float32, as torch's kernels do.
    return torch.promote_types(x.dtype, torch.float32)


def _collective_device(x: Tensor, group: Optional[dist.ProcessGroup]) -> torch.device:
    # NCCL only moves CUDA tensors; gloo (and the other CPU backends) take CPU ones.
    return x.device if dist.get_backend(group) == "nccl" else torch.device("cpu")


def _local_moments(x: Tensor, rank_weight: float) -> Tensor:
    """(3, C) float64 rows [Σx, Σx², n] of this rank's elements; zeros when w_i = 0.

    Σx² goes through a shift c = mean of this rank rounded to the compute dtype, so that
    the squares are of small deviations and keep their digits when |mean| ≫ std:

        Σx² = Σ(x − c)² + c · (2 · Σx − n · c)
    """
    channels = x.size(1)
    if rank_weight == 0.0:  # a dummy sample: nothing of it may enter the statistics
        return torch.zeros(3, channels, dtype=STAT_DTYPE, device=x.device)
    dims = _reduced_dims(x)
    count = x.numel() // channels
    total = x.sum(dim=dims, dtype=STAT_DTYPE)
    shift = (total / count).to(_compute_dtype(x))
    deviations = x.to(shift.dtype) - _per_channel(shift, x)
    shift = shift.to(STAT_DTYPE)
    squares = (deviations * deviations).sum(dim=dims, dtype=STAT_DTYPE) + shift * (2 * total - count * shift)
    return torch.stack([total, squares, torch.full_like(total, count)])


@torch.no_grad()  # the statistics' gradient is the Function's backward, not autograd's
def _global_moments(x: Tensor, rank_weight: float, group: Optional[dist.ProcessGroup],
                    device: torch.device) -> tuple[Tensor, Tensor, int]:
    """Float64 (mean, biased var) per channel over all ranks' real samples, and N.

    Raises:
        ValueError: on every rank alike (N is global), when N < 2: a variance needs two values.
    """
    moments = _local_moments(x, rank_weight).to(device)
    dist.all_reduce(moments, op=dist.ReduceOp.SUM, group=group)
    count = int(moments[2, 0].item())
    if count < 2:
        raise ValueError(f"HeteroSyncBatchNorm needs more than 1 value per channel over all ranks in training, "
                         f"got {count}; use a larger global batch or put the model in eval mode")
    moments = moments.to(x.device)
    mean = moments[0] / count
    var = (moments[1] / count - mean * mean).clamp_min(0.0)  # rounding may dip just below 0
    return mean, var, count


def _normalise(x: Tensor, mean: Tensor, invstd: Tensor) -> Tensor:
    """x̂ = (x − mean) · invstd in the compute dtype, from float64 mean and invstd.

    Subtracting the mean rounded to float32 would cost |mean| · 2⁻²⁴ · invstd of accuracy,
    a lot when |mean| ≫ std; split mean = c + (mean − c) with c that rounded mean:

        x̂ = (x − c) · invstd − (mean − c) · invstd      (x − c is exact for x near c)
    """
    dtype = _compute_dtype(x)
    rounded = mean.to(dtype)
    offset = ((mean - rounded.to(mean.dtype)) * invstd).to(dtype)
    return (x.to(dtype) - _per_channel(rounded, x)) * _per_channel(invstd.to(dtype), x) - _per_channel(offset, x)


class _HeteroSyncBatchNormFunction(torch.autograd.Function):
    """y = γ · x̂ + β with global statistics; the backward is the global batch's, per rank."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, gamma: Optional[Tensor], beta: Optional[Tensor], mean: Tensor,
                invstd: Tensor, count: int, rank_weight: float, group: Optional[dist.ProcessGroup],
                device: torch.device) -> Tensor:
        y = _normalise(x, mean, invstd)
        if gamma is not None:
            y = y * _per_channel(gamma.to(y.dtype), x)
        if beta is not None:
            y = y + _per_channel(beta.to(y.dtype), x)
        ctx.save_for_backward(x, gamma, mean, invstd)
        ctx.count, ctx.rank_weight, ctx.group, ctx.device = count, rank_weight, group, device
        ctx.beta_dtype = None if beta is None else beta.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor):
        x, gamma, mean, invstd = ctx.saved_tensors
        count, rank_weight = ctx.count, ctx.rank_weight
        dims = _reduced_dims(x)
        channels = x.size(1)
        xhat = _normalise(x, mean, invstd)
        dy = grad_output.to(xhat.dtype)  # dy' of this rank, unscaled: the true dy_i = w_i · dy'_i

        # γ and β get this rank's own sums; the hook weights them by w_i and adds the ranks:
        #     ∂L/∂β = Σ_i w_i · Σ dy'_i,        ∂L/∂γ = Σ_i w_i · Σ (dy'_i · x̂_i)
        if rank_weight == 0.0:  # a dummy sample's gradient is whatever its loss made; drop it
            sum_dy = torch.zeros(channels, dtype=STAT_DTYPE, device=x.device)
            sum_dy_xhat = torch.zeros_like(sum_dy)
        else:
            sum_dy = dy.sum(dim=dims, dtype=STAT_DTYPE)
            sum_dy_xhat = (dy * xhat).sum(dim=dims, dtype=STAT_DTYPE)

        grad_input = None
        if ctx.needs_input_grad[0]:  # the same on every rank: the graphs are the same
            # S1 = Σ_j w_j · Σ dy'_j,   S2 = Σ_j w_j · Σ (dy'_j · x̂_j)     (over ranks j)
            sums = torch.stack([sum_dy, sum_dy_xhat]) * rank_weight
            sums = sums.to(ctx.device)
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=ctx.group)
            s1, s2 = sums.to(x.device)
            if rank_weight == 0.0:
                grad_input = torch.zeros_like(x)
            else:
                # One device's dx over the global batch, for rank i's samples:
                #     dx_i = γ · invstd · (w_i · dy'_i − S1 / N − x̂_i · S2 / N)
                # and autograd on rank i gets it in unscaled units, since every parameter
                # gradient it feeds is multiplied by w_i in the hook:
                #     dx'_i = dx_i / w_i = γ · invstd · (dy'_i − (S1 + x̂_i · S2) / (N · w_i))
                scale = invstd if gamma is None else invstd * gamma.to(STAT_DTYPE)
                per_sample = count * rank_weight
                c1 = _per_channel((s1 / per_sample).to(dy.dtype), x)
                c2 = _per_channel((s2 / per_sample).to(dy.dtype), x)
                grad_input = (_per_channel(scale.to(dy.dtype), x) * (dy - c1 - xhat * c2)).to(x.dtype)

        grad_gamma = sum_dy_xhat.to(gamma.dtype) if gamma is not None and ctx.needs_input_grad[1] else None
        grad_beta = sum_dy.to(ctx.beta_dtype) if ctx.beta_dtype is not None and ctx.needs_input_grad[2] else None
        return grad_input, grad_gamma, grad_beta, None, None, None, None, None, None


class HeteroSyncBatchNorm(_BatchNorm):
    """BatchNorm with the statistics and gradients of the global batch over unequal ranks.

    A drop-in for ``BatchNorm1d/2d/3d`` (inputs (N, C), (N, C, L), (N, C, H, W),
    (N, C, D, H, W)) in a model wrapped by DDP with
    :func:`~hetero_ray.training.gradients.weighting.weighted_allreduce_hook`. In training mode each
    forward reads ``weight_state.weight`` (w_i = b_i / B, 0 for a dummy sample) and runs one
    all-reduce; each backward runs one more. Eval mode, and training without a process group
    or with one rank, are torch's local BatchNorm unchanged.

    Args:
        num_features, eps, momentum, affine, track_running_stats, device, dtype, bias: as
            for ``torch.nn.BatchNorm2d`` (``momentum=None``: cumulative moving average).
        process_group: the group to normalise over; ``None`` for the default group. It must
            be the group the hook reduces over.
        weight_state: any object with a float ``weight``, usually the hook's
            :class:`~hetero_ray.training.gradients.weighting.WeightedAllReduceState`.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: Optional[dist.ProcessGroup] = None, device=None, dtype=None, *,
                 weight_state: Any, bias: bool = True) -> None:
        # Looked up without reading it: the state's `weight` is a property whose read
        # outside a loader's step is what tells rank 0 it trains without the loader.
        if inspect.getattr_static(weight_state, "weight", None) is None:
            raise TypeError("HeteroSyncBatchNorm: weight_state must have a float attribute `weight` (b_i / B of this "
                            f"rank), e.g. a WeightedAllReduceState; got {type(weight_state).__name__}")
        if _BATCHNORM_TAKES_BIAS:
            super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)
        else:
            super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
            if affine and not bias:  # what bias=False does where torch has it
                self.register_parameter("bias", None)
        self.process_group = process_group
        self.weight_state = weight_state  # not `weight`: that name is γ

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"HeteroSyncBatchNorm expects input (N, C, *) with at least 2 dimensions, "
                             f"got {input.dim()}D")
        if input.size(1) != self.num_features:
            raise ValueError(f"HeteroSyncBatchNorm was built for {self.num_features} channels, "
                             f"got input with {input.size(1)} in dim 1")

    def _rank_weight(self) -> float:
        rank_weight = float(self.weight_state.weight)
        if not 0.0 <= rank_weight <= 1.0:
            raise ValueError(f"weight_state.weight must be b_i / B in [0, 1], got {rank_weight}")
        return rank_weight

    def _group(self) -> Optional[dist.ProcessGroup]:
        """The group set at construction, else the one the hook reduces over now (None: all ranks)."""
        if self.process_group is not None:
            return self.process_group
        return getattr(self.weight_state, "process_group", None)

    def _needs_sync(self) -> bool:
        if not (dist.is_available() and dist.is_initialized()):
            return False
        return dist.get_world_size(self._group()) > 1

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        if self.training and not getattr(self.weight_state, "takes_part", True):
            # Left out of the plan: its probe's output trains nothing (w = 0), and its
            # buffers are the group's again when it is brought back (training/rank/rejoin.py).
            mean = self.running_mean if self.running_mean is not None else torch.zeros(
                self.num_features, device=input.device, dtype=input.dtype)
            var = self.running_var if self.running_var is not None else torch.ones_like(mean)
            return F.batch_norm(input, mean, var, self.weight, self.bias, False, 0.0, self.eps)
        # Torch's bookkeeping, as in _BatchNorm.forward: the average factor, and batch
        # statistics in training (or in eval without running buffers).
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        tracked = not self.training or self.track_running_stats
        running_mean = self.running_mean if tracked else None
        running_var = self.running_var if tracked else None

        # Like torch.nn.SyncBatchNorm, eval mode never synchronises.
        if not (self.training and self._needs_sync()):
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, batch_stats, factor,
                                self.eps)

        rank_weight = self._rank_weight()
        group = self._group()
        device = _collective_device(input, group)
        mean, var, count = _global_moments(input, rank_weight, group, device)
        if running_mean is not None and running_var is not None:
            _update_running_stats(running_mean, running_var, mean, var, count, factor)
        invstd = torch.rsqrt(var + self.eps)
        return _HeteroSyncBatchNormFunction.apply(input, self.weight, self.bias, mean, invstd, count, rank_weight,
                                                  group, device)


@torch.no_grad()
def _update_running_stats(running_mean: Tensor, running_var: Tensor, mean: Tensor, var: Tensor, count: int,
                          factor: float) -> None:
    """running ← (1 − m) · running + m · batch, with the unbiased var · N / (N − 1).

    Every rank holds the same all-reduced sums, so every rank computes the same bits.
    """
    unbiased = var * (count / (count - 1))
    running_mean.copy_((1.0 - factor) * running_mean.to(STAT_DTYPE) + factor * mean)
    running_var.copy_((1.0 - factor) * running_var.to(STAT_DTYPE) + factor * unbiased)


def has_batchnorm(module: torch.nn.Module) -> bool:
    """Whether ``module`` or any submodule is a BatchNorm (any ``_BatchNorm``, SyncBatchNorm included)."""
    return any(isinstance(m, _BatchNorm) for m in module.modules())


def convert_batchnorm(module: torch.nn.Module, weight_state: Any,
                      process_group: Optional[dist.ProcessGroup] = None) -> torch.nn.Module:
    """Replace every BatchNorm in ``module`` by a :class:`HeteroSyncBatchNorm`.

    Like ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``: the new layers take over the
    old ones' Parameter objects (so an optimiser built before still holds them), running
    buffers, num_batches_tracked, eps, momentum and training flag. Convert before wrapping
    the model in DDP. Layers already converted are kept as they are.

    Returns:
        ``module`` with its BatchNorms replaced, or a new layer if ``module`` itself is one.

    Raises:
        ValueError: for a lazy BatchNorm that has not yet seen an input (its size is unknown).
    """
    converted = module
    if isinstance(module, _BatchNorm) and not isinstance(module, HeteroSyncBatchNorm):
        if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
            raise ValueError(f"cannot convert {type(module).__name__} before its first forward pass: run one batch "
                             "through the model first so its number of features is known")
        converted = HeteroSyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                        module.track_running_stats, process_group, weight_state=weight_state,
                                        bias=module.bias is not None)
        if module.affine:
            converted.weight = module.weight
            converted.bias = module.bias
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        converted.training = module.training
        if hasattr(module, "qconfig"):
            converted.qconfig = module.qconfig
    for name, child in module.named_children():
        converted.add_module(name, convert_batchnorm(child, weight_state, process_group))
    return converted
