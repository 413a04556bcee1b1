"""A rank left out, the parts that need no process group: its BatchNorm, which ranks a plan
brings back, and the optimisers a rank brought back receives the state of."""

from __future__ import annotations

import torch
from torch import nn

from hetero_ray.planning.plan import Plan
from hetero_ray.training.batchnorm import convert_batchnorm
from hetero_ray.training.rejoin import OptimizerWatch, brings_back
from hetero_ray.training.weighting import WeightedAllReduceState


def test_a_rank_left_out_normalises_its_probe_with_its_running_statistics_and_changes_nothing():
    state = WeightedAllReduceState(num_workers=3)
    layer = convert_batchnorm(nn.BatchNorm1d(4), state)
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        layer.running_var.copy_(torch.tensor([4.0, 1.0, 1.0, 0.25]))
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    state.use_group(None, 1, takes_part=False)
    state.weight = 0.0
    x = torch.randn(1, 4)  # one sample: a BatchNorm in training would refuse it
    y = layer.train()(x)
    expected = (x - layer.running_mean) / torch.sqrt(layer.running_var + layer.eps)
    assert torch.allclose(y, expected, atol=1e-6)
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())  # no statistics, no count


def test_brings_back_names_the_ranks_a_plan_puts_back_in():
    assert brings_back(Plan(1, (30, 0, 0)), Plan(2, (10, 12, 8))) == (1, 2)
    assert brings_back(Plan(1, (20, 0, 10)), Plan(2, (30, 0, 0))) == ()  # leaving out needs nothing
    assert brings_back(None, Plan(0, (10, 10, 10))) == ()  # a group's first plan: every rank loaded the same state


def test_the_optimisers_that_step_the_model_are_found_once_in_stepping_order():
    model, other = nn.Linear(2, 2), nn.Linear(2, 2)
    watch = OptimizerWatch(model)
    try:
        first, second = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.Adam(model.parameters())
        unrelated = torch.optim.SGD(other.parameters(), lr=0.1)
        for _ in range(2):
            for optimizer in (second, unrelated, first):
                optimizer.step()
        assert watch.optimizers == [second, first]
    finally:
        watch.close()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert len(watch.optimizers) == 2  # closed: no longer watching
