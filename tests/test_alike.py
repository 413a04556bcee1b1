"""Ranks that measure alike are split as one speed (planning/alike.py): identical devices
keep shares within one sample of each other, whatever noise their estimates carry."""

import numpy as np
import pytest

from hetero_ray.planning import SimulatedCluster, make_policy, run_policy, solve_split
from hetero_ray.planning.alike import alike_groups, pool_alike
from hetero_ray.planning.capacity import RankCapacity
from hetero_ray.planning.plan import Plan


def test_groups_form_from_the_fastest_rank_and_never_chain():
    # busy times at b̄ = 10: 10, 10.4, 10.9, 11.3 (each within 5 % of the one before), 20, 20.5
    betas = np.array([1.0, 1.04, 1.09, 1.13, 2.0, 2.05]) * 1e-3
    zeros = np.zeros(6)
    assert alike_groups(zeros, betas, zeros, 10, 0.05) == [[0, 1], [2, 3], [4, 5]]
    assert alike_groups(zeros, betas, zeros, 10, 0.15) == [[0, 1, 2, 3], [4, 5]]
    assert alike_groups(zeros, betas, zeros, 10, 0.05, usable=[True, False, True, True, True, True]) == \
        [[2, 3], [4, 5]]
    assert alike_groups(zeros, betas, zeros, 10, 0.0) == []
    # in their own noise: 5 % standard errors make 13 % one speed (2σ of the difference: 14 %), not 2×
    assert alike_groups(zeros, betas, zeros, 10, 0.0, rel_se=np.full(6, 0.05)) == [[0, 1, 2, 3], [4, 5]]
    assert alike_groups(zeros, betas, zeros, 10, 0.0, rel_se=[0.05, 0.05, np.nan, np.nan, 0.0, 0.0]) == [[0, 1]]


def test_alike_ranks_get_equal_shares_over_seeded_noise():
    """Over many seeded inputs: ranks of one true speed measured within the tolerance get
    shares within one sample; the sum and every bound hold; a group's spread is within it."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(2, 9))
        speed = rng.choice([1.0, 0.5, 0.25], n)
        tolerance = float(rng.uniform(0.03, 0.15))
        noise = rng.uniform(0, tolerance / 2.2, n)  # two estimates of one speed differ by < tolerance
        alphas = rng.uniform(0.0, 0.002) / speed  # one fixed cost per device class
        betas = 1e-3 / speed * (1 + noise)
        total = int(rng.integers(4 * n, 64 * n))
        a, b, f, groups = pool_alike(alphas, betas, np.zeros(n), total / n, tolerance)
        sizes = solve_split(a, b, total, 1, None, f)
        assert sum(sizes) == total and min(sizes) >= 1
        t = alphas + betas * total / n
        for group in groups:
            assert t[group].max() / t[group].min() - 1 <= tolerance + 1e-12
            assert max(sizes[r] for r in group) - min(sizes[r] for r in group) <= 1, (speed, sizes, groups)
        for s in set(speed.tolist()):
            same = [r for r in range(n) if speed[r] == s]
            assert max(sizes[r] for r in same) - min(sizes[r] for r in same) <= 1, (speed, sizes, groups)


@pytest.mark.parametrize("seed", range(4))
def test_identical_ranks_keep_equal_shares_through_every_decision(seed):
    """make demo's speeds (1, 1, 0.5, 0.25), noisy step records: every plan the optimal
    policy adopts gives the two identical ranks shares within one sample."""
    speed = np.array([1.0, 1.0, 0.5, 0.25])
    alphas, betas = 0.004 / speed, 1.2e-3 / speed
    result = run_policy(make_policy("optimal"), SimulatedCluster(alphas, betas, noise=0.1, seed=seed), steps=200,
                        global_batch_size=96)
    assert result.adopted, "equal shares on these speeds must move"
    for plan in result.plans:
        b = plan.local_batch_sizes
        assert abs(b[0] - b[1]) <= 1, (seed, b, plan.reason)


def test_a_decision_splits_identical_ranks_apart_by_noise_as_one_speed():
    """Two identical ranks whose estimates are 8 % apart (5 % standard error each), beside a
    half- and a quarter-speed rank, all on equal shares: the move the slow ranks call for
    keeps the identical ranks within one sample (without pooling: 33 and 30)."""
    from tests.helpers import estimates_for

    betas = [1.2e-3, 1.3e-3, 2.4e-3, 4.8e-3]
    d = make_policy("optimal").decide(Plan(0, (24,) * 4), estimates_for([0.0] * 4, betas, [24] * 4, rel_se=0.05),
                                      global_step=100)
    assert d.adopt, d.reason
    b = d.plan.local_batch_sizes
    assert abs(b[0] - b[1]) <= 1 and b[1] > b[2] > b[3], b
    assert "ranks 0, 1 alike" in d.reason
    # predictions keep each rank's own curve: the slower of the two sets the step
    assert d.predicted_step_time_s == pytest.approx(max(beta * s for beta, s in zip(betas, b)))


def test_the_first_plan_splits_ranks_measured_within_the_threshold_as_one():
    capacities = [RankCapacity(alpha_s=0.002, beta_s_per_sample=beta) for beta in (1.00e-3, 1.04e-3, 2e-3, 4e-3)]
    plan = make_policy("optimal").initial_plan(96, 4, capacities)
    assert abs(plan.local_batch_sizes[0] - plan.local_batch_sizes[1]) <= 1
    assert "ranks 0, 1 alike" in plan.reason


def test_the_first_plan_splits_identical_ranks_equally_through_a_warm_ups_noise():
    """make demo's warm-up (emulated speeds 1, 1, 0.5, 0.25) once measured its two speed-1
    ranks at 1.07 and 1.18 ms a sample, and the threshold alone split them 38/35: a first
    plan's lines differ that much for one device measured twice. Ranks whose first lines lie
    within FIRST_PLAN_ALIKE_SPREAD start as one speed; ranks a quarter apart do not."""
    from hetero_ray.planning.policies import FIRST_PLAN_ALIKE_SPREAD

    capacities = [RankCapacity(alpha_s=0.0013, beta_s_per_sample=beta) for beta in (1.07e-3, 1.18e-3, 2.33e-3, 4.89e-3)]
    plan = make_policy("optimal").initial_plan(96, 4, capacities)
    b = plan.local_batch_sizes
    assert abs(b[0] - b[1]) <= 1 and b[1] > b[2] > b[3], b
    assert "ranks 0, 1 alike (within 15%, a first plan's noise)" in plan.reason
    strict = make_policy("optimal")
    assert FIRST_PLAN_ALIKE_SPREAD > strict.config.rebalance_threshold
    apart = strict.initial_plan(96, 2, [RankCapacity(alpha_s=0.0013, beta_s_per_sample=beta) for beta in (1e-3, 1.25e-3)])
    assert apart.local_batch_sizes[0] - apart.local_batch_sizes[1] >= 8 and "alike" not in apart.reason, apart
