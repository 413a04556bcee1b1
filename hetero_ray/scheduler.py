"""The scheduler: the one place that says which plan is in force.

Rank 0 asks it for the plan every rebalance interval (``plan_for``); the balancer
publishes better splits here (``propose``). It answers for a world size it has not seen
too, which is what happens after an elastic restart: a fresh first plan for the new
number of workers, with the same global batch.

The first plan of a worker group comes from measurements when there are any: the ranks'
own warm-up lines (under emulated speeds, which only the ranks' emulators know: see
training/warmup.py), with the memory caps of the node profiles (``set_capabilities``);
else the profiles alone, which give each rank the busy-time line of the device it runs
on. Either way the first step is already balanced. While profiles are on their way (``await_capabilities``: the nodes are profiled
beside the workers' start), a first plan that would use them is not made: ``plan_for``
answers ``{"awaiting": ...}`` and rank 0 asks again. Emulated speeds never reach this
module. Plain class; the actor is made in :mod:`hetero_ray.runtime.actors`.

Its state (the latest plan, the version counter, the caps, the node profiles, the
scripted changes still to come) is written to ``scheduler_state.json`` in the run
directory at every change, and read back when it starts. Nothing else knows all of it: a
plan the balancer proposed that rank 0 has not fetched yet is in no table, and the balancer
waits for it to be in force before it decides again. So a restarted scheduler (or the one
of a ``--resume``) serves the plan in force with versions that keep increasing, instead of
a first plan numbered 0 again.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Sequence

from hetero_ray.planning.capacity import RankCapacity, rank_capacities
from hetero_ray.planning.policies import PolicyConfig, make_policy
from hetero_ray.metrics.run_files import SCHEDULER_STATE_FILE, read_json, write_json
from hetero_ray.planning.plan import Plan

logger = logging.getLogger(__name__)


def initial_plan(
    policy: str,
    global_batch_size: int,
    num_workers: int,
    version: int = 0,
    batch_split: Optional[Sequence[int]] = None,
    policy_config: Optional[PolicyConfig] = None,
    capacities: Optional[Sequence] = None,
) -> tuple[Plan, Optional[list[Optional[int]]]]:
    """The first plan of a worker group, and the per-rank memory caps it respects.

    An explicit ``batch_split`` for this number of workers wins. Otherwise the policy's own
    first plan: equal for ``static``; from the measured ``capacities`` (per rank: α, β,
    largest batch) when every rank has one — throughput at the mean local batch for
    ``proportional``/``dynamic``, the water-filling split of the fitted lines for
    ``optimal`` — else equal.
    """
    if batch_split is not None and len(batch_split) == num_workers:
        return Plan(version, tuple(batch_split), "explicit --batch-split"), None
    measured = None
    caps = None
    if capacities is not None and len(capacities) == num_workers and all(c is not None for c in capacities):
        measured = list(capacities)
        caps = [c.max_batch_size for c in measured]
    if caps is not None and (policy == "static" or sum(c or global_batch_size for c in caps) < global_batch_size):
        caps = None  # an equal split ignores caps; and caps that cannot hold B are no plan at all
    first = make_policy(policy, policy_config, caps=caps).initial_plan(global_batch_size, num_workers, measured)
    return Plan(version, first.local_batch_sizes, first.reason), caps


class Scheduler:
    def __init__(
        self,
        global_batch_size: int,
        policy: str,
        batch_split: Optional[Sequence[int]] = None,
        plan_changes: Optional[Sequence[dict]] = None,
        policy_config: Optional[dict] = None,
        run_dir: Optional[str] = None,
    ):
        """
        Args:
            plan_changes: scripted changes ``{"global_step", "local_batch_sizes"}``, applied
                at the first rebalance point at or after their step (tests and demos).
            run_dir: where the state is kept (see the module docstring); None keeps it in
                memory only.
        """
        self.global_batch_size = global_batch_size
        self.policy = policy
        self.batch_split = list(batch_split) if batch_split else None
        self.policy_config = PolicyConfig(**(policy_config or {}))
        self._plan_changes = sorted(plan_changes or [], key=lambda c: c["global_step"])
        self._node_dicts: list[dict] = []
        self._nodes: list = []
        self._caps: Optional[list[Optional[int]]] = None
        self._awaiting_capabilities = False
        self._plan: Optional[Plan] = None
        self._next_version = 0
        self._state_path = os.path.join(run_dir, SCHEDULER_STATE_FILE) if run_dir else None
        self.restored_from: Optional[str] = None
        self._restore()

    def await_capabilities(self) -> None:
        """Node profiles are on their way: a first plan that would use them waits for them."""
        self._awaiting_capabilities = True
        self._save()

    def set_capabilities(self, nodes: list[dict]) -> None:
        """The profiled nodes (``NodeCapability.to_dict()`` each; none when profiling failed)."""
        self._nodes, self._node_dicts = _parse_nodes(nodes), list(nodes)
        self._awaiting_capabilities = False
        self._save()

    def plan_for(self, num_workers: int, global_step: int = 0,
                 rank_node_ids: Optional[Sequence[str]] = None,
                 rank_device_kinds: Optional[Sequence[str]] = None,
                 rank_fits: Optional[Sequence[Optional[dict]]] = None,
                 wait_for_capabilities: bool = True) -> dict:
        """The plan in force for ``num_workers`` ranks at ``global_step``.

        A new first plan if the number of workers changed: from the ranks' own warm-up
        lines ``rank_fits`` (``{"alpha_s", "beta_s_per_sample"}`` each) when every rank has
        one, else from the profiles of the ranks' devices when their nodes are known; a
        scripted change once its step is reached. The reply also carries ``caps``, the
        per-rank memory caps the plan respects (or None). While profiles are awaited, a
        first plan that would use them is ``{"awaiting": "node profiles"}`` instead (with
        ``wait_for_capabilities=False``: made without them).
        """
        before = (self._plan, len(self._plan_changes))
        while self._plan_changes and self._plan_changes[0]["global_step"] <= global_step:
            change = self._plan_changes.pop(0)
            if len(change["local_batch_sizes"]) == num_workers:
                self._plan = Plan(self._next_version, tuple(change["local_batch_sizes"]),
                                  f"scripted change at step {change['global_step']}")
                self._next_version += 1
        first_plan = self._plan is None or self._plan.num_workers != num_workers
        if first_plan and self._awaiting_capabilities and self._first_plan_uses_capabilities(num_workers):
            if wait_for_capabilities:
                if len(self._plan_changes) != before[1]:
                    self._save()
                return {"awaiting": "node profiles"}
            logger.warning("node profiles still awaited: the first plan for %d workers does without them",
                           num_workers)
        if first_plan:
            capacities = self._capacities(num_workers, rank_node_ids, rank_device_kinds)
            warmed_up = rank_fits is not None and len(rank_fits) == num_workers and all(rank_fits)
            if warmed_up:
                capacities = _from_warm_up(rank_fits, capacities)
            self._plan, self._caps = initial_plan(
                self.policy, self.global_batch_size, num_workers, self._next_version,
                self.batch_split, self.policy_config, capacities,
            )
            if warmed_up and self._plan.reason.startswith(self.policy):  # not an explicit split
                self._plan = Plan(self._plan.version, self._plan.local_batch_sizes,
                                  f"{self._plan.reason}, measured by each rank's warm-up")
            self._next_version = self._plan.version + 1
            logger.info("first plan for %d workers: %s (%s)", num_workers, self._plan, self._plan.reason)
        if (self._plan, len(self._plan_changes)) != before:
            self._save()
        return {**self._plan.to_dict(), "caps": self._caps}

    def _first_plan_uses_capabilities(self, num_workers: int) -> bool:
        """An explicit split and ``static``'s equal one use no profiles (nor caps)."""
        explicit = self.batch_split is not None and len(self.batch_split) == num_workers
        return not explicit and self.policy != "static"

    def _capacities(self, num_workers, rank_node_ids, rank_device_kinds):
        if not self._nodes or rank_node_ids is None or len(rank_node_ids) != num_workers:
            return None
        try:
            return rank_capacities(self._node_dicts, rank_node_ids, rank_device_kinds)
        except ValueError as e:  # inconsistent inputs: plan without measurements
            logger.warning("profiles not usable for the first plan (%s)", e)
            return None

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
        self._save()
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
        self._save()

    def info(self) -> dict:
        """Where it stands (for tests and operators): the plan it serves and where its
        state came from."""
        return {"plan": None if self._plan is None else self._plan.to_dict(), "next_version": self._next_version,
                "caps": self._caps, "num_nodes": len(self._nodes), "restored_from": self.restored_from}

    # ------------------------------------------------------------------ its state on disk
    def state_dict(self) -> dict:
        return {
            "plan": None if self._plan is None else self._plan.to_dict(),
            "next_version": self._next_version,
            "caps": self._caps,
            "nodes": self._node_dicts,
            "plan_changes": self._plan_changes,
            "awaiting_capabilities": self._awaiting_capabilities,
        }

    def load_state_dict(self, state: dict) -> None:
        """Raises (and changes nothing) when ``state`` is not a saved state."""
        plan = Plan.from_dict(state["plan"]) if state.get("plan") else None
        next_version = int(state.get("next_version") or 0)
        nodes = list(state.get("nodes") or [])
        parsed_nodes = _parse_nodes(nodes)
        self._plan, self._next_version = plan, max(next_version, plan.version + 1 if plan else 0)
        self._caps = state.get("caps")
        self._plan_changes = list(state.get("plan_changes") or [])
        self._nodes, self._node_dicts = parsed_nodes, nodes
        self._awaiting_capabilities = bool(state.get("awaiting_capabilities"))

    def _save(self) -> None:
        if self._state_path is None:
            return
        try:
            write_json(self._state_path, self.state_dict())
        except OSError as e:  # training goes on; only a restart of this actor would lose the plan
            logger.warning("scheduler state not saved to %s (%s)", self._state_path, e.strerror or e)

    def _restore(self) -> None:
        """A restart of this actor (or a --resume): continue from the state saved last."""
        if self._state_path is None:
            return
        try:
            state = read_json(self._state_path)
        except (OSError, ValueError) as e:  # start fresh rather than not at all
            logger.warning("scheduler could not read %s (%s); starting fresh", self._state_path, e)
            return
        if not state:
            return
        try:
            self.load_state_dict(state)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            logger.warning("scheduler could not restore %s (%s); starting fresh", self._state_path, e)
            return
        self.restored_from = self._state_path
        logger.warning("scheduler restored from %s: plan %s, next version %d", self._state_path, self._plan,
                       self._next_version)


def _from_warm_up(rank_fits: Sequence[dict], profiled: Optional[Sequence]) -> list:
    """Each rank's warm-up line, with the memory cap its device's profile measured (if any)."""
    caps = [c.max_batch_size if c is not None else None for c in profiled] if profiled else [None] * len(rank_fits)
    return [RankCapacity(float(f["alpha_s"]), float(f["beta_s_per_sample"]), cap) for f, cap in zip(rank_fits, caps)]


def _parse_nodes(nodes: list[dict]) -> list:
    from hetero_ray.profiling.capability import NodeCapability

    return [NodeCapability.from_dict(n) for n in nodes]
