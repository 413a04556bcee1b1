"""Mixed precision keeps the weighting and the one-device math (issue: GPU jobs train in bf16/fp16).

On a real gloo group: under fp16 autocast with a GradScaler, the hook's gradient is exactly
Σ_i (b_i / B)·g_i of the ranks' own fp16 gradients. (End to end, the built-in job's
--precision bf16 on 3 uneven workers follows one worker in fp32: tests/test_training_e2e.py;
every precision against one device in every combination: tests/test_promise_matrix.py.)
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from hetero_ray.training.gradients.precision import PRECISIONS, Precision
from hetero_ray.training.gradients.weighting import WeightedAllReduceState, rank_weight, weighted_allreduce_hook
from tests.helpers import on_gloo_ranks

LOCAL_BATCH_SIZES = [7, 3, 2]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(sum(LOCAL_BATCH_SIZES), 10, generator=generator), torch.randint(0, 4, (12,), generator=generator)


def _piece(rank: int):
    inputs, targets = _batch()
    start = sum(LOCAL_BATCH_SIZES[:rank])
    return inputs[start:start + LOCAL_BATCH_SIZES[rank]], targets[start:start + LOCAL_BATCH_SIZES[rank]]


def _own_fp16_gradient(rank: int) -> list[torch.Tensor]:
    """What rank ``rank`` computes alone (no DDP), in fp16 autocast: its g_i."""
    model, precision = _model(), Precision.named("fp16", torch.device("cpu"))
    inputs, targets = _piece(rank)
    with precision.autocast():
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def _fp16_gradient_on_ranks(rank: int, world_size: int) -> dict:
    model = DistributedDataParallel(_model(), bucket_cap_mb=0.001)
    model.register_comm_hook(WeightedAllReduceState(weight=rank_weight(LOCAL_BATCH_SIZES[rank], 12)),
                             weighted_allreduce_hook)
    precision = Precision.named("fp16", torch.device("cpu"))
    scaler = precision.make_scaler()
    inputs, targets = _piece(rank)
    with precision.autocast():
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    scaler.scale(loss).backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler.unscale_(optimizer)  # what scaler.step does first
    return {"grads": [p.grad for p in model.parameters()], "scale": scaler.get_scale()}


def test_fp16_with_a_grad_scaler_keeps_the_weighting_exact():
    per_rank = on_gloo_ranks(_fp16_gradient_on_ranks, 3)
    expected = [sum(rank_weight(b, 12) * g for b, g in zip(LOCAL_BATCH_SIZES, grads))
                for grads in zip(*(_own_fp16_gradient(rank) for rank in range(3)))]
    for rank, saved in enumerate(per_rank):
        assert saved["scale"] > 1.0, "the scaler did not scale: the test would not exercise it"
        worst = max((g - e).abs().max().item() for g, e in zip(saved["grads"], expected))
        assert worst < 1e-6, f"rank {rank}: the unscaled, weighted gradient is off by {worst}"


def test_precision_names_are_the_configs():
    from hetero_ray.builtin.config import PRECISIONS as FLAG_CHOICES

    assert PRECISIONS == FLAG_CHOICES
    assert Precision.named("fp32", torch.device("cpu")).make_scaler() is None
    assert Precision.named("bf16", torch.device("cpu")).make_scaler() is None
