"""The balancer (pure class): decides on the plan in force, waits for adopted plans to take
effect, records achieved step times, and survives a checkpoint round trip."""

from __future__ import annotations

import pytest

from hetero_ray.planning.balancer import Balancer
from hetero_ray.planning.policies import PolicyConfig, make_policy
from hetero_ray.planning.simulation import SimulatedCluster


def step_rows(cluster: SimulatedCluster, step: int, sizes, version: int, attempt: int = 0) -> list[dict]:
    busy = cluster.busy_times_s(sizes, step)
    return [{"rank": r, "global_step": step, "local_batch_size": b, "busy_time_s": float(t),
             "plan_version": version, "attempt": attempt} for r, (b, t) in enumerate(zip(sizes, busy))]


def drive(balancer: Balancer, cluster: SimulatedCluster, steps: int, sizes, lag_steps: int = 0):
    """Feeds records like workers would, applying adopted plans ``lag_steps`` later."""
    version, pending, rows_out, plans = 0, [], [], []
    for step in range(steps):
        while pending and pending[0][0] <= step:
            _, plan = pending.pop(0)
            sizes, version = list(plan.local_batch_sizes), version + 1
        out = balancer.add_steps(step_rows(cluster, step, sizes, version))
        rows_out += out.decision_rows
        for plan in out.new_plans:
            plans.append((step, plan))
            pending.append((step + lag_steps, plan))
    return rows_out, plans, sizes


def new_balancer(policy="optimal", interval=10) -> Balancer:
    balancer = Balancer(make_policy(policy, PolicyConfig()), rebalance_interval=interval)
    balancer.begin_attempt(attempt=0, num_workers=4, start_global_step=0)
    return balancer


def cluster(seed=0) -> SimulatedCluster:
    return SimulatedCluster(alphas=[0.005] * 4, betas=[0.001, 0.001, 0.002, 0.004], noise=0.03, seed=seed)


def test_optimal_balances_and_records_every_decision():
    balancer = new_balancer()
    rows, plans, final = drive(balancer, cluster(), steps=200, sizes=[24, 24, 24, 24], lag_steps=3)
    assert plans, "an unbalanced cluster must get a new plan"
    assert sum(final) == 96 and final[3] < final[2] < final[0]
    assert all(r["global_step"] >= 9 for r in rows)  # the first decision is for point 10
    adopted = [r for r in rows if r["adopted"]]
    assert adopted and all(r["achieved_step_time_s"] is not None for r in adopted[:-1])
    first = adopted[0]
    assert first["achieved_step_time_s"] < first["current_predicted_step_time_s"]


def test_waits_until_the_adopted_plan_is_in_force():
    balancer = new_balancer(interval=5)
    _, plans, _ = drive(balancer, cluster(), steps=120, sizes=[24, 24, 24, 24], lag_steps=30)
    steps = [s for s, _ in plans]
    assert all(b - a >= 30 for a, b in zip(steps, steps[1:])), "decided on a plan not yet in force"


def test_static_never_changes_but_still_records():
    balancer = new_balancer("static")
    rows, plans, _ = drive(balancer, cluster(), steps=100, sizes=[24, 24, 24, 24])
    assert not plans and rows and not any(r["adopted"] for r in rows)


def test_rows_of_other_attempts_are_ignored():
    balancer = new_balancer()
    sim = cluster()
    for step in range(50):
        out = balancer.add_steps(step_rows(sim, step, [24, 24, 24, 24], 0, attempt=7))
        assert not out.decision_rows and not out.new_plans


def test_state_round_trip_keeps_the_estimates():
    balancer = new_balancer()
    drive(balancer, cluster(), steps=60, sizes=[40, 30, 16, 10])
    restored = new_balancer()
    restored.load_state_dict(balancer.state_dict())
    restored.begin_attempt(attempt=0, num_workers=4, start_global_step=60)
    a = balancer.estimates.estimates(59)
    b = restored.estimates.estimates(59)
    assert (abs(a.beta_s_per_sample - b.beta_s_per_sample) < 1e-12).all()


def test_a_short_last_window_is_not_mistaken_for_a_plan():
    balancer = new_balancer(interval=1)
    rows = [{"rank": r, "global_step": 10, "local_batch_size": b, "busy_time_s": 0.01,
             "plan_version": 0, "attempt": 0} for r, b in enumerate([3, 2, 0, 0])]
    out = balancer.add_steps(rows)
    assert not out.new_plans and not out.decision_rows


