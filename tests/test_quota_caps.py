"""CPU quotas as caps (planning/quota.py): a node's ranks may grow only as far as its quota
carries, judged from readings of the plan in force alone."""

from __future__ import annotations

from hetero_ray.planning.quota import USABLE_FRACTION, QuotaCaps


def _row(rank, step, version, size=None, util=None, from_step=None, quota=None, node="a"):
    row = {"rank": rank, "global_step": step, "plan_version": version, "node_id": node, "local_batch_size": size}
    if util is not None:
        row.update(cpu_util=util, cpu_util_from_step=from_step, cpu_quota_cores=quota)
    return row


def test_a_rank_that_fills_its_quota_may_not_grow():
    caps = QuotaCaps(2)
    caps.add([_row(0, s, 0) for s in range(20)] + [_row(1, s, 0, node="b") for s in range(20)])
    caps.add([_row(1, 20, 0, util=31.0, from_step=10, quota=0.333, node="b")])
    assert caps.caps(0, [100, 28]) == [None, 28]


def test_room_under_the_quota_is_the_cap():
    caps = QuotaCaps(1)
    caps.add([_row(0, s, 3) for s in range(40, 60)] + [_row(0, 60, 3, util=20.0, from_step=50, quota=0.5)])
    assert caps.caps(3, [30]) == [int(30 * USABLE_FRACTION * 0.5 / 0.2)]  # 67: 2.25 times the share
    assert "rank 0 ≤ 67 (uses 0.20 of 0.50 cores)" in caps.describe(caps.caps(3, [30]), 3, [67])
    assert caps.describe(caps.caps(3, [30]), 3, [40]) == "", "a cap the plan stays under is not named"


def test_a_reading_from_before_the_plan_does_not_count():
    caps = QuotaCaps(1)
    caps.add([_row(0, s, 0) for s in range(20)])
    caps.add([_row(0, s, 1) for s in range(20, 25)] + [_row(0, 25, 1, util=10.0, from_step=15, quota=1.0)])
    assert caps.caps(1, [30]) == [None], "cpu_util covers steps 15-25, partly under plan v0"
    caps.add([_row(0, 30, 1, util=33.0, from_step=25, quota=1.0)])
    assert caps.caps(1, [30]) == [81]


def test_the_ranks_of_a_node_share_its_quota():
    caps = QuotaCaps(3)
    caps.add([_row(r, s, 0, node="a" if r < 2 else "b") for r in range(3) for s in range(10)])
    caps.add([_row(0, 10, 0, util=40.0, from_step=0, quota=1.0), _row(1, 10, 0, util=50.0, from_step=0, quota=1.0),
              _row(2, 10, 0, util=100.0, from_step=0, quota=4.0, node="b")])
    # node a: 0.9 of 1 core for 0.9 used (no growth); node b: 0.9 × 4 / 1 = 3.6 times
    assert caps.caps(0, [20, 20, 10]) == [20, 20, 36]


def test_no_quota_or_no_reading_is_no_cap():
    caps = QuotaCaps(2)
    caps.add([_row(0, s, 0) for s in range(10)] + [_row(1, s, 0, node="b") for s in range(10)])
    caps.add([{**_row(0, 10, 0), "cpu_util": 50.0, "cpu_util_from_step": 0, "cpu_quota_cores": None}])
    assert caps.caps(0, [10, 10]) == [None, None]
