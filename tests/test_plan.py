"""Plans and integer splits: sums are exact and bounds hold, over many seeded inputs."""

import random

import pytest

from hetero_ray.planning.plan import Plan, equal_split, largest_remainder
from hetero_ray.planning.solver import proportional_split, solve_split


def test_plan_basics():
    plan = Plan(0, (40, 24))
    assert plan.global_batch_size == 64 and plan.num_workers == 2
    assert plan.shares() == [40 / 64, 24 / 64]
    assert plan.cut(64) == [40, 24]
    assert Plan.from_dict(plan.to_dict()) == plan
    assert plan.with_sizes([32, 32], "equal").version == 1


@pytest.mark.parametrize("sizes", [(), (0, 0), (-1, 5)])
def test_plan_rejects_empty_negative_or_all_out_sizes(sizes):
    with pytest.raises(ValueError):
        Plan(0, sizes)


def test_with_sizes_keeps_the_global_batch():
    with pytest.raises(ValueError, match="expected 64"):
        Plan(0, (40, 24)).with_sizes([40, 25], "bad")


def test_cut_of_a_short_window_is_proportional_and_exact():
    rng = random.Random(0)
    for _ in range(500):
        sizes = tuple(rng.randint(1, 50) for _ in range(rng.randint(1, 8)))
        plan = Plan(0, sizes)
        window = rng.randint(0, plan.global_batch_size)
        pieces = plan.cut(window)
        assert sum(pieces) == window
        assert all(p >= 0 for p in pieces)
        for p, b in zip(pieces, sizes):  # within one sample of the exact quota
            assert abs(p - window * b / plan.global_batch_size) < 1


def test_largest_remainder_and_equal_split():
    assert largest_remainder([1, 1, 1], 10) == [4, 3, 3]
    assert equal_split(10, 3) == [4, 3, 3]
    rng = random.Random(1)
    for _ in range(500):
        n = rng.randint(1, 16)
        total = rng.randint(n, 500)
        assert sum(equal_split(total, n)) == total
        weights = [rng.random() + 1e-3 for _ in range(n)]
        assert sum(largest_remainder(weights, total)) == total


def test_proportional_split_invariants():
    rng = random.Random(2)
    for _ in range(1000):
        n = rng.randint(1, 12)
        total = rng.randint(n * 2, 400)
        weights = [rng.choice([0.0, rng.random() * 10]) for _ in range(n)]
        caps = [rng.choice([None, rng.randint(2, total)]) for _ in range(n)]
        cap_values = [total if c is None else c for c in caps]
        if sum(cap_values) < total:
            with pytest.raises(ValueError, match="caps"):
                proportional_split(total, weights, min_size=2, caps=caps)
            continue
        sizes = proportional_split(total, weights, min_size=2, caps=caps)
        assert sum(sizes) == total
        assert all(2 <= s <= c for s, c in zip(sizes, cap_values))


def test_proportional_split_follows_speed():
    assert proportional_split(64, [1.0, 0.5]) == [43, 21]
    assert proportional_split(60, [1, 1, 0.5, 0.25]) == [22, 22, 11, 5]
    assert proportional_split(10, [0.0, 1.0, 0.0]) == [1, 8, 1]  # no throughput: the minimum
    assert proportional_split(10, [0.0, 1.0, 0.0], caps=[None, 4, None]) == [3, 4, 3]


def test_proportional_split_is_the_solver_at_zero_fixed_cost():
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 10)
        total = rng.randint(n, 300)
        weights = [rng.random() * 10 + 0.01 for _ in range(n)]
        assert proportional_split(total, weights) == solve_split([0.0] * n, [1 / w for w in weights], total)


def test_proportional_split_rejects_impossible_bounds():
    with pytest.raises(ValueError, match="minimum sizes sum to 4 > global batch 3"):
        proportional_split(3, [1, 1, 1, 1])
    with pytest.raises(ValueError, match="finite and ≥ 0"):
        proportional_split(3, [1, -1])


def test_a_plan_may_leave_ranks_out_and_names_them():
    plan = Plan(3, (0, 30, 0))
    assert plan.in_ranks == (1,) and plan.left_out == (0, 2) and plan.global_batch_size == 30
    assert plan.cut(10) == [0, 10, 0]  # a short last window gives a rank left out nothing either
