"""Invariant 1 (same math as one device), on a real multi-process gloo group.

Three processes with local batches 7/3/2 of one global batch of 12 must produce the
gradient that one process computes on all 12 samples; DDP's default equal-weight average
must not (that is the bug the weighted hook exists to fix).
"""

import torch
from torch.nn.parallel import DistributedDataParallel

from hetero_ray.training.gradients.weighting import WeightedAllReduceState, rank_weight, weighted_allreduce_hook
from tests.helpers import on_gloo_ranks

LOCAL_BATCH_SIZES = [7, 3, 2]
GLOBAL_BATCH_SIZE = sum(LOCAL_BATCH_SIZES)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def make_batch():
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(GLOBAL_BATCH_SIZE, 10, generator=generator)
    targets = torch.randint(0, 4, (GLOBAL_BATCH_SIZE,), generator=generator)
    return inputs, targets


def full_batch_gradient() -> list[torch.Tensor]:
    model = make_model()
    inputs, targets = make_batch()
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    return [p.grad.clone() for p in model.parameters()]


def _rank_gradient(rank: int, weighted: bool) -> list[torch.Tensor]:
    # Tiny buckets so the hook runs for several buckets, as with a real model.
    model = DistributedDataParallel(make_model(), bucket_cap_mb=0.001)
    if weighted:
        state = WeightedAllReduceState(weight=rank_weight(LOCAL_BATCH_SIZES[rank], GLOBAL_BATCH_SIZE))
        model.register_comm_hook(state, weighted_allreduce_hook)
    inputs, targets = make_batch()
    start = sum(LOCAL_BATCH_SIZES[:rank])
    piece = slice(start, start + LOCAL_BATCH_SIZES[rank])
    torch.nn.functional.cross_entropy(model(inputs[piece]), targets[piece]).backward()
    return [p.grad for p in model.parameters()]


def _gradients(rank: int, world_size: int) -> dict:
    return {"weighted": _rank_gradient(rank, True), "unweighted": _rank_gradient(rank, False)}


def test_weighted_hook_gives_the_full_batch_gradient():
    expected = full_batch_gradient()
    per_rank = on_gloo_ranks(_gradients, len(LOCAL_BATCH_SIZES))

    for grads in per_rank:  # every rank holds the same, correct gradient
        for got, want in zip(grads["weighted"], expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    worst_weighted = max((g - e).abs().max().item() for g, e in zip(per_rank[0]["weighted"], expected))
    worst_unweighted = max((g - e).abs().max().item() for g, e in zip(per_rank[0]["unweighted"], expected))
    assert worst_weighted < 1e-6
    assert worst_unweighted > 1e-3, "DDP's equal-weight average should be visibly wrong with a 7/3/2 split"


def test_outside_a_loader_step_the_weight_is_ddps_average():
    """Without prepare_data_loader nobody knows the split: the hook must average (1/n), not
    keep the step weight's default of 1 (which sums the ranks' mean gradients: n×)."""
    in_step = [False]
    state = WeightedAllReduceState(num_workers=4, in_step=lambda: in_step[0])
    assert state.weight == 0.25
    state.weight = rank_weight(6, 8)  # the loader hands a step out ...
    assert state.weight == 0.25  # ... but only a step in progress uses it
    in_step[0] = True
    assert state.weight == 0.75
