"""Cutting a batch into micro-batches (pure functions), and what a loop can get wrong with
them (a one-process gloo group: DDP's ``no_sync`` needs one)."""

from __future__ import annotations

import collections
import random

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hetero_ray.train
from hetero_ray.errors import UserError
from hetero_ray.training.gradients.micro_batches import accumulate, batch_size_of, micro_batch_sizes, split_batch
from hetero_ray.training.gradients.weighting import WeightedAllReduceState, weighted_allreduce_hook


def test_sizes_are_nearly_equal_within_the_cap_and_sum_to_the_batch():
    rng = random.Random(0)
    for _ in range(2000):
        batch_size, cap = rng.randint(1, 500), rng.randint(1, 64)
        sizes = micro_batch_sizes(batch_size, cap)
        assert sum(sizes) == batch_size and max(sizes) <= cap and max(sizes) - min(sizes) <= 1
        assert len(sizes) == -(-batch_size // cap)  # no more micro-batches than the cap needs
    assert micro_batch_sizes(32, 8) == [8, 8, 8, 8] and micro_batch_sizes(30, 8) == [8, 8, 7, 7]
    assert micro_batch_sizes(32, None) == [32] and micro_batch_sizes(5, 8) == [5]


def test_a_batch_is_cut_along_the_first_dimension_of_every_tensor_it_holds():
    Pair = collections.namedtuple("Pair", "inputs targets")
    batch = {"pair": Pair(torch.arange(10).view(5, 2), torch.arange(5)), "mask": [torch.ones(5, 3)], "name": "x"}
    pieces = split_batch(batch, [3, 2])
    assert batch_size_of(batch) == 5
    assert pieces[0]["pair"].inputs.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert pieces[1]["pair"].targets.tolist() == [3, 4]
    assert isinstance(pieces[1]["pair"], Pair) and pieces[1]["mask"][0].shape == (2, 3) and pieces[1]["name"] == "x"


def test_a_batch_that_cannot_be_cut_says_why():
    with pytest.raises(UserError, match="first dimension"):
        split_batch((torch.zeros(4, 2), torch.zeros(3)), [2, 2])
    with pytest.raises(UserError, match="collate it into a tensor"):
        split_batch((torch.zeros(4, 2), ["a", "b", "c", "d"]), [2, 2])
    with pytest.raises(UserError, match="batch of tensors"):
        batch_size_of(["a", "b"])


def test_outside_a_run_micro_batches_says_where_to_call_it():
    with pytest.raises(UserError, match="train_loop_per_worker"):
        hetero_ray.train.micro_batches((torch.zeros(4, 2),))


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_micro_batch_without_backward_is_an_error_and_the_hook_is_left_as_it_was(one_rank_group):
    model = DistributedDataParallel(torch.nn.Linear(2, 1))
    state = WeightedAllReduceState(weight=1.0)
    model.register_comm_hook(state, weighted_allreduce_hook)
    batch = torch.ones(6, 2)
    pieces = accumulate(model, state, split_batch(batch, [3, 3]), [3, 3])
    model(next(pieces)).sum()  # forward only
    with pytest.raises(UserError, match="backward"):
        next(pieces)
    assert state.grad_scale == 1.0 and model.require_backward_grad_sync


def test_accumulated_micro_batches_give_the_gradient_of_the_whole_batch(one_rank_group):
    torch.manual_seed(0)
    whole = torch.nn.Linear(3, 2)
    model = DistributedDataParallel(torch.nn.Linear(3, 2))
    model.module.load_state_dict(whole.state_dict())
    state = WeightedAllReduceState(weight=1.0)
    model.register_comm_hook(state, weighted_allreduce_hook)
    inputs = torch.randn(11, 3)
    whole(inputs).pow(2).mean().backward()
    sizes = micro_batch_sizes(11, 4)  # 4 / 4 / 3: the rescaling between unequal micro-batches
    for piece in accumulate(model, state, split_batch(inputs, sizes), sizes):
        model(piece).pow(2).mean().backward()
    assert state.backward_passes == 1 and state.grad_scale == 1.0
    for got, want in zip(model.module.parameters(), whole.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-6, atol=1e-7)
