"""CPU quotas as caps: how far a rank's share may grow before its node's quota stalls it.

Under a CPU quota (a cgroup limit: Kubernetes CPU limits, ``docker --cpus``) a device runs
at full speed for the quota's share of every period and is then stopped until the next.
While its steps fit in that burst its busy time is short, so a cost line fitted there says
more samples are cheap; the first move beyond the quota stalls every step into the next
period — a cliff, which the balancer's rollback finds only after an interval at about
twice the step time. The quota and the CPU the ranks use under it show the cliff before
any move does: the ranks of a node that use ``u`` cores of a ``q``-core quota can run at
most ``q / u`` times their samples per second, so at the plan's step time at most that
many times their shares:

    cap_i = max(b_i, ⌊b_i · USABLE_FRACTION · q / Σ_{j on i's node} u_j⌋)

Only :data:`USABLE_FRACTION` of the quota counts: a process near its quota is throttled
already in the periods where its steps bunch up. A cap never forces a rank below its
share (its measured busy time already says whether it should shrink); it only stops a
growth the quota cannot carry.

A reading counts only when it covers steps of the plan in force alone: the in-training
profiler's ``cpu_util`` covers the steps from ``cpu_util_from_step`` on
(:mod:`hetero_ray.training.resource_sampler`), and under the plan before the ranks ran
other shares. The ranks of a Ray node share its quota (a node's processes live in one
container or cgroup). Ranks without a quota, or without readings, get no cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

# The share of a quota a node's ranks may plan to use (see the module docstring).
USABLE_FRACTION = 0.9
_VERSIONS_KEPT = 4  # first steps of the newest plan versions, per rank


@dataclass(frozen=True)
class _Reading:
    global_step: int  # the row it came with
    node_id: str
    from_step: int  # the first step the CPU reading covers
    used_cores: float
    quota_cores: float


class QuotaCaps:
    """Per-rank caps from the CPU quotas and the CPU the ranks use (see module docstring)."""

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self._readings: list[Optional[_Reading]] = [None] * num_workers
        self._first_steps: list[dict[int, int]] = [{} for _ in range(num_workers)]  # version -> first step

    def add(self, rows: Sequence[dict]) -> None:
        """Takes step rows of the current worker group (any order, any ranks)."""
        for row in rows:
            rank = row.get("rank")
            if not isinstance(rank, int) or not 0 <= rank < self.num_workers:
                continue
            firsts = self._first_steps[rank]
            version, step = row["plan_version"], row["global_step"]
            firsts[version] = min(step, firsts.get(version, step))
            while len(firsts) > _VERSIONS_KEPT:
                del firsts[min(firsts)]
            reading = _reading_of(row)
            latest = self._readings[rank]
            if reading is not None and (latest is None or reading.global_step > latest.global_step):
                self._readings[rank] = reading

    def caps(self, version: int, sizes: Sequence[int]) -> list[Optional[int]]:
        """Caps for the plan ``version`` with these shares, from readings taken under it
        alone; None for a rank with no quota, no such reading, or a node not fully read."""
        caps: list[Optional[int]] = [None] * self.num_workers
        for ranks in self._nodes().values():
            readings = [self._reading_under(r, version) for r in ranks]
            if any(reading is None for reading in readings):
                continue
            used = sum(reading.used_cores for reading in readings)
            quota = min(reading.quota_cores for reading in readings)
            if used <= 0:
                continue
            room = USABLE_FRACTION * quota / used
            for rank in ranks:
                caps[rank] = max(int(sizes[rank]), math.floor(sizes[rank] * room))
        return caps

    def describe(self, caps: Sequence[Optional[int]], version: int, sizes: Sequence[int]) -> str:
        """The caps a plan with these shares meets, in words for a decision's reason ('' when
        none)."""
        parts = []
        for rank, cap in enumerate(caps):
            reading = self._reading_under(rank, version)
            if cap is not None and reading is not None and sizes[rank] >= cap:
                parts.append(f"rank {rank} ≤ {cap} (uses {reading.used_cores:.2f} of {reading.quota_cores:.2f} "
                             "cores)")
        return "CPU quota: " + ", ".join(parts) if parts else ""

    def _nodes(self) -> dict[str, list[int]]:
        nodes: dict[str, list[int]] = {}
        for rank, reading in enumerate(self._readings):
            if reading is not None:
                nodes.setdefault(reading.node_id, []).append(rank)
        return nodes

    def _reading_under(self, rank: int, version: int) -> Optional[_Reading]:
        reading = self._readings[rank]
        first = self._first_steps[rank].get(version)
        if reading is None or first is None or reading.from_step < first:
            return None
        return reading


def _reading_of(row: dict) -> Optional[_Reading]:
    """The row's CPU reading when it has all of one: usage, its first step, a quota."""
    util, from_step, quota = row.get("cpu_util"), row.get("cpu_util_from_step"), row.get("cpu_quota_cores")
    if util is None or from_step is None or quota is None:
        return None
    if not (math.isfinite(util) and math.isfinite(quota) and quota > 0 and from_step == from_step):
        return None
    return _Reading(int(row["global_step"]), str(row.get("node_id") or f"rank-{row['rank']}"), int(from_step),
                    util / 100.0, float(quota))
