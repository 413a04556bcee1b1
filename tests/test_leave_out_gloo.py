"""Ranks left out and brought back, at the level of the mechanism: three real gloo
processes, DDP with the weighted hook, the exact BatchNorm, and the groups and state
broadcast of training/rank/rejoin.py, against one device (torch's own BatchNorm) on the same
global batches. (tests/test_leave_out_e2e.py runs the same through Ray and the loader.)

- a plan that leaves ranks out all-reduces over the group of the ranks in, and its
  BatchNorm normalises over that group: one device's gradients, statistics and steps;
- a rank left out never takes part: its gradient is zero, and its parameters drift from the
  group's under momentum while it is out;
- a rank brought back receives rank 0's parameters, buffers and optimiser state, after
  which every rank is one device again (< 1e-5) to the end;
- a set of ranks in keeps its group only while a plan that can still run has it in: over
  every set of ranks, twice, a rank holds no more in the second round than in the first,
  and no group's socket or thread once every rank is in again.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hetero_ray.planning.plan import Plan
from hetero_ray.training.gradients.batchnorm import convert_batchnorm
from hetero_ray.training.gradients.model_prep import _FORWARD_BUFFER_SYNC
from hetero_ray.training.gradients.weighting import WeightedAllReduceState, rank_weight, weighted_allreduce_hook
from hetero_ray.training.rank.rejoin import Groups
from hetero_ray.training.rank.replica_state import StaleRanks, copy_from_rank0
from tests.helpers import on_gloo_ranks
from tests.batchnorm_cases import LEARNING_RATE, MODELS, make_batches, train_on_one_device

pytestmark = pytest.mark.slow

WORLD_SIZE = 3
# out, back, one out, back: every switch a rank makes
SPLITS = [[7, 3, 2], [12, 0, 0], [12, 0, 0], [6, 0, 6], [4, 4, 4], [2, 6, 4]]


def train_on_ranks(rank: int, model_name: str) -> dict:
    make_model, input_shape = MODELS[model_name]
    state = WeightedAllReduceState(num_workers=WORLD_SIZE)
    model = convert_batchnorm(make_model(), state)
    # no buffer broadcast before each forward (a collective of all ranks), as prepare_model sets it
    ddp_model = DistributedDataParallel(model, bucket_cap_mb=0.001, **{_FORWARD_BUFFER_SYNC: False})
    ddp_model.register_comm_hook(state, weighted_allreduce_hook)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LEARNING_RATE, momentum=0.9)
    groups, stale = Groups(WORLD_SIZE), StaleRanks()
    record = {"grads": [], "params": []}
    for version, (split, (inputs, targets)) in enumerate(zip(SPLITS, make_batches(input_shape, SPLITS))):
        plan = Plan(version, tuple(split))
        groups.for_plan(plan)  # every rank, every plan, in order (as agree_on_plan does)
        if any(r in stale.ranks for r in plan.in_ranks):  # as the loader does at a step that brings ranks back
            copy_from_rank0(ddp_model, rank, torch.device("cpu"))
            stale.copied()
        stale.note_plan(split)
        takes_part = split[rank] > 0
        state.use_group(groups.of(plan), len(plan.in_ranks), takes_part)
        start = sum(split[:rank])
        piece = slice(start, start + split[rank]) if takes_part else slice(0, 4)  # out: a probe, weight 0
        state.weight = rank_weight(split[rank], sum(split))
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp_model(inputs[piece]), targets[piece]).backward()
        record["grads"].append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
        record["params"].append([p.detach().clone() for p in model.parameters()])
    record["statistics"] = {name: b.detach().clone() for name, b in model.named_buffers()}
    return record


# Every set of ranks a plan could keep in, twice: more sets than are ever in force at once,
# and each set coming back after its group was closed.
SUBSETS = [(0,), (0, 1), (0, 2), (1, 2), (1,), (2,)] * 2
STEPS_PER_PLAN = 2


def _held() -> tuple[int, int]:
    """This process's open file descriptors and threads: what a gloo group holds."""
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def groups_over_many_plans(rank: int) -> dict:
    """Plans over SUBSETS, between two of every rank in, each agreed one step before it
    takes effect (as the loader agrees ahead): each step all-reduces over its plan's group."""
    full = tuple(range(WORLD_SIZE))
    plans = [Plan(v, tuple(4 if r in ranks else 0 for r in range(WORLD_SIZE)))
             for v, ranks in enumerate([full, *SUBSETS, full, full])]
    groups = Groups(WORLD_SIZE)
    record = {"before": _held(), "held": [], "sums": []}
    groups.for_plan(plans[0])
    for step in range(len(plans) * STEPS_PER_PLAN):
        following = (step + 1) // STEPS_PER_PLAN
        if (step + 1) % STEPS_PER_PLAN == 0 and following < len(plans):
            groups.for_plan(plans[following])  # every rank, at the same step
            record["held"].append(_held())
        plan = plans[step // STEPS_PER_PLAN]
        group = groups.of(plan)
        if rank in plan.in_ranks:
            total = torch.tensor([rank + 1.0])
            dist.all_reduce(total, group=group)
            record["sums"].append((total.item(), sum(r + 1.0 for r in plan.in_ranks)))
    return record


def _rank(rank: int, world_size: int) -> dict:
    groups = groups_over_many_plans(rank)  # first: what it holds is measured from a process with no group
    return {"groups": groups, **{name: train_on_ranks(rank, name) for name in MODELS}}


@pytest.fixture(scope="module")
def per_rank() -> list[dict]:
    return on_gloo_ranks(_rank, WORLD_SIZE)


def _max_error(got, want) -> float:
    return max((g - w).abs().max().item() for g, w in zip(got, want))


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_ranks_left_out_and_brought_back_match_one_device(per_rank, model_name):
    reference = train_on_one_device(model_name, SPLITS, lr=LEARNING_RATE)
    for rank, results in enumerate(per_rank):
        got = results[model_name]
        assert _max_error(got["params"][-1], reference["params"]) < 1e-5, f"rank {rank}"
        want_stats = reference["statistics"]
        assert max((got["statistics"][k].double() - want_stats[k].double()).abs().max().item()
                   for k in want_stats) < 1e-5, f"rank {rank}"
    # while out, the ranks in still get one device's gradient: rank 0 at steps 1-3
    rank0 = per_rank[0][model_name]
    for step in (1, 2, 3):
        assert _max_error(rank0["grads"][step], reference["grads"][step]) < 1e-5, f"step {step}"


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_a_rank_left_out_takes_no_part_and_drifts_until_brought_back(per_rank, model_name):
    rank1, rank0 = per_rank[1][model_name], per_rank[0][model_name]
    for step in (1, 2, 3):
        assert all((g == 0).all() for g in rank1["grads"][step]), f"step {step}: no all-reduce, no gradient"
    # momentum moved it away from the group while it was out; the copy from rank 0 put it back
    assert _max_error(rank1["params"][2], rank0["params"][2]) > 1e-3
    assert _max_error(rank1["params"][4], rank0["params"][4]) < 1e-6


def test_groups_no_plan_keeps_are_closed_and_made_again_when_a_plan_comes_back(per_rank):
    """Each plan's group is closed once no plan that can still run has its ranks in: a
    rank holds what the groups in force and agreed ahead hold, the same in the second
    round of SUBSETS as in the first (it held one more group for each new set before), and
    what it held before any group once every rank is in again. A set that comes back gets
    a group again, over which every step's all-reduce sums its ranks."""
    rounds = len(SUBSETS) // 2
    for rank, results in enumerate(per_rank):
        record = results["groups"]
        assert all(got == want for got, want in record["sums"]), f"rank {rank}: {record['sums']}"
        held = record["held"]  # after agreeing on plan 1, 2, …: SUBSETS, then every rank twice
        assert held[1:rounds] == held[rounds + 1:2 * rounds], f"rank {rank}: {held}"
        assert held[-1] == record["before"], f"rank {rank}: {held}"
