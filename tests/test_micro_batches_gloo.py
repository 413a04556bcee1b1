"""Micro-batches past the memory cap keep the mathematics of one device, on a real
multi-process gloo group (no Ray).

Three ranks with shares 32 / 8 / 13 of a global batch of 53; rank 0 is capped at 8
samples (4 micro-batches of 8) and rank 2 at 4 (micro-batches 4/3/3/3, the rescaling
between unequal micro-batches). Each runs its share through
:func:`~hetero_ray.training.gradients.micro_batches.accumulate` with the weighted hook, with a
weight penalty in every micro-batch's loss: after several SGD steps every rank holds the
weights of one process that trained on the whole global batches. The caps reach every
rank with the plan (:func:`~hetero_ray.training.rank.plan_sync.broadcast_plan`).
"""

import torch
from torch.nn.parallel import DistributedDataParallel

from hetero_ray.planning.plan import Plan
from hetero_ray.training.gradients.micro_batches import MicroBatchPolicy, accumulate, split_batch
from hetero_ray.training.gradients.weighting import WeightedAllReduceState, rank_weight, weighted_allreduce_hook
from hetero_ray.training.rank.plan_sync import broadcast_plan
from tests.helpers import on_gloo_ranks

SHARES = [32, 8, 13]
CAPS = [8, None, 4]
GLOBAL_BATCH_SIZE = sum(SHARES)
STEPS = 5
PENALTY = 0.01  # a loss term that is no mean over samples: it must count once per step


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def global_batch(step: int):
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(GLOBAL_BATCH_SIZE, 10, generator=generator), torch.randint(0, 4, (GLOBAL_BATCH_SIZE,),
                                                                                   generator=generator)


def loss_of(model, inputs, targets):
    first = model.module[0] if isinstance(model, DistributedDataParallel) else model[0]
    return torch.nn.functional.cross_entropy(model(inputs), targets) + PENALTY * first.weight.pow(2).sum()


def one_device() -> dict:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        loss_of(model, *global_batch(step)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


def _rank(rank: int, world_size: int) -> dict:
    plan, caps = broadcast_plan(Plan(3, tuple(SHARES)) if rank == 0 else None, rank, world_size,
                                torch.device("cpu"), CAPS if rank == 0 else None)
    model = DistributedDataParallel(make_model(), bucket_cap_mb=0.001)  # several buckets, as a real model
    state = WeightedAllReduceState(weight=rank_weight(plan.local_batch_sizes[rank], GLOBAL_BATCH_SIZE))
    model.register_comm_hook(state, weighted_allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    policy = MicroBatchPolicy(synced_batchnorm=False, rank=rank)
    start = sum(SHARES[:rank])
    micro_sizes = []
    for step in range(STEPS):
        inputs, targets = global_batch(step)
        share = (inputs[start:start + SHARES[rank]], targets[start:start + SHARES[rank]])
        sizes = policy.sizes(SHARES[rank], caps[rank], None)
        micro_sizes.append(sizes)
        for micro_inputs, micro_targets in accumulate(model, state, split_batch(share, sizes), sizes):
            loss_of(model, micro_inputs, micro_targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {"weights": model.module.state_dict(), "caps": caps, "micro_sizes": micro_sizes,
            "all_reduces": state.backward_passes}


def test_shares_past_the_cap_in_micro_batches_end_with_the_weights_of_one_device():
    results = on_gloo_ranks(_rank, len(SHARES))

    assert all(r["caps"] == CAPS for r in results)  # every rank learned every cap with the plan
    assert results[0]["micro_sizes"] == [[8, 8, 8, 8]] * STEPS
    assert results[1]["micro_sizes"] == [[8]] * STEPS
    assert results[2]["micro_sizes"] == [[4, 3, 3, 3]] * STEPS
    assert all(r["all_reduces"] == STEPS for r in results)  # one weighted all-reduce per step

    reference = one_device()
    initial = make_model().state_dict()
    assert max((reference[k] - initial[k]).abs().max().item() for k in reference) > 1e-2, "nothing was trained"
    for rank, result in enumerate(results):
        worst = max((reference[k] - result["weights"][k]).abs().max().item() for k in reference)
        assert worst < 1e-5, f"rank {rank} differs from one device by {worst}"
