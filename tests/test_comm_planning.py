"""Communication in every plan: ``c(G)`` learned from the step records, and the optimal
policy's choice of the ranks in (planning/comm.py, policies.py, balancer.py).

- c of a group is the median of its steps' least wait of the ranks in; a group of one
  rank costs nothing; an unmeasured group is scaled from the nearest measured size;
- the balancer learns c from complete, whole-plan steps only (never a short last window),
  and out ranks' probe rows keep their curves fresh without counting in the step;
- the optimal policy leaves slow ranks out when their all-reduce costs more than they add,
  says so with both predictions, keeps rank 0 in, and brings them back once they are fast.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetero_ray.planning.balancer import Balancer
from hetero_ray.planning.comm import CommEstimates
from hetero_ray.planning.estimates import RankEstimate, Estimates
from hetero_ray.planning.plan import Plan
from hetero_ray.planning.policies import DynamicPolicy, OptimalPolicy, PolicyConfig


def test_a_groups_cost_is_the_median_of_its_steps_and_one_rank_costs_nothing():
    comm = CommEstimates()
    assert comm.cost_s((0, 1, 2)) == 0.0  # nothing measured: compute only
    for t in (2e-3, 2.2e-3, 50e-3, 1.8e-3):  # one spike
        comm.add((2, 0, 1), t)
    assert comm.cost_s((0, 1, 2)) == pytest.approx(2.1e-3)
    assert comm.cost_s((0,)) == 0.0
    comm.add((0, 1), math.nan)  # a record without the hook's timing teaches nothing
    assert (0, 1) not in comm.measured()


def test_an_unmeasured_group_is_scaled_from_the_nearest_measured_size_by_ring_hops():
    comm = CommEstimates()
    for _ in range(3):
        comm.add((0, 1, 2, 3), 3e-3)
    assert comm.cost_s((0, 1)) == pytest.approx(1e-3)  # (2 − 1)/(4 − 1)
    assert comm.cost_s((0, 2, 3)) == pytest.approx(2e-3)
    for _ in range(3):
        comm.add((0, 1), 0.5e-3)  # measured once formed: the measurement wins
    assert comm.cost_s((0, 1)) == pytest.approx(0.5e-3)
    assert comm.cost_s((0, 1, 2)) == pytest.approx(2e-3)  # sizes 2 and 4 equally near: the larger, 3 ms · 2/3
    restored = CommEstimates()
    restored.load_state_dict(comm.state_dict())
    assert restored.measured() == comm.measured()


def _estimates(betas, sizes, alphas=None, fresh=None, step=100):
    n = len(betas)
    alphas = alphas or [0.0] * n
    fresh = fresh or [True] * n
    rows = [RankEstimate(rank=r, alpha_s=alphas[r], beta_s_per_sample=betas[r],
                         samples_per_s=1.0 / betas[r], num_points=20, last_step=step, fresh=fresh[r],
                         local_batch_size=sizes[r], busy_time_s=alphas[r] + betas[r] * sizes[r],
                         busy_time_rel_se=0.01, num_batch_sizes=1) for r in range(n)]
    return Estimates.from_rank_estimates(rows, global_step=step)


def test_optimal_leaves_slow_ranks_out_when_their_allreduce_costs_more_than_they_add():
    # speeds 1, 0.05, 0.05 (β 20× larger), B = 256: all in saves 9 % of compute, the all-reduce costs 5 ms
    betas = [1e-4, 2e-3, 2e-3]
    plan = Plan(4, (232, 12, 12))
    comm = lambda g: 0.0 if len(g) == 1 else 5e-3  # noqa: E731
    policy = OptimalPolicy()
    first = policy.decide(plan, _estimates(betas, [232, 12, 12]), 100, comm)  # 12 % gain: below twice the bar
    assert not first.adopt and "confirms" in first.reason and first.proposed_local_batch_sizes == (256, 0, 0)
    decision = policy.decide(plan, _estimates(betas, [232, 12, 12]), 110, comm)
    assert decision.adopt and decision.plan.local_batch_sizes == (256, 0, 0)
    assert decision.left_out == (1, 2)
    assert decision.predicted_step_time_s == pytest.approx(256e-4)
    # every rank in: 256/(1e4 + 2·500) samples/s of compute, 23.3 ms, and 5 ms of all-reduce
    assert decision.all_ranks_step_time_s == pytest.approx(256 / 11000 + 5e-3, rel=0.01)
    assert "ranks 1, 2 left out" in decision.reason and "with every rank in" in decision.reason
    # their probes fit in half the predicted 25.6 ms step: 6 samples of 2 ms (planning/probes.py)
    assert decision.plan.probe_sizes == (0, 6, 6) and "probes of 6/6 samples while out" in decision.reason
    record = decision.to_record()
    assert record["left_out_ranks"] == [1, 2] and record["all_ranks_predicted_step_time_s"] == pytest.approx(decision.all_ranks_step_time_s)
    # the same ranks, all-reduce for free: every rank trains
    free = OptimalPolicy().decide(plan, _estimates(betas, [232, 12, 12]), 100, lambda g: 0.0)
    assert not free.left_out and min(free.proposed_local_batch_sizes) > 0


def test_rank_0_stays_in_even_when_it_is_the_slow_one():
    betas = [2e-3, 1e-4, 1e-4]
    comm = lambda g: 0.0 if len(g) == 1 else 5e-3  # noqa: E731
    decision = OptimalPolicy().decide(Plan(0, (10, 123, 123)), _estimates(betas, [10, 123, 123]), 100, comm)
    assert decision.plan.local_batch_sizes[0] > 0


def test_ranks_left_out_are_brought_back_once_they_are_fast():
    comm = lambda g: 0.0 if len(g) == 1 else 1e-3  # noqa: E731
    out = Plan(5, (256, 0, 0))
    # the probes say the ranks left out now run at rank 0's speed
    decision = OptimalPolicy().decide(out, _estimates([1e-4, 1e-4, 1e-4], [256, 16, 16]), 200, comm)
    assert decision.adopt and min(decision.plan.local_batch_sizes) > 0
    assert "ranks 1, 2 brought back" in decision.reason
    assert decision.current_predicted_step_time_s == pytest.approx(256e-4)  # c of rank 0 alone: 0
    # stale ranks left out stay out; the fresh ones are planned around them
    stale = _estimates([1e-4, 1e-4, 1e-4], [256, 16, 16], fresh=[True, True, False])
    decision = OptimalPolicy().decide(out, stale, 200, comm)
    assert decision.plan.local_batch_sizes[2] == 0 and decision.plan.local_batch_sizes[1] > 0
    dynamic = DynamicPolicy().decide(out, stale, 200, comm)
    assert dynamic.proposed_local_batch_sizes[2] == 0 and dynamic.proposed_local_batch_sizes[1] > 0


def _rows(step, sizes, busy, wait, probe=0):
    return [{"rank": r, "global_step": step, "local_batch_size": b, "busy_time_s": t, "wait_time_s": w,
             "probe_batch_size": 0 if b else probe, "plan_version": 0, "attempt": 0, "step_time_s": t + w}
            for r, (b, t, w) in enumerate(zip(sizes, busy, wait))]


def test_the_balancer_learns_c_from_whole_steps_and_leaves_the_slow_ranks_out():
    balancer = Balancer(OptimalPolicy(PolicyConfig(noise_margin=0.0)), rebalance_interval=10, global_batch_size=256)
    balancer.begin_attempt(0, 3, 0)
    new_plans = []
    rng = np.random.default_rng(0)
    for step in range(40):
        noise = 1 + 0.01 * rng.standard_normal(3)
        # rank 0: 0.1 ms/sample; ranks 1, 2: 2 ms/sample; all-reduce 6 ms: the least wait (rank 0 is slowest here)
        sizes = (232, 12, 12) if not new_plans else new_plans[-1].local_batch_sizes
        busy = [1e-4 * sizes[0] * noise[0], 2e-3 * max(sizes[1], 12) * noise[1], 2e-3 * max(sizes[2], 12) * noise[2]]
        slowest = max(b for b, s in zip(busy, sizes) if s > 0)
        wait = [slowest - b + 6e-3 if s > 0 else 0.0 for b, s in zip(busy, sizes)]
        out = balancer.add_steps(_rows(step, sizes, busy, wait, probe=12), now=float(step))
        new_plans += out.new_plans
    assert balancer.comm.cost_s((0, 1, 2)) == pytest.approx(6e-3, rel=0.05)
    assert new_plans and new_plans[0].local_batch_sizes == (256, 0, 0)
    assert new_plans[0].row["left_out_ranks"] == [1, 2]
    # the planner numbers the shares with the probes that fit beside rank 0's 25.6 ms step
    assert new_plans[0].numbered(7).probe_sizes == (0, 6, 6)
    # the probe rows kept ranks 1 and 2 fresh, at their probe size
    est = balancer.estimates.estimates()
    assert est.fresh.all() and est.local_batch_size.tolist()[1:] == [12, 12]


def test_a_short_last_window_teaches_no_group_cost():
    balancer = Balancer(OptimalPolicy(), rebalance_interval=10, global_batch_size=256)
    balancer.begin_attempt(0, 3, 0)
    for step in range(5):
        balancer.add_steps(_rows(step, (20, 0, 0), [1e-3] * 3, [1e-3] * 3), now=float(step))
    assert balancer.comm.measured() == {}


def test_a_rank_is_left_out_only_when_that_alone_clears_the_required_gain():
    # A bad split (the slow ranks hold 28 each) pays to change anyway; leaving them out would
    # gain 1.5 % over the best split with every rank in (25.6 ms against 26.0 ms), inside the bar.
    betas = [1e-4, 2e-3, 2e-3]
    comm = lambda g: 0.0 if len(g) == 1 else 2.6e-3  # noqa: E731
    decision = OptimalPolicy().decide(Plan(3, (200, 28, 28)), _estimates(betas, [200, 28, 28]), 100, comm)
    assert decision.adopt and min(decision.plan.local_batch_sizes) > 0 and decision.left_out == ()
    assert "ranks 1, 2 kept in: leaving them out would gain +1.5% (26.00 → 25.60 ms)" in decision.reason
    assert decision.predicted_step_time_s == pytest.approx(decision.all_ranks_step_time_s, rel=0.02)
    # the same ranks with a 5 ms all-reduce: leaving them out gains 9.5 % on its own, and does
    costly = lambda g: 0.0 if len(g) == 1 else 5e-3  # noqa: E731
    decision = OptimalPolicy().decide(Plan(3, (200, 28, 28)), _estimates(betas, [200, 28, 28]), 100, costly)
    assert decision.adopt and decision.plan.local_batch_sizes == (256, 0, 0)
