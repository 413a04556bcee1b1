"""Rebalance policies driven by a simulated cluster (no Ray), from 2 to 1,024 ranks.

The simulated ranks follow ``t_i(b) = α_i + β_i·b`` with noise; "excess" is how much
slower (noiseless) a step's plan is than the best split for the true speeds.
"""

import json
import math

import numpy as np
import pytest

from hetero_ray.planning import (
    ClusterEstimates,
    Decision,
    DynamicPolicy,
    OptimalPolicy,
    PolicyConfig,
    ProportionalPolicy,
    SimulatedCluster,
    StaticPolicy,
    fit_curve,
    make_policy,
    policy_names,
    run_policy,
    solve_split,
)
from hetero_ray.errors import ConfigError
from hetero_ray.planning.capacity import RankCapacity
from hetero_ray.runs.records import DECISIONS, SCHEMAS, to_table
from tests.helpers import estimates_for
from hetero_ray.planning.plan import Plan

SAMPLES_PER_RANK = 32  # B = 32·n


def heterogeneous(n, seed):
    """Three device classes (1×, ½×, ¼× speed); the fixed cost is 10-50 % of a step."""
    rng = np.random.default_rng(seed)
    speed = rng.choice([1.0, 0.5, 0.25], n) if n > 2 else np.array([1.0, 0.4])
    return rng.uniform(0.005, 0.02, n) / speed, rng.uniform(0.8e-3, 1.2e-3, n) / speed


def check_plans(result, global_batch_size, caps=None, min_size=1):
    for plan in result.plans:
        sizes = plan.local_batch_sizes
        assert sum(sizes) == global_batch_size
        assert min(sizes) >= min_size
        if caps is not None:
            assert all(c is None or b <= c for b, c in zip(sizes, caps))
    versions = [p.version for p in result.plans]
    assert versions == sorted(versions)


# ---------------------------------------------------------------- optimal
@pytest.mark.parametrize("n, seeds", [(2, range(4)), (8, range(4)), (64, range(3)), (1024, range(1))])
def test_optimal_converges_to_near_the_ideal_step_time(n, seeds):
    for seed in seeds:
        a, b = heterogeneous(n, seed)
        total = SAMPLES_PER_RANK * n
        result = run_policy(make_policy("optimal"), SimulatedCluster(a, b, noise=0.05, seed=seed),
                            steps=160, global_batch_size=total)
        check_plans(result, total)
        excess = result.relative_excess()
        assert excess[0] > 0.3  # equal shares are far off on this cluster
        assert excess[60:].max() < 0.05, (seed, excess[[20, 40, 60, -1]])
        assert len(result.adopted) <= 3  # a few decisive moves, not a crawl
        assert all(d.global_step <= 60 for d in result.adopted)


@pytest.mark.parametrize("n", [2, 16, 256, 1024])
@pytest.mark.parametrize("noise", [0.05, 0.2])
def test_no_oscillation_on_a_homogeneous_noisy_cluster(n, noise):
    total = SAMPLES_PER_RANK * n
    for name in ("optimal", "dynamic"):
        result = run_policy(make_policy(name), SimulatedCluster(np.full(n, 0.01), np.full(n, 1e-3), noise=noise, seed=n),
                            steps=300, global_batch_size=total)
        check_plans(result, total)
        assert len(result.adopted) <= 1, [d.reason for d in result.adopted]
        assert all(not math.isnan(d.predicted_gain) for d in result.decisions)


# Within the bar a proposal must clear: threshold 5 % + noise margin (≈ 4.5 % at 1,024 ranks
# with 5 % noise, where the largest of 1,024 noisy medians alone fakes a gain that large).
@pytest.mark.parametrize("n, tolerance", [(2, 0.06), (8, 0.06), (64, 0.06), (1024, 0.12)])
def test_recovery_within_two_rebalance_intervals_after_a_rank_slows_down(n, tolerance):
    interval, change_step, slow = 20, 150, n // 2
    a, b = heterogeneous(n, 7)
    total = SAMPLES_PER_RANK * n
    cluster = SimulatedCluster(a, b, noise=0.05, seed=2, speed_changes=[(change_step, slow, 0.5)])
    result = run_policy(make_policy("optimal"), cluster, steps=260, global_batch_size=total,
                        rebalance_interval=interval)
    check_plans(result, total)
    excess = result.relative_excess()
    assert excess[change_step - 1] < 0.05
    before = result.plan_at(change_step - 1).local_batch_sizes[slow]
    recovered = change_step + 2 * interval
    assert excess[change_step] > 0.4  # the slowed rank holds everyone up
    assert excess[recovered:].max() < tolerance, excess[[change_step, change_step + interval, recovered]]
    assert result.plan_at(recovered).local_batch_sizes[slow] < before
    late = [d for d in result.adopted if d.global_step > recovered]
    assert len(late) <= 1  # settled, not oscillating


