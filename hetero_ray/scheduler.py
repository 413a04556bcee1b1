"""The scheduler: the one place that says which plan is in force.

Rank 0 asks it for the plan every rebalance interval (``plan_for``); whoever decides a
better split (the balancer) publishes it here (``propose``). It also answers for a world
size it has not seen, which is what happens after an elastic restart: a fresh initial
plan for the new number of workers, with the same global batch.

Plain class; :mod:`hetero_ray.runtime.actors` runs it as a named actor.
"""

from __future__ import annotations

from typing import Optional, Sequence

from hetero_ray.balancing.policies import PolicyConfig, make_policy
from hetero_ray.plan import Plan


def initial_plan(
    policy: str,
    global_batch_size: int,
    num_workers: int,
    version: int = 0,
    batch_split: Optional[Sequence[int]] = None,
    weights: Optional[Sequence[float]] = None,
    policy_config: Optional[PolicyConfig] = None,
) -> Plan:
    """The first plan of a worker group.

    An explicit ``batch_split`` for this number of workers wins. Otherwise the policy's own
    first plan: equal for ``static``; by ``weights`` (per-rank speed or profiled
    throughput) for ``proportional`` and, when given, for the adaptive policies.
    """
    if batch_split is not None and len(batch_split) == num_workers:
        return Plan(version, tuple(batch_split), "explicit --batch-split")
    if weights is not None and len(weights) != num_workers:
        weights = None  # weights of another worker group: no information about this one
    if policy == "proportional" and weights is None:
        weights = [1.0] * num_workers
    first = make_policy(policy, policy_config, weights=weights).initial_plan(global_batch_size, num_workers)
    return Plan(version, first.local_batch_sizes, first.reason)


class Scheduler:
    def __init__(
        self,
        global_batch_size: int,
        policy: str,
        batch_split: Optional[Sequence[int]] = None,
        weights: Optional[Sequence[float]] = None,
        plan_changes: Optional[Sequence[dict]] = None,
        policy_config: Optional[dict] = None,
    ):
        """
        Args:
            plan_changes: scripted changes ``{"global_step", "local_batch_sizes"}``, applied
                at the first rebalance point at or after their step (tests and demos).
        """
        self.global_batch_size = global_batch_size
        self.policy = policy
        self.batch_split = list(batch_split) if batch_split else None
        self.weights = list(weights) if weights else None
        self.policy_config = PolicyConfig(**(policy_config or {}))
        self._plan_changes = sorted(plan_changes or [], key=lambda c: c["global_step"])
        self._plan: Optional[Plan] = None
        self._next_version = 0

    def plan_for(self, num_workers: int, global_step: int = 0) -> dict:
        """The plan in force for ``num_workers`` ranks at ``global_step``.

        A new initial plan if the number of workers changed; a scripted change once its
        step is reached.
        """
        while self._plan_changes and self._plan_changes[0]["global_step"] <= global_step:
            change = self._plan_changes.pop(0)
            if len(change["local_batch_sizes"]) == num_workers:
                self._plan = Plan(self._next_version, tuple(change["local_batch_sizes"]),
                                  f"scripted change at step {change['global_step']}")
                self._next_version += 1
        if self._plan is None or self._plan.num_workers != num_workers:
            self._plan = initial_plan(
                self.policy, self.global_batch_size, num_workers, self._next_version,
                self.batch_split, self.weights, self.policy_config,
            )
            self._next_version = self._plan.version + 1
        return self._plan.to_dict()

    def propose(self, plan: dict) -> dict:
        """Publishes a new plan; it takes effect at rank 0's next rebalance point."""
        new = Plan.from_dict(plan)
        if new.global_batch_size != self.global_batch_size:
            raise ValueError(
                f"plan {new} sums to {new.global_batch_size}, the run's global batch is {self.global_batch_size}"
            )
        new = Plan(max(new.version, self._next_version), new.local_batch_sizes, new.reason)
        self._plan = new
        self._next_version = new.version + 1
        return new.to_dict()

    def resume_from(self, plan: dict) -> None:
        """A worker group restored a checkpoint holding ``plan``.

        A scheduler that lived through the failure keeps its own (newer or equal) plan; a
        new one (the driver was restarted with --resume) adopts the checkpoint's, so plan
        versions keep increasing across the whole run.
        """
        restored = Plan.from_dict(plan)
        self._next_version = max(self._next_version, restored.version + 1)
        if self._plan is None:
            self._plan = restored
