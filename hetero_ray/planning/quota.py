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

    room = USABLE_FRACTION · q / Σ_{j on i's node} u_j,    cap_i = ⌊b_i · room⌋

Only :data:`USABLE_FRACTION` of the quota counts: a process near its quota is throttled
already in the periods where its steps bunch up. Where ``room ≥ 1`` the cap stops a growth
the quota cannot carry and never asks a rank to shrink. Where the node's ranks use more
than :data:`STALL_FRACTION` of their quota, their shares are over their caps (the planner
moves such a plan whatever its predicted gain: a rank stalling into the quota's next
period every few steps is slower than any straight line fitted through its steps says).
In between the cap is the share itself, so that a rank the cap just shrank is not grown
back at once, nor shrunk again by noise. Only readings of the plan in force ask a rank to
shrink: one carried over from the plan before (below) counts a step's fixed CPU per
sample, which overstates what fewer samples cost.

A reading counts only when it covers steps of one plan: the in-training profiler's
``cpu_util`` covers the steps from ``cpu_util_from_step`` on
(:mod:`hetero_ray.training.timing.resource_sampler`), and steps of two plans ran two shares. It
need not be the plan in force — right after a plan change there is no reading of the new
plan yet, and a move then is as likely to find the cliff as any other — because what a
reading gives is the CPU a sample costs: rank ``j`` using ``u_j`` cores at steps of
``T`` seconds with ``b_j`` samples spends ``c_j = u_j·T/b_j`` CPU-seconds a sample (its
fixed CPU per step counted per sample: too much when the rank grows, the only time a
cap matters, so the cap errs on the safe side), so at
the plan in force (shares ``b'_j``, step time ``T'``) the node's ranks fit its quota while

    Σ_j c_j·b'_j ≤ USABLE_FRACTION · q · T'

and each rank's cap is its share times the room that leaves (for a reading of the plan in
force, the formula above). The ranks of a Ray node share its quota (a node's processes
live in one container or cgroup). Ranks without a quota, or without readings, get no cap.
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