def test_a_very_slow_rank_drops_to_the_minimum_never_below():
    n = 16
    a, b = heterogeneous(n, 3)
    total = SAMPLES_PER_RANK * n
    for min_size in (1, 3):
        cluster = SimulatedCluster(a, b, noise=0.05, seed=1, speed_changes=[(50, 5, 0.01)])
        policy = make_policy("optimal", PolicyConfig(min_local_batch_size=min_size))
        result = run_policy(policy, cluster, steps=160, global_batch_size=total)
        check_plans(result, total, min_size=min_size)
        assert result.final_plan.local_batch_sizes[5] == min_size
        assert result.relative_excess()[100:].max() < 0.05


def test_caps_are_respected_and_the_overflow_goes_elsewhere():
    n = 8
    a, b = heterogeneous(n, 1)
    fastest = int(np.argmin(b))
    caps = [None] * n
    caps[fastest] = 20
    total = SAMPLES_PER_RANK * n
    for name in ("optimal", "dynamic"):
        policy = make_policy(name, caps=caps)
        result = run_policy(policy, SimulatedCluster(a, b, noise=0.05, seed=0), steps=120, global_batch_size=total)
        check_plans(result, total, caps=caps)
        assert result.final_plan.local_batch_sizes[fastest] == 20


def test_stale_ranks_keep_their_share_while_the_rest_is_balanced():
    n, silent = 8, 2
    a, b = heterogeneous(n, 4)
    total = SAMPLES_PER_RANK * n
    cluster = SimulatedCluster(a, b, noise=0.05, seed=3, silent_ranks=[(70, silent)],
                               speed_changes=[(150, 6, 0.5)])
    estimates = ClusterEstimates(n, stale_after_steps=20)
    result = run_policy(make_policy("optimal"), cluster, steps=240, global_batch_size=total, estimates=estimates)
    check_plans(result, total)
    became_stale = 70 + 20 + 1
    kept = result.plan_at(became_stale).local_batch_sizes[silent]
    assert all(p.local_batch_sizes[silent] == kept for p in result.plans[became_stale:])
    late = [d for d in result.adopted if d.global_step > 150]
    assert late, "the speed change of rank 6 must still be balanced around the stale rank"
    assert all(f"ranks {silent} stale" in d.reason for d in late)
    assert result.plan_at(239).local_batch_sizes[6] < result.plan_at(149).local_batch_sizes[6]


def test_no_fresh_estimates_keep_the_plan():
    policy = OptimalPolicy()
    plan = policy.initial_plan(64, 4)
    decision = policy.decide(plan, ClusterEstimates(4).estimates(20), global_step=20)
    assert not decision.adopt and decision.plan is plan and "no fresh estimate" in decision.reason
    decision = policy.decide(plan, ClusterEstimates(3).estimates(20), global_step=20)
    assert not decision.adopt and "3 ranks but the plan has 4" in decision.reason


# ---------------------------------------------------------------- thresholds and cooldown
def test_threshold_rejects_small_gains_and_records_why():
    plan = Plan(3, (32, 32))
    est = estimates_for([0.0, 0.0], [1e-3, 1.1e-3], [32, 32])  # ~5 % apart
    for threshold, adopt in ((0.10, False), (0.01, True)):
        policy = OptimalPolicy(PolicyConfig(rebalance_threshold=threshold))
        d = policy.decide(plan, est, global_step=100)
        assert d.adopt is adopt
        assert 0 < d.predicted_gain < 0.05
        assert d.current_predicted_step_time_s == pytest.approx(32 * 1.1e-3)
        assert d.proposed_local_batch_sizes == (34, 30)
        assert ("keep: predicted step time" in d.reason) is not adopt
        if adopt:
            assert d.plan.version == 4 and d.plan.local_batch_sizes == (34, 30) and d.plan.reason == d.reason


def test_caps_that_cannot_hold_the_batch_keep_the_plan_and_say_so():
    policy = OptimalPolicy(caps=[30, 30])
    d = policy.decide(Plan(3, (32, 32)), estimates_for([0.0, 0.0], [1e-3, 2e-3], [32, 32]), global_step=100)
    assert not d.adopt and d.plan.local_batch_sizes == (32, 32)
    assert d.reason.startswith("no feasible split within the caps (") and "stale" not in d.reason, d.reason