def test_decides_before_the_workers_reach_the_rebalance_point():
    # Steps of 0.1 s; records arrive once a second, 10 steps at a time. Deciding when the
    # records *reach* point 40 (at 5 s, when step 49 arrives) would leave the plan waiting
    # for point 60; the balancer must decide by the batch that arrives before 4 s.
    balancer = new_balancer("static", interval=20)
    sim, decided_at = cluster(), []
    for second in range(1, 13):
        rows = []
        for step in range(10 * (second - 1), 10 * second):
            for row in step_rows(sim, step, [24, 24, 24, 24], 0):
                rows.append({**row, "step_time_s": 0.1, "wall_time": 0.1 * (step + 1)})
        out = balancer.add_steps(rows, now=float(second))
        decided_at += [(second, r["global_step"]) for r in out.decision_rows]
    assert decided_at, "no decision was made"
    for second, step in decided_at[1:]:  # the first comes before the balancer knows the batch gap
        point = (step // 20 + 1) * 20
        assert second < 0.1 * point, f"decision at {second} s for point {point}, reached at {0.1 * point} s"
    assert [step for _, step in decided_at] == [19, 29, 49, 69, 89, 109]


def test_a_pause_without_steps_does_not_push_the_next_decisions_past_their_points():
    # As above, with a 20 s evaluation between steps 59 and 60, in which no step runs.
    # Counted in seconds, that gap between two batches made the lead 210 steps: no point
    # after it had a decision.
    balancer = new_balancer("static", interval=20)
    sim, decided_at, clock = cluster(), [], 0.0
    for batch in range(1, 13):
        if batch == 7:
            clock += 20.0  # the evaluation
        rows = []
        for step in range(10 * (batch - 1), 10 * batch):
            clock += 0.1
            for row in step_rows(sim, step, [24, 24, 24, 24], 0):
                rows.append({**row, "step_time_s": 0.1, "wall_time": clock})
        decided_at += [r["global_step"] for r in balancer.add_steps(rows, now=clock).decision_rows]
    assert decided_at == [19, 29, 49, 69, 89, 109], decided_at


def test_an_epochs_short_last_step_is_not_taken_for_the_plan():
    # 96 per step, but step 9 ends the epoch with 48: deciding on 24/12/8/4 would take it
    # for the plan (and propose one for the wrong global batch). The decision is made on
    # the newest full step before it.
    balancer = new_balancer("static", interval=10)
    sim = cluster()
    for step in range(9):
        balancer.add_steps(step_rows(sim, step, [24, 24, 24, 24], 0))
    rows = balancer.add_steps(step_rows(sim, 9, [24, 12, 8, 4], 0)).decision_rows
    assert [(r["global_step"], r["local_batch_sizes"]) for r in rows] == [(8, [24, 24, 24, 24])]


def test_records_sent_at_each_epochs_end_still_get_decisions():
    # Workers send their records when an epoch ends, so every batch ends on the epoch's
    # short step (13 steps of 96, the last 24). Waiting for a batch that ends on a full
    # step would never decide (the last CI run: no plan change in three epochs).
    balancer = new_balancer("optimal", interval=3)
    sim, plans = cluster(), []
    for epoch in range(3):
        rows = []
        for step in range(13 * epoch, 13 * epoch + 13):
            rows += step_rows(sim, step, [6, 6, 6, 6] if step % 13 == 12 else [24, 24, 24, 24], 0)
        plans += balancer.add_steps(rows).new_plans
    assert plans, "no plan change in three epochs"
    assert sum(plans[0].local_batch_sizes) == 96


def test_no_plan_is_proposed_for_a_point_the_run_never_reaches():
    # The run ends before step 50: the decision for point 40 is made, none for point 50
    # (it would be recorded as adopted and never run).
    balancer = Balancer(make_policy("optimal", PolicyConfig()), rebalance_interval=10)
    balancer.begin_attempt(attempt=0, num_workers=4, start_global_step=0, end_global_step=50)
    rows, plans, _ = drive(balancer, cluster(), steps=50, sizes=[24, 24, 24, 24], lag_steps=1)
    assert plans, "an unbalanced cluster must get a new plan"
    decided_at = [r["global_step"] for r in rows] + [step for step, _ in plans]
    assert max(decided_at) == 39, decided_at  # for point 40; point 50 would be decided at 49


def _burst_rows(step: int, sizes, version: int, beyond_s: float = 0.010) -> list[dict]:
    """Rank 0 takes 1 ms a sample up to 24 samples (a CPU quota's burst) and ``beyond_s``
    a sample beyond; the other ranks take 2 ms a sample. No noise."""
    def busy(rank: int, b: int) -> float:
        if rank == 0:
            return 0.001 * min(b, 24) + beyond_s * max(0, b - 24)
        return 0.002 * b
    return [{"rank": r, "global_step": step, "local_batch_size": b, "busy_time_s": busy(r, b),
             "plan_version": version, "attempt": 0} for r, b in enumerate(sizes)]


def _run_burst(beyond_s: float, steps: int = 80):
    balancer = new_balancer(interval=10)
    sizes, version, rows, history = [24, 24, 24, 24], 0, [], []
    for step in range(steps):
        out = balancer.add_steps(_burst_rows(step, sizes, version, beyond_s))
        rows += out.decision_rows
        for proposal in out.new_plans:  # in force from the next step, numbered as the planner does
            plan = proposal.numbered(version + 1)
            sizes, version = list(plan.local_batch_sizes), plan.version
            history.append((step + 1, tuple(sizes), plan.reason))
    return balancer, rows, history


def test_a_plan_that_makes_the_step_slower_is_rolled_back_within_one_interval():
    balancer, rows, history = _run_burst(beyond_s=0.010)
    first_move, rollback = history[0], history[1]
    assert first_move[1][0] > 24, "the line fitted at 24 samples must tempt the policy to give rank 0 more"
    assert rollback[2].startswith("rollback: plan v1 made the step slower"), rollback[2]
    assert rollback[1] == (24, 24, 24, 24)
    assert rollback[0] - first_move[0] <= balancer.rebalance_interval, "the worse plan ran more than one interval"
    assert any(r["reason"].startswith("hold:") for r in rows), "the restored shares were not held"
    rollback_row = next(r for r in rows if r["reason"].startswith("rollback"))
    assert rollback_row["plan_version"] == 2, "the row names the plan it adopts, like every adopted row"
    # its prediction: the restored plan's step as measured before it was left
    assert rollback_row["predicted_step_time_s"] == pytest.approx(0.048, rel=0.1)
    worse = next(r for r in rows if r["adopted"] and r["local_batch_sizes"] == list(first_move[1]))
    assert worse["achieved_step_time_s"] > 1.07 * 0.048  # its outcome is in the decisions table
    # 10 ms a sample beyond 24 is a cliff (the step came out over 1.5× its prediction):
    # rank 0 is not given more again, and the plans settle.
    assert worse["achieved_step_time_s"] > 1.5 * worse["predicted_step_time_s"]
    later = history[2:]
    assert all(h[1][0] <= 24 for h in later), history
    assert history[-1][0] < 60, f"still moving at step {history[-1][0]}: {history}"


def _quota_run(quota_cores: float, steps: int = 80):
    """The burst rank of the test above on a node with a CPU quota; its cgroup reading
    (what the in-training profiler reads, every 5 steps) says it uses half a core."""
    balancer = new_balancer(interval=10)
    sizes, version, history, decisions = [24, 24, 24, 24], 0, [], []
    for step in range(80):
        rows = _burst_rows(step, sizes, version)
        step_s = max(r["busy_time_s"] for r in rows)
        for row in rows:
            row["step_time_s"] = step_s
        asked = step - step % 5  # the sampler's latest reading was asked for here …
        if asked >= 5:  # … and covers the steps from the one before on
            rows[0].update(node_id="capped", cpu_util=100 * rows[0]["busy_time_s"] / step_s,
                           cpu_util_from_step=asked - 5, cpu_quota_cores=quota_cores)
        out = balancer.add_steps(rows)
        decisions += out.decision_rows
        for plan in out.new_plans:
            sizes, version = list(plan.local_batch_sizes), version + 1
            history.append((step + 1, tuple(sizes), plan.reason))
    return decisions, history


def test_a_quota_the_rank_fills_is_seen_before_any_move():
    """At 0.93 of its quota (0.50 of 0.54 cores) the balancer never moves the burst rank
    onto the cliff, so there is nothing to roll back; nor does it shrink it."""
    decisions, history = _quota_run(quota_cores=0.54)
    assert not history, f"rank 0 was moved: {history}"
    assert len(decisions) >= 5 and all("CPU quota: rank 0 ≤ 24 (used 0.50 of 0.54 cores at 24 samples)" in d["reason"]
                                       for d in decisions), decisions


def test_a_plan_over_its_quota_is_moved_whatever_its_predicted_gain():
    """At its whole quota (0.50 of 0.50 cores) rank 0 would stall: its share is over its
    cap, so it is moved below it although the cost lines predict a slower step, and the
    move is not undone."""
    decisions, history = _quota_run(quota_cores=0.5)
    assert history and history[0][1][0] == int(24 * 0.9), history  # 0.9 of what fills the quota
    assert "ranks 0 over their caps (24 > 21)" in history[0][2], history[0][2]
    moved = next(d for d in decisions if d["adopted"])
    assert moved["predicted_gain"] < 0, "the move was one the lines favoured: nothing was forced"
    assert [h[1][0] for h in history] == [21], f"rank 0 went back over its cap: {history}"


def test_a_move_fits_the_quota_at_the_step_time_it_predicts():
    """Rank 0 (1 ms a sample; the others 2 ms) uses half a core at 24 samples and 48 ms
    steps, under a 0.9-core quota: 38 samples would fit at 48 ms, but the move shortens
    the step, and at the step it predicts the quota holds fewer. The adopted plan fits
    the quota at its own predicted step time (0.9 of it, as planning/quota.py keeps)."""
    balancer = new_balancer(interval=10)
    sizes, version, adopted = [24, 24, 24, 24], 0, []
    for step in range(22):  # a gain below twice the bar is adopted at the second decision (confirm_below)
        rows = _burst_rows(step, sizes, version, beyond_s=0.001)
        step_s = max(r["busy_time_s"] for r in rows)
        for row in rows:
            row["step_time_s"] = step_s
        if step >= 5:
            rows[0].update(node_id="capped", cpu_util=100 * rows[0]["busy_time_s"] / step_s,
                           cpu_util_from_step=step - step % 5 - 5, cpu_quota_cores=0.9)
        adopted += [r for r in balancer.add_steps(rows).decision_rows if r["adopted"]]
        adopted += [r for r in balancer.flush() if r["adopted"]]
    assert adopted, "the fast rank was never given more"
    move = adopted[0]
    cpu_per_sample_s = 0.5 * 0.048 / 24
    assert move["local_batch_sizes"][0] > 24
    assert move["local_batch_sizes"][0] <= 0.9 * 0.9 * move["predicted_step_time_s"] / cpu_per_sample_s, move


def test_a_slope_that_was_only_wrong_is_trusted_half_the_way():
    # 5 ms a sample beyond 24: the first move (bounded to 30, planning/moves.py) is slower
    # than the plan before it, but within 1.5× its prediction. Later proposals give rank 0
    # at most half the first increase — and that much (a cliff would allow none).
    _, rows, history = _run_burst(beyond_s=0.005)
    first_move, rollback = history[0], history[1]
    assert rollback[2].startswith("rollback: plan v1 made the step slower"), history
    worse = next(r for r in rows if r["adopted"] and r["local_batch_sizes"] == list(first_move[1]))
    assert worse["achieved_step_time_s"] < 1.5 * worse["predicted_step_time_s"]
    half_way = 24 + (first_move[1][0] - 24) // 2
    later = [r for r in rows if r["global_step"] > rollback[0] and not r["reason"].startswith(("rollback", "hold"))]
    assert later and all(r["local_batch_sizes"][0] <= half_way for r in later), later
    assert any(r["local_batch_sizes"][0] > 24 for r in later), f"rank 0 was never proposed more again: {later}"


def test_a_plan_that_stalls_every_other_step_is_rolled_back():
    """Beyond 24 samples rank 0 outruns its CPU quota on every other step and stalls 50 ms
    into the next period. The plan that gives it more is judged by the kept mean of its
    steps, which counts the stalls; the median of its steps lies in the fast mode (it was
    kept on the cgroup testbed)."""
    balancer = new_balancer(interval=10)
    sizes, version, history = [24, 24, 24, 24], 0, []
    for step in range(30):
        stalled = step % 2 == 1 and sizes[0] > 24
        rows = [{"rank": r, "global_step": step, "local_batch_size": b,
                 "busy_time_s": (0.001 * b + 0.050 * stalled) if r == 0 else 0.002 * b,
                 "plan_version": version, "attempt": 0} for r, b in enumerate(sizes)]
        for plan in balancer.add_steps(rows).new_plans:
            sizes, version = list(plan.local_batch_sizes), version + 1
            history.append((step + 1, tuple(sizes), plan.reason))
    assert history and history[0][1][0] > 24, history
    assert len(history) > 1 and history[1][2].startswith("rollback: plan v1 made the step slower"), history
    assert history[1][0] - history[0][0] <= balancer.rebalance_interval


def test_adapting_to_a_device_that_just_slowed_down_is_not_rolled_back():
    """The plan before the switch is judged by its newest steps: a rank that slowed down
    just before makes them slow too, so the better plan for the slow rank stays."""
    balancer = new_balancer(interval=10)
    sizes, version, history = [24, 24, 24, 24], 0, []
    for step in range(80):
        per_sample = [0.002, 0.002, 0.002, 0.008 if step >= 25 else 0.002]
        rows = [{"rank": r, "global_step": step, "local_batch_size": b, "busy_time_s": per_sample[r] * b,
                 "plan_version": version, "attempt": 0} for r, b in enumerate(sizes)]
        for plan in balancer.add_steps(rows).new_plans:
            sizes, version = list(plan.local_batch_sizes), version + 1
            history.append((step + 1, tuple(sizes), plan.reason))
    assert history and history[0][1][3] < 24, "the balancer never moved work off the slowed rank"
    assert not [h for h in history if h[2].startswith("rollback")], history


def test_a_decision_due_before_the_check_judges_the_outcome_first():
    """Records that arrive late bring the next point's decision forward, before half an
    interval of the new plan has run: going back is then still a rollback, with the cap
    it teaches, not an ordinary move the policy could undo again."""
    balancer = new_balancer(interval=10)
    sizes, version, history, proposed = [24, 24, 24, 24], 0, [], None
    for step in range(80):
        if step % 10 == 0 and proposed is not None:  # workers switch at rebalance points only
            sizes, version, proposed = list(proposed.local_batch_sizes), version + 1, None
            history.append((step, tuple(sizes), reason))
        rows = [dict(r, step_time_s=0.05, wall_time=0.05 * step) for r in _burst_rows(step, sizes, version)]
        # Each step's records arrive 0.3 s after it ended: the balancer decides 7 steps ahead.
        for plan in balancer.add_steps(rows, now=0.05 * step + 0.3).new_plans:
            proposed, reason = plan, plan.reason
    assert history[1][2].startswith("rollback: plan v1 made the step slower"), history
    assert history[1][0] - history[0][0] == balancer.rebalance_interval  # the worse plan ran one interval
    assert all(h[1][0] <= 24 + (history[0][1][0] - 24) // 2 for h in history[2:]), history  # the cap holds


def _turns_worse_run(slow_ranks_too: bool = False, steps: int = 60):
    """Rank 0 takes 1 ms a sample, the others 2 ms. Beyond 24 samples rank 0 runs within a
    quota's burst for the first 6 steps of a plan, then 10 ms a sample beyond 24: the
    plan passes its first check (5 steps) and turns worse after it. With
    ``slow_ranks_too`` every rank slows 1.5× from that step on instead (the machine).

    The policy may not move for 15 steps after its move (a cooldown): what undoes the plan
    at the next point is the balancer's judgement of the outcome, not a new prediction."""
    balancer = Balancer(make_policy("optimal", PolicyConfig(rebalance_cooldown=15)), rebalance_interval=10)
    balancer.begin_attempt(attempt=0, num_workers=4, start_global_step=0)
    sizes, version, since, rows_out, history = [24, 24, 24, 24], 0, 0, [], []
    for step in range(steps):
        turned = step - since >= 6
        def busy(rank: int, b: int) -> float:
            if slow_ranks_too:
                return (0.001 if rank == 0 else 0.002) * b * (1.5 if turned and version == 1 else 1.0)
            if rank == 0:
                return 0.001 * min(b, 24) + (0.010 if turned else 0.001) * max(0, b - 24)
            return 0.002 * b
        rows = [{"rank": r, "global_step": step, "local_batch_size": b, "busy_time_s": busy(r, b),
                 "plan_version": version, "attempt": 0} for r, b in enumerate(sizes)]
        out = balancer.add_steps(rows)
        rows_out += out.decision_rows
        for proposal in out.new_plans:  # in force from the next step
            plan = proposal.numbered(version + 1)
            sizes, version, since = list(plan.local_batch_sizes), plan.version, step + 1
            history.append((step + 1, tuple(sizes), plan.reason))
    return balancer, rows_out, history


def test_a_plan_that_turns_worse_after_its_first_check_is_reverted_at_the_next_point():
    balancer, rows, history = _turns_worse_run()
    first_move = history[0]
    assert first_move[1][0] > 24, history
    assert len(history) > 1, f"the plan that turned worse stayed in force: {history}"
    revert = history[1]
    assert revert[2].startswith("revert: plan v1 runs"), revert[2]
    assert "slower than the" in revert[2] and "back to the shares before it" in revert[2]
    assert revert[1] == (24, 24, 24, 24)
    assert revert[0] - first_move[0] <= balancer.rebalance_interval, "the worse plan ran more than one interval"
    row = next(r for r in rows if r["reason"].startswith("revert:"))
    assert row["adopted"] and row["local_batch_sizes"] == [24, 24, 24, 24]
    # not proposed again: rank 0 is not given the worse plan's share again
    assert all(h[1][0] < first_move[1][0] for h in history[2:]), history


def test_a_plan_is_not_reverted_when_the_whole_machine_slowed_down():
    _, _, history = _turns_worse_run(slow_ranks_too=True)
    assert history and history[0][1][0] > 24, history
    assert not [h for h in history if h[2].startswith(("revert", "rollback"))], history


def test_a_device_that_slows_down_long_after_a_move_is_planned_for_not_reverted():
    """Ranks at 1, 1, 2 and 4 ms a sample start near the best split; the move to it gives
    rank 1 six samples more, and the plan holds through several decisions. Then rank 1
    runs at half speed: the plan's step is now far slower than its predecessor's, measured
    before. That is the device, not the move, so the plan is not reverted to shares that
    would be as slow; the next decisions move samples off rank 1 (benchmarks/balance.py
    --speed-change reverted here, and kept rank 1's share to the end of the run)."""
    balancer = new_balancer(interval=10)
    sizes, version, history, rows_out = [41, 29, 17, 9], 0, [], []
    for step in range(120):
        per_sample = [0.001, 0.002 if step >= 60 else 0.001, 0.002, 0.004]
        rows = [{"rank": r, "global_step": step, "local_batch_size": b, "busy_time_s": per_sample[r] * b,
                 "plan_version": version, "attempt": 0} for r, b in enumerate(sizes)]
        out = balancer.add_steps(rows)
        rows_out += out.decision_rows
        for proposal in out.new_plans:
            plan = proposal.numbered(version + 1)
            sizes, version = list(plan.local_batch_sizes), plan.version
            history.append((step + 1, tuple(sizes), plan.reason))
    moved = [h for h in history if h[0] <= 60]
    assert moved and moved[-1][1][1] > 29, history  # the move gave rank 1 more, before it slowed
    assert len([r for r in rows_out if r["global_step"] < 60 and not r["adopted"]]) >= 2, rows_out  # it held
    assert not [h for h in history if h[2].startswith(("revert", "rollback"))], history
    after = [h for h in history if h[0] > 60]
    assert after and after[0][0] <= 60 + 3 * balancer.rebalance_interval, history
    assert sizes[1] < 27, history  # at half speed rank 1's share is about 21 of 96


def test_each_decision_row_says_what_the_step_took_beyond_the_prediction():
    """rest_of_step_s: mean step time − slowest rank's mean busy − mean all-reduce, on the
    plan decided on: the optimizer and loop, and each step waiting for its unluckiest rank."""
    balancer = new_balancer(policy="static", interval=10)
    rows = []
    for step in range(40):
        busy = [0.010, 0.010, 0.010, 0.010]
        busy[step % 4] = 0.014  # each step one rank is 4 ms slower: mean busy 11 ms, slowest 14 ms
        step_rows_now = [{"rank": r, "global_step": step, "local_batch_size": 24, "busy_time_s": t,
                          "wait_time_s": 0.014 - t + 0.002, "step_time_s": 0.014 + 0.002 + 0.003,
                          "plan_version": 0, "attempt": 0} for r, t in enumerate(busy)]
        rows += balancer.add_steps(step_rows_now).decision_rows
    assert rows
    for row in rows:  # 19 ms a step = 11 ms mean busy + 2 ms all-reduce + 3 ms optimizer + 3 ms jitter
        assert abs(row["rest_of_step_s"] - 0.006) < 1e-3, row["rest_of_step_s"]


def test_without_step_times_the_rest_of_the_step_is_unknown():
    balancer = new_balancer(policy="static", interval=10)
    rows, _, _ = drive(balancer, cluster(), steps=40, sizes=[24] * 4)
    assert rows and all(row["rest_of_step_s"] is None for row in rows)
