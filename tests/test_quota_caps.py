"""CPU quotas as caps (planning/quota.py): a node's ranks may grow only as far as its quota
carries, judged from readings that cover one plan's steps."""

from __future__ import annotations

import pytest

from hetero_ray.planning.quota import STALL_FRACTION, USABLE_FRACTION, QuotaCaps


def _rows(rank, steps, version, size, step_s=0.040, node="a"):
    return [{"rank": rank, "global_step": s, "plan_version": version, "node_id": node, "local_batch_size": size,
             "step_time_s": step_s} for s in steps]


def _reading(row, util, from_step, quota):
    return {**row, "cpu_util": util, "cpu_util_from_step": from_step, "cpu_quota_cores": quota}


def test_a_rank_that_fills_its_quota_may_not_grow():
    caps = QuotaCaps(2)
    caps.add(_rows(0, range(21), 0, 100) + _rows(1, range(20), 0, 28, node="b"))
    caps.add([_reading(_rows(1, [20], 0, 28, node="b")[0], util=31.0, from_step=10, quota=0.333)])
    assert caps.caps(0, [100, 28]) == [None, 28]


def test_room_under_the_quota_is_the_cap():
    caps = QuotaCaps(1)
    caps.add(_rows(0, range(40, 60), 3, 30) + [_reading(_rows(0, [60], 3, 30)[0], util=20.0, from_step=50, quota=0.5)])
    assert caps.caps(3, [30]) == [int(30 * USABLE_FRACTION * 0.5 / 0.2)]  # 67: 2.25 times the share
    assert "rank 0 ≤ 67 (used 0.20 of 0.50 cores at 30 samples)" in caps.describe(caps.caps(3, [30]), [67])
    assert caps.describe(caps.caps(3, [30]), [40]) == "", "a cap the plan stays under is not named"


def test_a_reading_of_two_plans_does_not_count():
    caps = QuotaCaps(1)
    caps.add(_rows(0, range(20), 0, 64) + _rows(0, range(20, 25), 1, 36))
    caps.add([_reading(_rows(0, [25], 1, 36)[0], util=10.0, from_step=15, quota=1.0)])
    assert caps.caps(1, [36]) == [None], "cpu_util covers steps 15-25: 64 samples, then 36"


def test_a_reading_of_the_plan_before_caps_the_plan_in_force():
    """Right after a move (here 64 → 36 samples, the step 86 → 50 ms) there is no reading of
    the new plan yet; the old one's CPU per sample carries over: at 64 samples and 86 ms the
    rank used its whole 0.33-core quota, 0.44 ms of CPU a sample, so 50 ms steps hold at
    most 0.9 · 0.33 · 50 / 0.44 ≈ 33 samples: none more than the 36 it has."""
    caps = QuotaCaps(1)
    caps.add(_rows(0, range(20), 0, 64, step_s=0.086))
    caps.add([_reading(_rows(0, [19], 0, 64, step_s=0.086)[0], util=33.0, from_step=10, quota=0.33)])
    caps.add(_rows(0, range(20, 26), 1, 36, step_s=0.050))
    assert caps.caps(1, [36]) == [36]
    # with twice the quota the same reading leaves room: 36 · 0.9 · 0.66 · 0.050 / (0.33 · 0.086 / 64 · 36)
    roomy = QuotaCaps(1)
    roomy.add(_rows(0, range(20), 0, 64, step_s=0.086))
    roomy.add([_reading(_rows(0, [19], 0, 64, step_s=0.086)[0], util=33.0, from_step=10, quota=0.66)])
    roomy.add(_rows(0, range(20, 26), 1, 36, step_s=0.050))
    assert roomy.caps(1, [36]) == [pytest.approx(67, abs=1)]


def test_the_ranks_of_a_node_share_its_quota():
    caps = QuotaCaps(3)
    caps.add(_rows(0, range(10), 0, 20) + _rows(1, range(10), 0, 20) + _rows(2, range(10), 0, 10, node="b"))
    caps.add([_reading(_rows(0, [10], 0, 20)[0], util=40.0, from_step=0, quota=1.0),
              _reading(_rows(1, [10], 0, 20)[0], util=50.0, from_step=0, quota=1.0),
              _reading(_rows(2, [10], 0, 10, node="b")[0], util=100.0, from_step=0, quota=4.0)])
    # node a: 0.9 of 1 core for 0.9 used (no growth); node b: 0.9 × 4 / 1 = 3.6 times
    assert caps.caps(0, [20, 20, 10]) == [20, 20, 36]


def test_no_quota_or_no_reading_is_no_cap():
    caps = QuotaCaps(2)
    caps.add(_rows(0, range(10), 0, 10) + _rows(1, range(10), 0, 10, node="b"))
    caps.add([{**_rows(0, [10], 0, 10)[0], "cpu_util": 50.0, "cpu_util_from_step": 0, "cpu_quota_cores": None}])
    assert caps.caps(0, [10, 10]) == [None, None]


@pytest.mark.parametrize("used_fraction, cap", [(0.5, 54), (0.93, 30), (STALL_FRACTION + 0.02, 27), (1.0, 27)])
def test_a_node_over_its_quota_is_over_its_caps(used_fraction, cap):
    """Below 0.9 of the quota a share may grow; up to STALL_FRACTION it is held; beyond,
    the cap asks the rank to shrink to 0.9 of the quota."""
    caps = QuotaCaps(1)
    caps.add(_rows(0, range(20), 0, 30) + [_reading(_rows(0, [20], 0, 30)[0], util=100 * 0.5 * used_fraction,
                                                   from_step=10, quota=0.5)])
    assert caps.caps(0, [30]) == [cap]


def test_a_shorter_predicted_step_leaves_less_room():
    """Reckoned at a move's predicted step time: the plan's measured step time (collectives
    and stalls included) scaled by the cost model's predicted change, not the predicted
    busy time itself, which leaves them out."""
    caps = QuotaCaps(1)
    caps.add(_rows(0, range(20), 0, 30, step_s=0.080) + [_reading(_rows(0, [20], 0, 30, step_s=0.080)[0],
                                                                  util=20.0, from_step=10, quota=0.5)])
    assert caps.caps(0, [30]) == [67]  # 0.9 · 0.5 / 0.2 = 2.25 times the share
    assert caps.caps(0, [30], step_scale=0.5) == [33]  # half the step: half the CPU per step