def test_noise_margin_raises_the_bar_with_noisy_estimates():
    """One rank 10 % slower than 63 others: beyond noise when the medians are exact, within
    it when their standard error is 4 % (the largest of 64 such medians is that far up)."""
    plan = Plan(0, (32,) * 64)
    betas = [1e-3] * 63 + [1.10e-3]
    at_once = PolicyConfig(confirm_below=1.0)  # the bar alone (confirmation: its own test)
    quiet = OptimalPolicy(at_once).decide(plan, estimates_for([0] * 64, betas, [32] * 64, rel_se=0.001), 100)
    noisy = OptimalPolicy(at_once).decide(plan, estimates_for([0] * 64, betas, [32] * 64, rel_se=0.04), 100)
    assert quiet.adopt and not noisy.adopt
    assert noisy.required_gain == pytest.approx(0.05 + 0.04 * math.sqrt(2 * math.log(64)))


def test_a_rank_clearly_slower_than_the_rest_is_not_held_back_by_the_noise_margin():
    """The margin is the bias of the largest of several noisy medians of equal times; a rank
    15 % slower than the rest, five standard errors of the difference, is the largest by
    itself, not by selection: the bar is the threshold alone (a cold start's first move
    that fell short leaves such a step)."""
    plan = Plan(0, (32,) * 64)
    for slowest, contenders, adopt in ((1.15e-3, 1, True), (1.05e-3, 64, False)):
        betas = [1e-3] * 63 + [slowest]
        decision = OptimalPolicy().decide(plan, estimates_for([0] * 64, betas, [32] * 64, rel_se=0.02), 100)
        margin = 0.02 * math.sqrt(2 * math.log(contenders)) if contenders > 1 else 0.0
        assert decision.required_gain == pytest.approx(0.05 + margin), slowest
        assert decision.adopt is adopt, decision.reason  # 5 % slower: within what noise fakes, kept


def test_cooldown_blocks_adoptions_for_the_configured_steps():
    n = 8
    a, b = heterogeneous(n, 5)
    cluster = SimulatedCluster(a, b, noise=0.05, seed=5, speed_changes=[(45, 1, 0.5), (85, 2, 0.5)])
    policy = make_policy("optimal", PolicyConfig(rebalance_cooldown=100))
    result = run_policy(policy, cluster, steps=200, global_batch_size=32 * n)
    steps = [d.global_step for d in result.adopted]
    assert steps and all(later - earlier >= 100 for earlier, later in zip(steps, steps[1:]))
    assert any(d.reason.startswith("cooldown:") for d in result.decisions)


def test_stale_rank_is_pinned_in_the_proposal():
    plan = Plan(0, (40, 40, 40))
    est = estimates_for([0, 0, 0], [1e-3, 2e-3, 1e-2], [40, 40, 40], fresh=[True, True, False])
    d = OptimalPolicy().decide(plan, est, 100)
    assert d.adopt and d.plan.local_batch_sizes[2] == 40 and sum(d.plan.local_batch_sizes) == 120
    assert "ranks 2 stale" in d.reason


def test_decisions_never_propose_less_than_one_sample_over_random_estimates():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        total = int(rng.integers(n, 40 * n))
        plan = Plan(0, tuple(solve_split(np.zeros(n), np.ones(n), total)))
        alphas = rng.uniform(0, 0.1, n)
        betas = rng.uniform(1e-4, 1e-1, n) * rng.choice([1, 1000], n)
        est = estimates_for(alphas, betas, list(plan.local_batch_sizes), fresh=list(rng.random(n) < 0.8))
        for name in ("optimal", "dynamic"):
            d = make_policy(name, PolicyConfig(rebalance_threshold=0.0)).decide(plan, est, 100)
            sizes = d.proposed_local_batch_sizes or plan.local_batch_sizes
            assert sum(sizes) == total and min(sizes) >= 1
            assert sum(d.plan.local_batch_sizes) == total


# ---------------------------------------------------------------- fixed policies
def test_static_never_changes():
    n = 8
    a, b = heterogeneous(n, 0)
    result = run_policy(StaticPolicy(), SimulatedCluster(a, b, noise=0.05, speed_changes=[(50, 0, 0.1)]),
                        steps=120, global_batch_size=100)
    assert {p.local_batch_sizes for p in result.plans} == {(13, 13, 13, 13, 12, 12, 12, 12)}
    assert not result.adopted and len(result.decisions) == 5
    assert all(d.policy == "static" for d in result.decisions)


