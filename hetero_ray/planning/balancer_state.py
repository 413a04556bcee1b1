"""What the balancer (planning/balancer.py) hands out and keeps: its output after a batch of
records (:class:`Proposal`, :class:`BalancerOutput`), its saved decision state, and its
records of each step and of the plans it judges."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from hetero_ray.planning.feed_trial import FeedTrial
from hetero_ray.planning.plan import Plan


@dataclass
class Predecessor:
    """The plan an adoption replaced (for a rollback)."""

    local_batch_sizes: tuple[int, ...]
    version: int


@dataclass(frozen=True)
class PlanInForce:
    """A plan that passed its first check, judged again at every decision while in force."""

    version: int
    predecessor: Predecessor
    before_s: float  # the predecessor's step time, as the first check measured it
    before_busy_s: tuple[float, ...]  # … and each rank's mean busy time over the same steps
    predicted_s: Optional[float]  # the plan's predicted step time (None: unknown)
    speed_changes: int  # the ranks' speed changes the estimates had found when it last passed
    held: bool = False  # it passed a judgement at a decision after its first check


@dataclass(frozen=True)
class DecisionState:
    """A saved :meth:`Balancer.decision_state`, read back and checked."""

    awaiting_outcome: Optional[tuple[dict, int]]
    waiting_since_version: Optional[int]
    predecessor: Optional[Predecessor]
    holds_left: int
    learned_caps: tuple[Optional[int], ...]
    feed_trial: Optional[FeedTrial] = None

    @classmethod
    def from_dict(cls, state: dict, num_workers: int) -> "DecisionState":
        """Raises (KeyError, TypeError, ValueError) when ``state`` is not a saved one for
        ``num_workers`` ranks."""
        awaiting = state.get("awaiting_outcome")
        predecessor = state.get("predecessor")
        waiting = state.get("waiting_since_version")
        learned = tuple(None if c is None else int(c) for c in state.get("learned_caps") or ())
        if learned and len(learned) != num_workers:
            raise ValueError(f"{len(learned)} learned caps for {num_workers} ranks")
        return cls(
            awaiting_outcome=None if awaiting is None else (dict(awaiting["row"]), int(awaiting["proposed_under_version"])),
            waiting_since_version=None if waiting is None else int(waiting),
            predecessor=None if predecessor is None else Predecessor(
                tuple(int(b) for b in predecessor["local_batch_sizes"]), int(predecessor["version"])),
            holds_left=int(state.get("holds_left") or 0),
            learned_caps=learned,
            feed_trial=None if not state.get("feed_trial") else FeedTrial.from_dict(state["feed_trial"]),
        )


@dataclass(frozen=True)
class Proposal:
    """Shares the balancer adopted, not yet a plan: the planner alone numbers plans."""

    local_batch_sizes: tuple[int, ...]
    reason: str
    row: dict = field(repr=False)  # its decision row, emitted once the outcome is measured
    probe_sizes: tuple[int, ...] = ()  # Plan.probe_sizes
    check_after_steps: int = 0  # Plan.check_after_steps

    def numbered(self, version: int) -> Plan:
        """The plan the shares become as ``version``, which their decision row records."""
        plan = Plan(version, self.local_batch_sizes, self.reason, self.probe_sizes, self.check_after_steps)
        self.row["plan_version"] = plan.version
        return plan


@dataclass
class BalancerOutput:
    """What the actor must do after a batch of records."""

    decision_rows: list[dict] = field(default_factory=list)  # for the metrics store
    new_plans: list[Proposal] = field(default_factory=list)  # for the planner to number, in order


@dataclass
class StepInfo:
    """What the balancer knows of one global step, from every rank's row of it."""

    ranks: set = field(default_factory=set)
    max_busy_time_s: float = 0.0  # of the ranks in (a rank left out times a probe of its own)
    comm_time_s: float = math.inf  # the all-reduce: the least wait of the ranks in (planning/comm.py)
    step_time_s: float = -math.inf  # the step's (the slowest rank's); -inf: not reported
    wall_time: float = -math.inf  # when the step ended (the latest rank's clock)
    rank0_wall_time: float = math.nan  # … on rank 0's clock (a feeding trial's step periods)
    epoch: int = -1
    plan_version: int = -1
    local_batch_sizes: dict = field(default_factory=dict)
    busy_time_s: dict = field(default_factory=dict)  # per rank

    @property
    def cost_s(self) -> float:
        """The step as the policies predict it: ``max_{i∈G} t_i + c(G)``."""
        return self.max_busy_time_s + (self.comm_time_s if math.isfinite(self.comm_time_s) else 0.0)
