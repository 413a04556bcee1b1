"""Leaving ranks out: minimise max_{i∈G} t_i(b_i) + c(G) over groups G and splits.

The exact optimum against brute force on small problems; over seeded random inputs the
result is never slower than all ranks nor than the fastest rank alone; the issue's case
(an H100 and three CPU ranks whose all-reduce costs more than they add) trains on the H100
alone.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hetero_ray.planning.solver import predicted_step_time_s, solve_split
from hetero_ray.planning.subset import EXHAUSTIVE_MAX_RANKS, solve_subset_split


def allreduce_cost(per_rank_s: float, base_s: float = 0.0):
    """A ring all-reduce: nothing for one rank, else grows with the group."""
    return lambda group: 0.0 if len(group) == 1 else base_s + per_rank_s * len(group)


def test_the_h100_alone_beats_it_with_three_cpu_ranks_whose_allreduce_costs_more():
    # simple_cnn, B = 512: the H100 alone 3.87 ms (132,263 samples/s); the all-reduce with
    # the CPU ranks added 2.6 ms
    alphas, betas, floors = [0.0, 0.0, 0.0, 0.0], [3.87e-3 / 512, 1e-3, 1e-3, 1e-3], [3.2e-3, 0, 0, 0]
    result = solve_subset_split(alphas, betas, 512, lambda g: 0.0 if g == {0} else 2.6e-3, floors=floors)
    assert result.group == (0,) and result.local_batch_sizes == (512, 0, 0, 0)
    assert result.left_out == (1, 2, 3)
    assert result.predicted_step_time_s == pytest.approx(3.87e-3)
    assert result.all_ranks_step_time_s > 1.5 * result.predicted_step_time_s
    # free communication: the CPU ranks help again
    free = solve_subset_split(alphas, betas, 512, lambda g: 0.0, floors=floors)
    assert free.group == (0, 1, 2, 3) and free.predicted_step_time_s < 3.87e-3


def test_without_communication_cost_comparable_ranks_all_train_with_the_plain_split():
    # within 2× of each other, each rank's one-sample step is below the common finishing time
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 6))
        a, b = np.zeros(n), rng.uniform(1e-4, 2e-4, n)
        total = int(rng.integers(4 * n, 200))
        result = solve_subset_split(a, b, total, lambda g: 0.0)
        assert result.group == tuple(range(n))
        assert list(result.local_batch_sizes) == solve_split(a, b, total)


def test_matches_brute_force_over_groups_and_splits():
    for seed in range(150):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 4))
        total = int(rng.integers(n, 10))
        a, b = rng.uniform(0, 0.5, n), rng.uniform(0.01, 1, n)
        floors = np.where(rng.random(n) < 0.4, rng.uniform(0.1, 2, n), 0.0)
        comm = {frozenset(g): float(rng.uniform(0, 1)) * (len(g) > 1)
                for k in range(1, n + 1) for g in itertools.combinations(range(n), k)}
        best = math.inf
        for sizes in itertools.product(range(total + 1), repeat=n):
            if sum(sizes) != total or not any(sizes):
                continue
            group = frozenset(i for i, s in enumerate(sizes) if s)
            best = min(best, predicted_step_time_s(a, b, sizes, floors) + comm[group])
        result = solve_subset_split(a, b, total, comm.__getitem__, floors=floors)
        assert result.exhaustive
        assert result.predicted_step_time_s == pytest.approx(best, rel=1e-12, abs=1e-15)
        assert predicted_step_time_s(a, b, result.local_batch_sizes, floors) + comm[frozenset(result.group)] == \
            pytest.approx(result.predicted_step_time_s)


@pytest.mark.parametrize("n", [3, EXHAUSTIVE_MAX_RANKS, EXHAUSTIVE_MAX_RANKS + 1, 24])
def test_never_slower_than_all_ranks_nor_the_fastest_alone(n):
    for seed in range(10):
        rng = np.random.default_rng(seed)
        a = rng.uniform(0, 0.01, n)
        b = rng.uniform(1e-5, 1e-2, n) * rng.choice([1.0, 30.0], n)
        floors = np.where(rng.random(n) < 0.3, rng.uniform(0.002, 0.02, n), 0.0)
        total = int(rng.integers(n, 64 * n))
        cost = allreduce_cost(rng.uniform(0, 2e-3), rng.uniform(0, 1e-3))
        caps = [int(c) if rng.random() < 0.3 else None for c in rng.integers(total // 2, total + 1, n)]
        result = solve_subset_split(a, b, total, cost, caps=caps, floors=floors)
        sizes = np.array(result.local_batch_sizes)
        assert sizes.sum() == total and result.exhaustive == (n <= EXHAUSTIVE_MAX_RANKS)
        assert all(s == 0 or s >= 1 for s in sizes) and set(np.flatnonzero(sizes)) == set(result.group)
        assert all(c is None or s <= c for s, c in zip(sizes, caps))
        assert result.predicted_step_time_s <= result.all_ranks_step_time_s + 1e-15
        for alone in range(n):  # no single rank that can hold B does better
            if caps[alone] is None:
                single = max(floors[alone], a[alone] + b[alone] * total) + cost(frozenset({alone}))
                if n <= EXHAUSTIVE_MAX_RANKS or alone == int(np.argmin(np.maximum(floors, a + b * total))):
                    assert result.predicted_step_time_s <= single + 1e-15


def test_ties_keep_the_larger_group():
    # two identical GPUs flat up to 512: either alone is as fast as both; both train
    result = solve_subset_split([0, 0], [0, 0], 256, lambda g: 0.0, floors=[0.007, 0.007])
    assert result.group == (0, 1) and result.local_batch_sizes == (128, 128)


def test_bad_communication_cost_or_no_feasible_group_raise():
    with pytest.raises(ValueError, match="communication cost for ranks \\[0, 1\\] must be a finite number ≥ 0"):
        solve_subset_split([0, 0], [1e-3, 1e-3], 8, lambda g: -1.0 if len(g) == 2 else 0.0)
    with pytest.raises(ValueError, match="no group of ranks can hold the global batch 100"):
        solve_subset_split([0, 0], [1e-3, 1e-3], 100, lambda g: 0.0, caps=[10, 20])