def test_proportional_follows_the_profiled_throughput_and_never_changes_after_start():
    speeds = [4.0, 2.0, 1.0, 1.0]
    a, b = np.zeros(4), 1e-3 / np.array(speeds)
    capacities = [RankCapacity(0.0, beta) for beta in b]
    policy = ProportionalPolicy()
    result = run_policy(policy, SimulatedCluster(a, b, noise=0.05, speed_changes=[(30, 0, 0.2)]),
                        steps=120, global_batch_size=80, capacities=capacities)
    assert {p.local_batch_sizes for p in result.plans} == {(40, 20, 10, 10)}
    assert not result.adopted
    with pytest.raises(ConfigError, match="4 capacities but there are 3 ranks"):
        policy.initial_plan(80, 3, capacities)
    assert ProportionalPolicy().initial_plan(80, 4).local_batch_sizes == (20, 20, 20, 20)  # not profiled


def test_profiled_throughput_is_taken_at_the_mean_local_batch():
    """``b̄ / t_i(b̄)`` at ``b̄ = B/n``: a fixed cost weighs less at a larger batch."""
    capacities = [RankCapacity(0.01, 0.001, 500), RankCapacity(0.01, 0.003, None)]
    sizes = ProportionalPolicy().initial_plan(64, 2, capacities).local_batch_sizes
    throughputs = [32 / (0.01 + 0.032), 32 / (0.01 + 0.096)]
    assert sizes == tuple(solve_split([0, 0], [1 / t for t in throughputs], 64))


def test_dynamic_shares_follow_measured_throughput():
    n = 8
    a, b = np.zeros(n), 1e-3 * np.array([1, 1, 2, 2, 4, 4, 1, 1.0])  # α = 0: proportional is optimal
    result = run_policy(DynamicPolicy(), SimulatedCluster(a, b, noise=0.05, seed=1, speed_changes=[(100, 0, 0.5)]),
                        steps=200, global_batch_size=256)
    check_plans(result, 256)
    excess = result.relative_excess()
    assert excess[40:100].max() < 0.05 and excess[140:].max() < 0.05
    assert result.plan_at(199).local_batch_sizes[0] < result.plan_at(99).local_batch_sizes[0]


def test_optimal_first_plan_from_profiled_fits():
    alphas, betas = [0.01, 0.05], [1e-3, 1e-3]
    fits = [fit_curve([8, 16, 32], [a + b * s for s in (8, 16, 32)]) for a, b in zip(alphas, betas)]
    plan = OptimalPolicy().initial_plan(64, 2, [RankCapacity(f.alpha_s, f.beta_s_per_sample) for f in fits])
    assert plan.local_batch_sizes == tuple(solve_split(alphas, betas, 64)) == (52, 12)
    assert plan.reason == "optimal: split for the profiled cost model"
    by_speed = DynamicPolicy().initial_plan(64, 2, [RankCapacity(0.0, 1 / 3), RankCapacity(0.0, 1.0)])
    assert by_speed.local_batch_sizes == (48, 16) and by_speed.reason == "dynamic: shares by profiled capability"
    assert OptimalPolicy().initial_plan(10, 4).local_batch_sizes == (3, 3, 2, 2)


# ---------------------------------------------------------------- configuration and records
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rebalance_threshold": -0.1}, r"--rebalance-threshold must be in \[0, 1\)"),
        ({"rebalance_threshold": 1.0}, r"--rebalance-threshold must be in \[0, 1\)"),
        ({"rebalance_threshold": "5%"}, r"--rebalance-threshold must be in \[0, 1\)"),
        ({"rebalance_cooldown": -1}, "--rebalance-cooldown must be a non-negative integer"),
        ({"rebalance_cooldown": 2.5}, "--rebalance-cooldown must be a non-negative integer"),
        ({"min_local_batch_size": 0}, "min_local_batch_size must be a positive integer"),
        ({"noise_margin": -1}, "noise_margin must be a finite number ≥ 0"),
        ({"noise_margin": math.inf}, "noise_margin must be a finite number ≥ 0"),
    ],
)
def test_policy_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        PolicyConfig(**kwargs)


def test_make_policy():
    assert isinstance(make_policy(), OptimalPolicy)
    assert policy_names() == ("static", "proportional", "dynamic", "optimal")  # the built-in ones, in order
    assert [make_policy(name).name for name in policy_names()] == list(policy_names())
    with pytest.raises(ConfigError, match="policy must be one of static, proportional, dynamic, optimal"):
        make_policy("fastest")
    with pytest.raises(ConfigError, match="cannot give 4 ranks"):
        make_policy("optimal").initial_plan(3, 4)


