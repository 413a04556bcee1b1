"""A rank left out probes no more than fits in the step of the ranks in (planning/probes.py),
and the plan carries those sizes to every rank (Plan.probe_sizes, plan_sync.broadcast_plan).

The case that asked for it, measured on one H100 with three CPU ranks beside it: once the
CPU ranks were out, their probes of half their last share took longer than the H100's
whole step, so the H100 waited for them at every plan agreement.
"""

from __future__ import annotations

import math

import pytest
import torch

from hetero_ray.planning.balancer import Balancer
from hetero_ray.planning.cost_model import curve_busy_time_s
from hetero_ray.planning.plan import Plan
from hetero_ray.planning.policies import OptimalPolicy, PolicyConfig
from hetero_ray.planning.probes import PROBE_BUDGET, probe_sizes
from hetero_ray.training.rank.plan_sync import broadcast_plan
from tests.helpers import on_gloo_ranks

NAN = math.nan


def test_a_cpu_rank_beside_a_flat_gpu_probes_what_fits_in_half_the_gpus_step():
    # a GPU flat at 1.6 ms up to its knee, three CPU lines of 0.5 ms + 0.44 ms per sample
    alphas, betas, floors = [1.5e-3, 0.5e-3, 0.5e-3, 0.5e-3], [2e-6, 4.4e-4, 4.4e-4, 4.4e-4], [1.6e-3, 0, 0, 0]
    step_s = 4.5e-3
    probes = probe_sizes([512, 0, 0, 0], alphas, betas, floors, step_s)
    assert probes == (0, 3, 3, 3)
    for r in (1, 2, 3):  # the largest size within the budget: one more sample is over it
        assert curve_busy_time_s(alphas[r], betas[r], floors[r], probes[r]) <= PROBE_BUDGET * step_s
        assert curve_busy_time_s(alphas[r], betas[r], floors[r], probes[r] + 1) > PROBE_BUDGET * step_s


def test_ranks_in_probe_nothing_and_no_probe_is_more_than_an_equal_share():
    assert probe_sizes([300, 200, 12], [1e-3] * 3, [1e-5] * 3, [0] * 3, 5e-3) == (0, 0, 0)
    # a rank left out whose curve is flat well inside the budget: an equal share ⌈512/4⌉, no more
    assert probe_sizes([512, 0, 0, 0], [1e-3, 1e-3, 1e-3, 1e-3], [1e-6, 0.0, 1e-9, 1e-6], [0] * 4, 0.1) \
        == (0, 128, 128, 128)


def test_an_unknown_curve_or_one_too_slow_for_a_single_sample_probes_one_sample():
    assert probe_sizes([400, 0], [1e-3, NAN], [1e-5, 1e-4], [0, 0], 5e-3) == (0, 1)
    assert probe_sizes([400, 0], [1e-3, 20e-3], [1e-5, 1e-4], [0, 0], 5e-3) == (0, 1)  # 20 ms > 2.5 ms
    assert probe_sizes([400, 0], [1e-3, 1e-3], [1e-5, -1e-4], [0, 0], 5e-3) == (0, 1)  # a falling line: no curve
    assert probe_sizes([400, 0], [1e-3, 1e-3], [1e-5, 1e-4], [0, 9e-3], 5e-3) == (0, 1)  # its floor is over


def test_a_plan_keeps_its_probe_sizes_through_its_dict_and_refuses_ones_that_do_not_fit_it():
    plan = Plan(2, (512, 0, 0), "optimal", (0, 3, 4))
    assert Plan.from_dict(plan.to_dict()).probe_sizes == (0, 3, 4)
    assert "probe_sizes" not in Plan(2, (500, 12)).to_dict() and Plan.from_dict({"version": 1,
                                                                               "local_batch_sizes": [3, 4]}).probe_sizes == ()
    assert Plan(0, (8, 8)).with_sizes((16, 0), "out", (0, 2)).probe_sizes == (0, 2)
    assert plan == Plan(2, (512, 0, 0))  # the shares are the plan; the probes ride along
    for probes in [(0, 3), (0, 0, 3), (1, 3, 3), (0, -1, 3)]:
        with pytest.raises(ValueError, match="probe sizes must be > 0 for the ranks left out"):
            Plan(2, (512, 0, 0), "", probes)


