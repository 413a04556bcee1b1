"""CPU quotas as caps: how far a rank's share may grow before its node's quota stalls it.

Under a CPU quota (a cgroup limit: Kubernetes CPU limits, ``docker --cpus``) a step that
outgrows the quota's burst stalls into its next period: a cliff no fitted line shows, which
the quota and the CPU the ranks use under it show before any move does. A reading of one
plan's steps (``u_j`` cores at steps of ``T`` seconds with ``b_j`` samples) gives the CPU a
sample costs, ``c_j = u_j·T/b_j``. At the plan in force (shares ``b'_j``, step ``T'``) the
ranks of a node with a ``q``-core quota then have

    room = USABLE_FRACTION · q · T' / Σ_j c_j·b'_j,    cap_i = ⌊b'_i · room⌋   (room ≥ 1)

and where they use more than :data:`STALL_FRACTION` of it (a reading of the plan in force),
their shares are over their caps; in between, the cap is the share. Ranks without a quota
or a reading get no cap. Why: docs/profiling-and-planning.md#cpu-quotas-as-caps
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

# The share of a quota a node's ranks may plan to use (see the module docstring).
USABLE_FRACTION = 0.9
STALL_FRACTION = 0.95  # beyond it a node's shares are over their caps (see the module docstring)
_VERSIONS_KEPT = 4  # first steps of the newest plan versions, per rank


@dataclass(frozen=True)
class _Reading:
    global_step: int  # the row it came with
    version: int  # the plan the steps it covers ran
    node_id: str
    from_step: int  # the first step the CPU reading covers
    local_batch_size: int
    used_cores: float
    quota_cores: float


@dataclass
class _PlanSteps:
    """What one rank's rows say about one plan: where it began, its mean step time."""

    first_step: int
    total_step_s: float = 0.0
    timed_steps: int = 0

    @property
    def step_s(self) -> Optional[float]:
        return self.total_step_s / self.timed_steps if self.timed_steps else None


class QuotaCaps:
    """Per-rank caps from the CPU quotas and the CPU the ranks use (see module docstring)."""

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self._readings: list[Optional[_Reading]] = [None] * num_workers
        self._plans: list[dict[int, _PlanSteps]] = [{} for _ in range(num_workers)]  # by plan version

    def add(self, rows: Sequence[dict]) -> None:
        """Takes step rows of the current worker group (any order, any ranks)."""
        for row in rows:
            rank = row.get("rank")
            if not isinstance(rank, int) or not 0 <= rank < self.num_workers:
                continue
            plans = self._plans[rank]
            version, step = row["plan_version"], row["global_step"]
            plan = plans.get(version)
            if plan is None:
                plan = plans[version] = _PlanSteps(step)
                while len(plans) > _VERSIONS_KEPT:
                    del plans[min(plans)]
            plan.first_step = min(plan.first_step, step)
            step_s = row.get("step_time_s")
            if step_s is not None and math.isfinite(step_s) and step_s > 0:
                plan.total_step_s += step_s
                plan.timed_steps += 1
            reading = _reading_of(row)
            latest = self._readings[rank]
            if (reading is not None and reading.from_step >= plan.first_step  # steps of this plan alone
                    and (latest is None or reading.global_step > latest.global_step)):
                self._readings[rank] = reading

    def caps(self, version: int, sizes: Sequence[int], step_scale: float = 1.0) -> list[Optional[int]]:
        """Caps for the plan ``version`` with these shares, reckoned at its mean step time so
        far times ``step_scale`` (a move's predicted step time over the plan's, both from
        the cost model: the measured step holds the collectives and stalls that a predicted
        busy time leaves out); None for a rank with no quota, no reading of one plan, no
        timed step of the plan, or a node not fully read."""
        caps: list[Optional[int]] = [None] * self.num_workers
        for ranks in self._nodes().values():
            costs = [self._cpu_per_sample_s(r) for r in ranks]
            now = [self._plans[r].get(version) for r in ranks]
            step_now = [p.step_s for p in now if p is not None and p.step_s is not None]
            if any(c is None for c in costs) or not step_now:
                continue
            needed = sum(c * sizes[r] for c, r in zip(costs, ranks))  # CPU-seconds a step of the plan in force
            quota = min(self._readings[r].quota_cores for r in ranks)
            if needed <= 0:
                continue
            room = USABLE_FRACTION * quota * step_scale * (sum(step_now) / len(step_now)) / needed
            of_this_plan = all(self._readings[r].version == version for r in ranks)
            for rank in ranks:
                caps[rank] = _cap(int(sizes[rank]), room, may_shrink=of_this_plan)
        return caps

    def describe(self, caps: Sequence[Optional[int]], sizes: Sequence[int]) -> str:
        """The caps a plan with these shares meets, in words for a decision's reason ('' when
        none)."""
        parts = []
        for rank, cap in enumerate(caps):
            reading = self._readings[rank]
            if cap is not None and reading is not None and sizes[rank] >= cap:
                parts.append(f"rank {rank} ≤ {cap} (used {reading.used_cores:.2f} of {reading.quota_cores:.2f} "
                             f"cores at {reading.local_batch_size} samples)")
        return "CPU quota: " + ", ".join(parts) if parts else ""

    def _nodes(self) -> dict[str, list[int]]:
        nodes: dict[str, list[int]] = {}
        for rank, reading in enumerate(self._readings):
            if reading is not None:
                nodes.setdefault(reading.node_id, []).append(rank)
        return nodes

    def _cpu_per_sample_s(self, rank: int) -> Optional[float]:
        """CPU-seconds a sample cost the rank, from its newest reading (of one plan's steps)."""
        reading = self._readings[rank]
        plan = None if reading is None else self._plans[rank].get(reading.version)
        if plan is None or plan.step_s is None or reading.local_batch_size <= 0:
            return None
        return reading.used_cores * plan.step_s / reading.local_batch_size


def _cap(share: int, room: float, may_shrink: bool) -> int:
    """A rank's cap at ``share`` samples when its node has ``room`` (module docstring)."""
    if room >= 1.0:
        return max(share, math.floor(share * room))
    if may_shrink and room < USABLE_FRACTION / STALL_FRACTION:  # it uses more than STALL_FRACTION of its quota
        return max(1, math.floor(share * room))
    return share


def _reading_of(row: dict) -> Optional[_Reading]:
    """The row's CPU reading when it has all of one: usage, its first step, a quota."""
    util, from_step, quota = row.get("cpu_util"), row.get("cpu_util_from_step"), row.get("cpu_quota_cores")
    if util is None or from_step is None or quota is None:
        return None
    if not (math.isfinite(util) and math.isfinite(quota) and quota > 0 and from_step == from_step):
        return None
    return _Reading(int(row["global_step"]), int(row["plan_version"]), str(row.get("node_id") or f"rank-{row['rank']}"),
                    int(from_step), int(row.get("local_batch_size") or 0), util / 100.0, float(quota))
