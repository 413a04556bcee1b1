"""The built-in resnet18 keeps the mathematics of one device under unequal shares.

Its BatchNorm layers normalise each step with the statistics of the whole global batch
(:mod:`hetero_ray.training.gradients.batchnorm`), as the training loop sets them up: 3 gloo ranks
with local batches 7/3/2 must give the gradient of one device on all 12 samples. Without
the conversion (each rank normalising its own piece) the gradient is visibly wrong.

In float64: with 12 samples, 20 BatchNorm layers make this gradient ill-conditioned, and
float32 on ONE device already differs from float64 by ~1e-3 (relative), more than any
tolerance that would show exactness.
"""

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from hetero_ray.builtin.data import DataSpec
from hetero_ray.builtin.models import build_model, compute_loss
from hetero_ray.training.gradients.batchnorm import convert_batchnorm
from hetero_ray.training.gradients.weighting import WeightedAllReduceState, rank_weight, weighted_allreduce_hook
from tests.helpers import on_gloo_ranks

LOCAL_BATCH_SIZES = [7, 3, 2]
GLOBAL_BATCH_SIZE = sum(LOCAL_BATCH_SIZES)
# 16×16 rather than CIFAR's 32×32: the same layers, a quarter of the work (the last stage 2×2).
SPEC = DataSpec("image", 10, (3, 16, 16))


def make_model():
    torch.manual_seed(0)
    return build_model("resnet18", SPEC).double()


def make_batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(GLOBAL_BATCH_SIZE, *SPEC.input_shape, generator=generator, dtype=torch.float64), \
        torch.randint(0, 10, (GLOBAL_BATCH_SIZE,), generator=generator)


def one_device_gradient() -> list[torch.Tensor]:
    model = make_model()
    inputs, targets = make_batch()
    compute_loss(model(inputs), targets).backward()
    return [p.grad.clone() for p in model.parameters()]


def _rank_gradient(rank: int, convert: bool) -> list[torch.Tensor]:
    state = WeightedAllReduceState(weight=rank_weight(LOCAL_BATCH_SIZES[rank], GLOBAL_BATCH_SIZE))
    model = make_model()
    if convert:
        model = convert_batchnorm(model, state)
    model = DistributedDataParallel(model)
    model.register_comm_hook(state, weighted_allreduce_hook)
    inputs, targets = make_batch()
    start = sum(LOCAL_BATCH_SIZES[:rank])
    piece = slice(start, start + LOCAL_BATCH_SIZES[rank])
    compute_loss(model(inputs[piece]), targets[piece]).backward()
    return [p.grad.clone() for p in model.parameters()]


def _gradients(rank: int, world_size: int) -> dict:
    return {"converted": _rank_gradient(rank, True), "local": _rank_gradient(rank, False)}


def _relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return (torch.cat([(g - w).flatten() for g, w in zip(got, want)]).norm()
            / torch.cat([w.flatten() for w in want]).norm()).item()


@pytest.mark.slow  # three gloo ranks and one device through a real ResNet-18: ~15 s
def test_resnet18_gradient_with_unequal_shares_is_one_devices():
    per_rank = on_gloo_ranks(_gradients, len(LOCAL_BATCH_SIZES))
    expected = one_device_gradient()

    for grads in per_rank:
        assert _relative_error(grads["converted"], expected) < 1e-9
    assert _relative_error(per_rank[0]["local"], expected) > 0.1, \
        "each rank's own BatchNorm statistics should be visibly wrong with a 7/3/2 split"
