"""The balancer: per-step records in, decisions out, every rebalance interval.

Plain class (the actor in :mod:`hetero_ray.runtime.balancer_actor` only forwards what it
returns). It learns the plan in force from the records themselves (each row carries its
``plan_version`` and ``local_batch_size``), so it never decides on a plan the workers are
not running:

    at the newest step every rank has reported, g:
      if g ≥ next decision step and the last adopted proposal is in force (or none is pending):
          decision = policy.decide(plan in force, estimates, g)
          next decision step = g + rebalance_interval

An adopted decision's row waits until the new plan has run ``achieved_window_steps``
complete steps; then its ``achieved_step_time_s`` (median over those steps of the
slowest rank's busy time — the quantity the prediction is about) is filled in and the row
is emitted, prediction and outcome side by side.
"""

from __future__ import annotations

import collections
import statistics
import time
from dataclasses import dataclass, field
from typing import Optional

from hetero_ray.balancing.estimates import ClusterEstimates
from hetero_ray.balancing.policies import Decision, Policy
from hetero_ray.plan import Plan

_STEPS_TRACKED = 256  # per-step completeness kept for the newest steps only


@dataclass
class BalancerOutput:
    """What the actor must do after a batch of records."""

    decision_rows: list[dict] = field(default_factory=list)  # for the metrics store
    new_plans: list[Plan] = field(default_factory=list)  # for the scheduler, in order


@dataclass
class _StepInfo:
    ranks: set = field(default_factory=set)
    max_busy_time_s: float = 0.0
    plan_version: int = -1
    local_batch_sizes: dict = field(default_factory=dict)


class Balancer:
    def __init__(self, policy: Policy, rebalance_interval: int, window_steps: int = 32,
                 achieved_window_steps: Optional[int] = None):
        self.policy = policy
        self.rebalance_interval = rebalance_interval
        self.window_steps = window_steps
        self.achieved_window_steps = achieved_window_steps or max(5, min(rebalance_interval, window_steps))
        self.num_workers = 0
        self.attempt = -1
        self.estimates: Optional[ClusterEstimates] = None
        self._steps: collections.OrderedDict[int, _StepInfo] = collections.OrderedDict()
        self._next_decision_step = 0
        self._waiting_since_version: Optional[int] = None  # a proposal made under this version
        self._awaiting_outcome: Optional[tuple[dict, int]] = None  # (row, version it was proposed under)
        self._achieved: list[float] = []

    # ------------------------------------------------------------------ lifecycle
    def begin_attempt(self, attempt: int, num_workers: int, start_global_step: int) -> None:
        """A worker group (re)started; estimates survive unless the number of ranks changed."""
        if self.estimates is None or num_workers != self.num_workers:
            self.estimates = ClusterEstimates(num_workers, window_steps=self.window_steps)
        self.num_workers = num_workers
        self.attempt = attempt
        self._steps.clear()
        self._next_decision_step = start_global_step + self.rebalance_interval
        self._waiting_since_version = None

    # ------------------------------------------------------------------ feeding
    def add_steps(self, rows: list[dict]) -> BalancerOutput:
        out = BalancerOutput()
        if self.estimates is None:
            return out
        current = [r for r in rows if r.get("attempt") == self.attempt]
        self.estimates.add(current)
        newest_complete = None
        for row in current:
            info = self._steps.get(row["global_step"])
            if info is None:
                info = self._steps[row["global_step"]] = _StepInfo()
                while len(self._steps) > _STEPS_TRACKED:
                    self._steps.popitem(last=False)
            info.ranks.add(row["rank"])
            info.plan_version = row["plan_version"]
            info.local_batch_sizes[row["rank"]] = row["local_batch_size"]
            busy = row.get("busy_time_s")
            if busy is not None and busy == busy:  # not NaN
                info.max_busy_time_s = max(info.max_busy_time_s, busy)
            if len(info.ranks) == self.num_workers:
                self._on_complete_step(row["global_step"], info, out)
                newest_complete = max(newest_complete or -1, row["global_step"])
        if newest_complete is not None and newest_complete >= self._next_decision_step:
            self._decide(newest_complete, out)
        return out

    def _on_complete_step(self, global_step: int, info: _StepInfo, out: BalancerOutput) -> None:
        if self._awaiting_outcome is None:
            return
        row, proposed_under_version = self._awaiting_outcome
        if info.plan_version <= proposed_under_version:
            return  # the adopted plan is not in force yet
        self._achieved.append(info.max_busy_time_s)
        if len(self._achieved) >= self.achieved_window_steps:
            row["achieved_step_time_s"] = statistics.median(self._achieved)
            out.decision_rows.append(row)
            self._awaiting_outcome, self._achieved = None, []

    def _decide(self, global_step: int, out: BalancerOutput) -> None:
        info = self._steps[global_step]
        if self._waiting_since_version is not None and info.plan_version <= self._waiting_since_version:
            return  # the last adopted plan is not in force yet: decide on what runs, not on the past
        self._waiting_since_version = None
        sizes = tuple(info.local_batch_sizes[r] for r in range(self.num_workers))
        if any(b == 0 for b in sizes):  # a short last window, not a plan
            return
        current = Plan(info.plan_version, sizes)
        decision: Decision = self.policy.decide(current, self.estimates, global_step)
        self._next_decision_step = global_step + self.rebalance_interval
        row = {**decision.to_record(), "achieved_step_time_s": None, "wall_time": time.time()}
        if decision.adopt:
            out.new_plans.append(decision.plan)
            self._waiting_since_version = current.version
            out.decision_rows.extend(self.flush())  # a previous adoption, superseded: what was measured
            self._awaiting_outcome, self._achieved = (row, current.version), []
        else:
            out.decision_rows.append(row)

    def flush(self) -> list[dict]:
        """Rows still waiting for their outcome (at the end of a run)."""
        if self._awaiting_outcome is None:
            return []
        row = self._awaiting_outcome[0]
        if self._achieved:
            row["achieved_step_time_s"] = statistics.median(self._achieved)
        self._awaiting_outcome, self._achieved = None, []
        return [row]

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        return {
            "num_workers": self.num_workers,
            "estimates": None if self.estimates is None else self.estimates.state_dict(),
            "policy": self.policy.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.num_workers = int(state.get("num_workers") or 0)
        if state.get("estimates") and self.num_workers:
            self.estimates = ClusterEstimates(self.num_workers, window_steps=self.window_steps)
            self.estimates.load_state_dict(state["estimates"])
        self.policy.load_state_dict(state.get("policy") or {})
