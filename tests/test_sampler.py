"""Invariant 2 (exactly once): every sample index is consumed exactly once per epoch,
whatever the plans, their changes mid-epoch, the number of ranks, or the last window."""

import random
from collections import Counter

import pytest

from hetero_ray.planning.plan import Plan
from hetero_ray.planning.solver import proportional_split
from hetero_ray.sampler import GlobalSampler, Position


def random_plan(rng: random.Random, global_batch_size: int, num_workers: int, version: int) -> Plan:
    weights = [rng.random() + 0.01 for _ in range(num_workers)]
    return Plan(version, tuple(proportional_split(global_batch_size, weights)))


def run_epochs(sampler: GlobalSampler, rng: random.Random, epochs: int):
    """Simulates a run whose plan and world size change at random steps (incl. restarts)."""
    num_workers = rng.randint(1, min(6, sampler.global_batch_size))
    plan = random_plan(rng, sampler.global_batch_size, num_workers, 0)
    consumed = {e: Counter() for e in range(epochs)}
    steps_per_rank = {e: Counter() for e in range(epochs)}
    position = Position(0, 0, 0)
    while position.epoch < epochs:
        if rng.random() < 0.2:  # a mid-epoch plan change, sometimes with a new world size
            if rng.random() < 0.3:
                num_workers = rng.randint(1, min(6, sampler.global_batch_size))
            plan = random_plan(rng, sampler.global_batch_size, num_workers, plan.version + 1)
        for rank in range(plan.num_workers):
            indices = sampler.indices(position.epoch, position.step, plan, rank)
            consumed[position.epoch].update(indices.tolist())
            steps_per_rank[position.epoch][(plan.version, rank)] += 1
        position = sampler.next_position(position)
    return consumed, steps_per_rank


@pytest.mark.parametrize("seed", range(40))
def test_every_index_exactly_once_per_epoch(seed):
    rng = random.Random(seed)
    num_samples = rng.randint(1, 400)
    global_batch_size = rng.randint(1, min(num_samples, 64))
    drop_last = rng.random() < 0.3
    sampler = GlobalSampler(num_samples, global_batch_size, seed=seed, drop_last=drop_last)
    consumed, _ = run_epochs(sampler, rng, epochs=3)
    expected = sampler.samples_per_epoch
    for epoch, counts in consumed.items():
        assert sum(counts.values()) == expected
        assert all(c == 1 for c in counts.values()), f"epoch {epoch}: an index was consumed twice"
        if not drop_last:
            assert set(counts) == set(range(num_samples)), f"epoch {epoch}: an index was missed"


def test_every_rank_runs_every_step():
    # Equal step counts per rank: a rank's piece exists at every step, possibly empty in
    # the last short window, so every rank enters every collective.
    sampler = GlobalSampler(num_samples=103, global_batch_size=40, seed=0)
    plan = Plan(0, (30, 9, 1))
    assert sampler.steps_per_epoch == 3
    sizes = [[len(sampler.indices(0, s, plan, r)) for r in range(3)] for s in range(3)]
    assert sizes[0] == sizes[1] == [30, 9, 1]
    assert sum(sizes[2]) == 23 and sizes[2] == [17, 5, 1]


def test_permutation_is_identical_across_instances_and_differs_across_epochs():
    a = GlobalSampler(1000, 10, seed=7)
    b = GlobalSampler(1000, 10, seed=7)
    assert a.permutation(3).tolist() == b.permutation(3).tolist()
    assert a.permutation(3).tolist() != a.permutation(4).tolist()
    assert a.permutation(3).tolist() != GlobalSampler(1000, 10, seed=8).permutation(3).tolist()


def test_pieces_are_contiguous_in_rank_order():
    sampler = GlobalSampler(100, 10, seed=0)
    plan = Plan(0, (5, 3, 2))
    assert [sampler.piece(2, plan, r) for r in range(3)] == [(20, 25), (25, 28), (28, 30)]


def test_position_advances_across_epochs():
    sampler = GlobalSampler(25, 10, seed=0)
    p = Position(0, 2, 2)
    assert sampler.next_position(p) == Position(1, 0, 3)
    assert sampler.next_position(Position(0, 0, 0)) == Position(0, 1, 1)


def test_drop_last_drops_the_short_window():
    sampler = GlobalSampler(25, 10, seed=0, drop_last=True)
    assert sampler.steps_per_epoch == 2 and sampler.samples_per_epoch == 20


def test_rejects_plans_of_another_global_batch():
    sampler = GlobalSampler(100, 10, seed=0)
    with pytest.raises(ValueError, match="sums to 11"):
        sampler.piece(0, Plan(0, (6, 5)), 0)