def test_decision_record_fits_the_decisions_table():
    plan = Plan(0, (32, 32))
    est = estimates_for([0.0, 0.0], [1e-3, 2e-3], [32, 32])
    adopted = OptimalPolicy().decide(plan, est, global_step=100)
    kept = StaticPolicy().decide(plan, est, global_step=100)
    assert isinstance(adopted, Decision) and adopted.adopt and not kept.adopt
    # the balancer adds the outcome, the clock and the rest of the step; a feeding trial's rows, its rates
    expected = set(SCHEMAS[DECISIONS].names) - {"achieved_step_time_s", "wall_time", "rest_of_step_s",
                                                "feeding_ranks", "samples_per_s_training", "samples_per_s_feeding"}
    for d in (adopted, kept):
        record = d.to_record()
        assert set(record) == expected
        to_table(DECISIONS, [record])  # types match the Parquet schema
    record = adopted.to_record()
    assert record["adopted"] and record["plan_version"] == 1 and record["local_batch_sizes"] == [43, 21]
    assert record["predicted_gain"] == pytest.approx(1 - 43e-3 / 64e-3)
    assert kept.to_record()["predicted_gain"] is None


def test_policy_state_round_trip():
    policy = OptimalPolicy(PolicyConfig(rebalance_cooldown=50))
    plan = Plan(0, (32, 32))
    assert policy.decide(plan, estimates_for([0, 0], [1e-3, 2e-3], [32, 32]), 100).adopt
    restored = OptimalPolicy(PolicyConfig(rebalance_cooldown=50))
    restored.load_state_dict(policy.state_dict())
    d = restored.decide(plan, estimates_for([0, 0], [1e-3, 2e-3], [32, 32]), 120)
    assert not d.adopt and d.reason.startswith("cooldown: 20 of 50 steps")


def test_a_cold_start_whose_first_move_falls_short_keeps_moving():
    """From equal shares the first move must assume α = 0, and the fast rank here has a large
    fixed cost: its share comes out too small, leaving the slow rank clearly the slowest.
    That imbalance is beyond noise, so the follow-up move is not blocked by a noise margin
    (over 20 seeds, the plans after step 60 are within 2.5 % of the ideal on average when
    every gain past the bar is adopted at once; with small gains confirmed by a second
    decision, within 3.5 %: the price of identical workers that stay put)."""
    for confirm_below, bound in ((1.0, 0.025), (PolicyConfig().confirm_below, 0.035)):
        excess = []
        for seed in range(20):
            cluster = SimulatedCluster(np.array([0.1, 0.0]), np.array([1e-3, 3e-3]), noise=0.1, seed=seed)
            result = run_policy(make_policy("optimal", PolicyConfig(confirm_below=confirm_below)), cluster,
                                steps=200, global_batch_size=256)
            check_plans(result, 256)
            excess.append(result.relative_excess()[60:].mean())
        assert np.mean(excess) < bound, (confirm_below, np.round(excess, 3))


def test_a_small_gain_is_adopted_only_when_the_next_decision_sees_it_again():
    """Two of five 200-step runs of identical workers moved once, early, on one window where
    a rank was briefly slow (8.3 % gain for 8.2 % required; 10.7 % for 5.0 %); the next
    decision saw 6.6 % and 5.0 %, below its bar. A gain under twice the bar waits for a
    second decision under the same plan; a large one, or one seen twice, is adopted."""
    plan = Plan(3, (48, 48, 48, 48))
    slow_once = estimates_for([0] * 4, [1e-3, 1e-3, 1e-3, 1.12e-3], [48] * 4, rel_se=0.001)
    passed = estimates_for([0] * 4, [1e-3, 1e-3, 1e-3, 1.02e-3], [48] * 4, rel_se=0.001)
    policy = OptimalPolicy()
    first = policy.decide(plan, slow_once, 20)
    assert not first.adopt and first.required_gain < first.predicted_gain < 2 * first.required_gain
    assert "until the next decision confirms it" in first.reason
    assert not policy.decide(plan, passed, 40).adopt  # gone: the lead is forgotten
    assert not policy.decide(plan, slow_once, 60).adopt  # seen once again: waits again
    assert policy.decide(plan, slow_once, 80).adopt  # twice in a row under the same plan
    # a large gain is adopted at once
    far = estimates_for([0] * 4, [1e-3, 1e-3, 1e-3, 2e-3], [48] * 4, rel_se=0.001)
    assert OptimalPolicy().decide(plan, far, 20).adopt
    # the lead survives a planner restart (the policy's state travels with the checkpoints)
    before = OptimalPolicy()
    assert not before.decide(plan, slow_once, 20).adopt
    restored = OptimalPolicy()
    restored.load_state_dict(json.loads(json.dumps(before.state_dict())))
    assert restored.decide(plan, slow_once, 40).adopt