def _broadcast(rank: int, world_size: int) -> list:
    received = []
    for sent in (Plan(4, (40, 0, 0), "optimal", (0, 3, 5)), Plan(5, (20, 10, 10))):
        plan, caps = broadcast_plan(sent if rank == 0 else None, rank, world_size, torch.device("cpu"),
                                    [None, 7, None] if rank == 0 else None)
        received.append((plan.version, plan.local_batch_sizes, plan.probe_sizes, caps))
    return received


def test_every_rank_receives_rank_0s_probe_sizes_with_its_plan():
    for received in on_gloo_ranks(_broadcast, 3):
        assert received == [
            (4, (40, 0, 0), (0, 3, 5), [None, 7, None]),
            (5, (20, 10, 10), (), [None, 7, None]),
        ]


def _busy_s(rank: int, size: int, step: int) -> float:
    """Rank 0: 0.1 ms a sample. Ranks 1 and 2: 2 ms a sample, until step 30; then as fast as
    rank 0 up to 12 samples and 5 ms for every sample more (a cliff their probes cannot see)."""
    if rank == 0:
        return 1e-4 * size
    if step < 30:
        return 2e-3 * size
    return 1e-4 * min(size, 12) + 5e-3 * max(size - 12, 0)


def test_a_rollback_to_a_plan_that_leaves_ranks_out_gives_them_their_probes_again():
    # the step rows the balancer learns plans from carry no probe sizes: a plan it restores
    # must get them again, or its ranks left out would probe half their last share
    balancer = Balancer(OptimalPolicy(PolicyConfig(noise_margin=0.0)), rebalance_interval=10, global_batch_size=256)
    balancer.begin_attempt(0, 3, 0)
    plan, pending, proposals = Plan(0, (232, 12, 12)), [], []
    for step in range(90):
        if pending and step % 10 == 0:
            plan = pending.pop(0).numbered(plan.version + 1)
        probes = plan.probe_sizes or (0, 0, 0)
        run = [b or p or 1 for b, p in zip(plan.local_batch_sizes, probes)]
        busy = [_busy_s(r, run[r], step) for r in range(3)]
        slowest = max(t for t, b in zip(busy, plan.local_batch_sizes) if b > 0)
        in_ = [b > 0 for b in plan.local_batch_sizes]
        comm = 6e-3 if sum(in_) > 1 else 0.0
        rows = [{"rank": r, "global_step": step, "local_batch_size": plan.local_batch_sizes[r],
                 "busy_time_s": busy[r], "wait_time_s": slowest - busy[r] + comm if in_[r] else 0.0,
                 "probe_batch_size": 0 if in_[r] else run[r], "plan_version": plan.version, "attempt": 0,
                 "step_time_s": slowest + comm} for r in range(3)]
        new = balancer.add_steps(rows, now=float(step)).new_plans
        proposals += new
        pending += new
    reasons = [p.reason for p in proposals]
    assert [p.local_batch_sizes[1:] == (0, 0) for p in proposals][:3] == [True, False, True], reasons
    restored = proposals[2]
    assert restored.reason.startswith("rollback"), reasons
    assert restored.probe_sizes[0] == 0 and min(restored.probe_sizes[1:]) >= 1
    assert restored.numbered(9).probe_sizes == restored.probe_sizes
    # its row predicts the restored plan's step as measured before, and says what those
    # steps took beyond max t_i + c (here nothing: the rows' step is exactly that)
    assert restored.row["predicted_step_time_s"] == pytest.approx(256e-4, rel=0.01)
    assert restored.row["rest_of_step_s"] == pytest.approx(0.0, abs=1e-6)
