"""The planner: the one place that decides which plan is in force, first and later.

It owns the run's one policy instance, the plan in force and the version counter, the
scripted plan changes still to come, the memory caps, the node profiles, the balancer
(estimates from the step records, decisions at rebalance points) and where the run ends.
Rank 0 asks it for the plan (:meth:`Planner.plan_for`) at every rebalance point; the
workers' step records feed it (:meth:`Planner.add_steps`). A worker group's first plan comes
from the measurements there are (:meth:`Planner.plan_for` says which); later plans are the
balancer's (:mod:`hetero_ray.planning.balancer`), within the same caps, each numbered here
(versions only increase). Plain class, no Ray, no files: the actor that holds it
(:mod:`hetero_ray.runtime.planner_actor`) keeps its state on disk.
Which first plan, and why: docs/profiling-and-planning.md#one-planner
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence, Union

from hetero_ray.planning.balancer import Balancer
from hetero_ray.planning.balancer_state import DecisionState, Proposal
from hetero_ray.planning.capacity import (
    RankCapacity, core_capacities, rank_capacities, rank_memory_caps,
)
from hetero_ray.planning.comm import CommEstimates
from hetero_ray.planning.decision import PolicyConfig
from hetero_ray.planning.feed_trial import DEFAULT_WINDOW_STEPS, FeedTrial, feed_candidates, ranks_words
from hetero_ray.planning.plan import Plan
from hetero_ray.planning.policies import make_policy, register_policy
from hetero_ray.planning.rank_facts import NO_FACTS, RankFacts

logger = logging.getLogger(__name__)


class Planner:
    """Args:
        global_batch_size: ``B``, the same for every plan.
        policy: a registered policy's name (:func:`hetero_ray.planning.policies.policy_names`),
            or its class: the driver hands the class, which Ray pickles, so that a policy
            registered in the user's script is known in this actor's process too.
        rebalance_interval: steps between rebalance points.
        batch_split: an explicit first plan (it wins for its number of workers).
        plan_changes: scripted changes ``{"global_step", "local_batch_sizes"}``, applied at
            the first rebalance point at or after their step (tests and demos).
        policy_config: keyword arguments of :class:`PolicyConfig`.
        feed_trial: ``"off"``; ``"auto"``: a feeding trial of the ranks on nodes apart from
            rank 0's (the CPU ranks, beside GPU ranks); ``"on"``: also of the ranks on rank
            0's node (planning/feed_trial.py).
        feed_trial_steps: the steps each of the trial's two windows measures.
        allreduce_s: the all-reduce of every rank together, where it is known before any
            step (``hetero-ray plan --allreduce-ms``): first plans of a policy that weighs
            communication use it. A run learns it from its steps instead.
    """

    def __init__(self, global_batch_size: int, policy: Union[str, type], rebalance_interval: int,
                 batch_split: Optional[Sequence[int]] = None, plan_changes: Optional[Sequence[dict]] = None,
                 policy_config: Optional[dict] = None, feed_trial: str = "off",
                 feed_trial_steps: int = DEFAULT_WINDOW_STEPS, allreduce_s: Optional[float] = None):
        if feed_trial not in ("off", "auto", "on"):
            raise ValueError(f"feed_trial must be 'off', 'auto' or 'on', got {feed_trial!r}")
        self._feed_trial, self._feed_trial_steps = feed_trial, int(feed_trial_steps)
        self._allreduce_s = allreduce_s
        self.global_batch_size = global_batch_size
        self.batch_split = list(batch_split) if batch_split else None
        if isinstance(policy, type):
            policy = register_policy(policy).name
        self.policy = make_policy(policy, PolicyConfig(**(policy_config or {})))
        self._caps: Optional[list[Optional[int]]] = None  # what bounds every plan: see `caps`
        self.balancer = Balancer(self.policy, rebalance_interval, global_batch_size=global_batch_size,
                                 memory_caps=lambda: self._caps)
        self._plan_changes = sorted(plan_changes or [], key=lambda c: c["global_step"])
        self._nodes: list[dict] = []
        self._placement: Optional[tuple[list[str], Optional[list[str]]]] = None  # the first plan's ranks: nodes, kinds
        self._awaiting_capabilities = False
        self._first_plan_from_cores = False
        self._launch_id: Optional[str] = None  # the fit() whose first-plan source is in force
        self._plan: Optional[Plan] = None
        self._next_version = 0
        self._attempt: Optional[dict] = None  # the worker group the balancer serves (begin_attempt's arguments)
        self._memory_caps: Optional[list[Optional[int]]] = None  # the group's, from the node profiles
        self._micro_batches = False  # the loop trains shares past the caps in micro-batches

    @property
    def caps(self) -> Optional[list[Optional[int]]]:
        """The per-rank caps every plan respects (None: none): the memory caps, unless the
        loop trains past them in micro-batches."""
        return self._caps

    @property
    def memory_caps(self) -> Optional[list[Optional[int]]]:
        """Each rank's memory cap in this group (None: none known), bounding shares or not."""
        return self._memory_caps

    # ------------------------------------------------------------------ node profiles
    def start_launch(self, launch_id: str, first_plan: Optional[str]) -> None:
        """A driver's ``fit()`` (``launch_id``) says where its first plans come from:
        ``"profiles"`` (:meth:`await_capabilities`), ``"cores"`` (:meth:`first_plan_from_cores`)
        or None (profiles handed over before the first step, or none). Once per launch: a
        planner restarted within it keeps what its saved state says (profiles that came)."""
        if first_plan not in ("profiles", "cores", None):
            raise ValueError(f"first_plan must be 'profiles', 'cores' or None, got {first_plan!r}")
        if launch_id == self._launch_id:
            return
        self._launch_id = launch_id
        self._awaiting_capabilities = first_plan == "profiles"
        self._first_plan_from_cores = first_plan == "cores"

    def await_capabilities(self) -> None:
        """Node profiles are on their way: a first plan that would use them waits for them."""
        self._awaiting_capabilities = True

    def first_plan_from_cores(self) -> None:
        """No node profiles will come (several CPU-only nodes, where a profile costs a
        CPU-bound node its start): a first plan shares the batch by the CPU cores each rank
        can use, within its cgroup quota (:func:`~hetero_ray.planning.capacity.core_capacities`)."""
        self._first_plan_from_cores = True

    def set_capabilities(self, nodes: list[dict]) -> None:
        """Profiled nodes (``NodeCapability.to_dict()`` each; none when profiling failed): they
        join those profiled before (a node profiled again replaces its earlier profile). A
        rank of the group in force with no memory cap gets its device's, if one came."""
        fresh = {n.get("node_id") for n in nodes}
        self._nodes = [n for n in self._nodes if n.get("node_id") not in fresh] + list(nodes)
        self._awaiting_capabilities = False
        if nodes:
            self._caps_from_late_profiles()

    # ------------------------------------------------------------------ rank 0
    def plan_for(self, num_workers: int, global_step: int = 0, ranks: RankFacts = NO_FACTS, *,
                 wait_for_capabilities: bool = True, micro_batches: bool = False) -> dict:
        """The plan in force for ``num_workers`` ranks at ``global_step`` (``Plan.to_dict()``,
        with ``memory_caps`` when some are known).

        A new first plan if the number of workers changed, from what ``ranks`` says of the
        group: the ranks' own warm-up lines (``fits``) when every rank has one, else the
        profiles of the ranks' devices when their nodes are known, else (after
        :meth:`first_plan_from_cores`) the CPU cores each rank can use; a scripted change once its step
        is reached. While profiles are awaited, a first plan
        that would use them is ``{"awaiting": "node profiles"}`` instead (with
        ``wait_for_capabilities=False``: made without them). ``micro_batches``: the loop
        trains shares past the memory caps in micro-batches; the caps stop bounding shares
        from this plan on, for the rest of the run.
        """
        if micro_batches and not self._micro_batches:
            self._micro_batches = True
            self._caps = None  # the planner's caps are the memory caps (the balancer adds its own)
            logger.info("the loop trains shares past the memory caps in micro-batches: shares are bounded by "
                        "time alone from here on")
        while self._plan_changes and self._plan_changes[0]["global_step"] <= global_step:
            change = self._plan_changes.pop(0)
            if len(change["local_batch_sizes"]) == num_workers:
                self._plan = Plan(self._next_version, tuple(change["local_batch_sizes"]),
                                  f"scripted change at step {change['global_step']}")
                self._next_version += 1
        first_plan = self._plan is None or self._plan.num_workers != num_workers
        if first_plan and self._awaiting_capabilities and self._first_plan_uses_capabilities(num_workers):
            if wait_for_capabilities:
                return {"awaiting": "node profiles"}
            logger.warning("node profiles still awaited: the first plan for %d workers does without them",
                           num_workers)
        if first_plan:
            self._placement = (None if not ranks.placed(num_workers) else
                               (list(ranks.node_ids), None if ranks.device_kinds is None else list(ranks.device_kinds)))
            self._plan = self._first_plan(num_workers, ranks)
            self._next_version = self._plan.version + 1
            self._start_feed_trial(num_workers, ranks)
            logger.info("first plan for %d workers: %s (%s)", num_workers, self._plan, self._plan.reason)
        reply = self._plan.to_dict()
        if self._memory_caps is not None and len(self._memory_caps) == self._plan.num_workers:
            reply["memory_caps"] = list(self._memory_caps)
        return reply

    def _start_feed_trial(self, num_workers: int, ranks: RankFacts) -> None:
        """The group's feeding trial, when the run has one and its ranks give candidates."""
        if self._feed_trial == "off" or not ranks.placed(num_workers):
            return
        candidates = feed_candidates(ranks.node_ids, ranks.device_kinds, same_node=self._feed_trial == "on")
        if not candidates:
            logger.info("no feeding trial: no rank beside rank 0 has CPUs of its own to give the pipeline")
            return
        words = ranks_words(candidates, ranks.device_kinds)
        self.balancer.feed_trial = FeedTrial(candidates, words, self._feed_trial_steps)
        logger.info("feeding trial of %s once the plan settles (%d steps training, %d left out)", words,
                    self._feed_trial_steps, self._feed_trial_steps)

    def resume_from(self, plan: dict) -> None:
        """A worker group restored a checkpoint holding ``plan``.

        A planner that lived through the failure keeps its own (newer or equal) plan; a new
        one (the driver was restarted with --resume) adopts the checkpoint's, so plan
        versions keep increasing across the whole run.
        """
        restored = Plan.from_dict(plan)
        self._next_version = max(self._next_version, restored.version + 1)
        if self._plan is None:
            self._plan = restored

    def begin_attempt(self, attempt: int, num_workers: int, start_global_step: int,
                      end_global_step: Optional[int] = None) -> None:
        """A worker group starts at ``start_global_step`` (after its first plan);
        ``end_global_step``: where the run ends (no plan is adopted for a point at or after
        it), None when unknown."""
        self._attempt = {"attempt": attempt, "num_workers": num_workers, "start_global_step": start_global_step,
                         "end_global_step": end_global_step}
        self.balancer.begin_attempt(attempt, num_workers, start_global_step, end_global_step)

    # ------------------------------------------------------------------ step records
    def add_steps(self, rows: list[dict], now: Optional[float] = None) -> list[dict]:
        """A batch of step records; returns the decision rows they completed (for the
        ``decisions`` table). Shares the balancer adopts are numbered here and are the plan
        in force from here on; their decision row records the version they were given."""
        output = self.balancer.add_steps(rows, now)
        for proposal in output.new_plans:
            self._adopt(proposal)
        return output.decision_rows

    def close(self) -> list[dict]:
        """End of the run: decision rows still waiting for their outcome."""
        return self.balancer.flush()

    def _adopt(self, proposal: Proposal) -> None:
        """The balancer's shares become the plan in force, numbered by the one counter (the
        workers may still run an older plan: a scripted change or a resume may have come
        between the records the balancer decided on and this adoption)."""
        total = sum(proposal.local_batch_sizes)
        if total != self.global_batch_size:
            raise ValueError(f"shares {list(proposal.local_batch_sizes)} sum to {total}, the run's global batch "
                             f"is {self.global_batch_size}")
        self._plan = proposal.numbered(self._next_version)
        self._next_version += 1

    # ------------------------------------------------------------------ the first plan
    def _first_plan(self, num_workers: int, ranks: RankFacts) -> Plan:
        """Explicit split, else the policy's first plan from the measurements there are;
        sets the caps every later plan of this group respects."""
        rank_node_ids, rank_device_kinds, rank_fits, rank_cpus = ranks.node_ids, ranks.device_kinds, ranks.fits, \
            ranks.cpus
        version = self._next_version
        self.balancer.seed_shapes(None)  # the curves this plan is made from, if any (below)
        self._memory_caps = self._group_memory_caps(num_workers, rank_node_ids, rank_device_kinds)
        if self.batch_split is not None and len(self.batch_split) == num_workers:
            self._caps = None
            return Plan(version, tuple(self.batch_split), "explicit --batch-split")
        capacities = self._capacities(num_workers, rank_node_ids, rank_device_kinds)
        fits = list(rank_fits) if rank_fits is not None and len(rank_fits) == num_workers else [None] * num_workers
        warmed_up = all(fits)
        # Under emulated speeds every rank's own line (the profiles know no emulation). Beside
        # GPU ranks, a CPU rank's own line: its node is profiled after the first plan, beside
        # training, which makes it look slower than it is. Else a rank's own line only where
        # its node's profile has none for its device.
        beside_gpus = [rank_device_kinds is not None and "gpu" in rank_device_kinds and kind == "cpu"
                       for kind in (rank_device_kinds or [None] * num_workers)]
        own = [bool(f) and (warmed_up or beside_gpus[r] or capacities is None or capacities[r] is None)
               for r, f in enumerate(fits)]
        if any(own):
            capacities = _from_warm_up([f if o else None for f, o in zip(fits, own)], capacities)
        self.balancer.seed_shapes(None if capacities is None else
                                  [None if c is None else (c.alpha_s, c.beta_s_per_sample, c.floor_s)
                                   for c in capacities])
        measured = capacities if capacities is not None and all(c is not None for c in capacities) else None
        if measured is None and self._first_plan_from_cores and rank_cpus is not None and rank_device_kinds:
            by_cores = core_capacities(rank_node_ids, rank_device_kinds, rank_cpus)
            if by_cores is not None:
                self._caps = None  # no profile measured any
                first = self.policy.initial_plan(self.global_batch_size, num_workers, by_cores, caps=self._caps)
                cores = ", ".join(f"{1 / c.beta_s_per_sample:.2g}" for c in by_cores)
                return Plan(version, first.local_batch_sizes, f"{self.policy.name}: shares by the CPU cores each "
                            f"rank can use ({cores}), before any step is timed")
        caps = None if measured is None else [c.max_batch_size for c in measured]
        if caps is not None and (not self.policy.uses_capabilities
                                 or sum(c or self.global_batch_size for c in caps) < self.global_batch_size):
            caps = None  # an equal split ignores caps; and caps that cannot hold B are no plan at all
        if self._micro_batches:
            caps = None  # a share past its rank's cap is trained in micro-batches
        self._caps = caps
        first = self.policy.initial_plan(self.global_batch_size, num_workers, measured, caps=self._caps,
                                         **self._known_comm(num_workers, measured))
        # what measured the curves follows the policy's own words, before any note ("; …")
        reason, sep, notes = first.reason.partition("; ")
        if measured is not None and warmed_up:
            reason = f"{reason}, measured by each rank's warm-up"
        elif measured is not None and any(own):
            ranks = ", ".join(str(rank) for rank, o in enumerate(own) if o)
            reason = f"{reason}, rank(s) {ranks} measured by their own warm-up, the others by their node profiles"
        reason += sep + notes
        return Plan(version, first.local_batch_sizes, reason)

    def _known_comm(self, num_workers: int, measured) -> dict:
        """A first plan's all-reduce, where it is known before any step and the policy weighs it."""
        if self._allreduce_s is None or measured is None or not self.policy.weighs_communication:
            return {}
        return {"comm_cost_s": CommEstimates.of_every_rank(num_workers, self._allreduce_s).cost_s}

    def _caps_from_late_profiles(self) -> None:
        """Profiles that came after the first plan of the group in force (the CPU-only nodes
        of a GPU cluster): a rank without a memory cap gets its device's, where the caps can
        still hold the global batch. An explicit split and ``static`` use no caps."""
        if self._plan is None or self._placement is None or not self.policy.uses_capabilities or self._micro_batches:
            return  # (with micro-batches a share past a cap is cut, not held)
        node_ids, kinds = self._placement
        if len(node_ids) != self._plan.num_workers or (
                self.batch_split is not None and len(self.batch_split) == self._plan.num_workers):
            return
        try:
            profiled = rank_memory_caps(self._nodes, node_ids, kinds)
        except ValueError:
            return
        caps = [c if c is not None else p for c, p in zip(self.caps or [None] * len(node_ids), profiled)]
        if caps != (self.caps or [None] * len(node_ids)) and sum(c or self.global_batch_size for c in caps) \
                >= self.global_batch_size:
            logger.info("memory caps from profiles that came after the first plan: %s", caps)
            self._caps = caps

    def _first_plan_uses_capabilities(self, num_workers: int) -> bool:
        """An explicit split and ``static``'s equal one use no profiles (nor caps)."""
        explicit = self.batch_split is not None and len(self.batch_split) == num_workers
        return not explicit and self.policy.uses_capabilities

    def _group_memory_caps(self, num_workers, rank_node_ids, rank_device_kinds) -> Optional[list[Optional[int]]]:
        """The ranks' memory caps by the one rule (planning/capacity.py); None: none known."""
        if not self._nodes or rank_node_ids is None or len(rank_node_ids) != num_workers:
            return None
        try:
            caps = rank_memory_caps(self._nodes, rank_node_ids, rank_device_kinds)
        except ValueError:  # inconsistent inputs: _capacities says so
            return None
        return caps if any(c is not None for c in caps) else None

    def _capacities(self, num_workers, rank_node_ids, rank_device_kinds) -> Optional[list[Optional[RankCapacity]]]:
        if not self._nodes or rank_node_ids is None or len(rank_node_ids) != num_workers:
            return None
        try:
            return rank_capacities(self._nodes, rank_node_ids, rank_device_kinds)
        except ValueError as e:  # inconsistent inputs: plan without measurements
            logger.warning("profiles not usable for the first plan (%s)", e)
            return None

    # ------------------------------------------------------------------ state
    def info(self) -> dict:
        """Where it stands (for tests, operators and the dashboard)."""
        return {"plan": None if self._plan is None else self._plan.to_dict(), "next_version": self._next_version,
                "policy": self.policy.name, "caps": self.caps, "memory_caps": self._memory_caps,
                "micro_batches": self._micro_batches, "num_nodes": len(self._nodes),
                "attempt": self.balancer.attempt, "num_workers": self.balancer.num_workers,
                "end_global_step": self.balancer.end_global_step}

    def state_dict(self) -> dict:
        """Everything but the estimates (those travel with the checkpoints:
        :meth:`checkpoint_state`); JSON-safe."""
        return {
            "plan": None if self._plan is None else self._plan.to_dict(),
            "next_version": self._next_version,
            "caps": self.caps,
            "memory_caps": self._memory_caps,
            "micro_batches": self._micro_batches,
            "nodes": self._nodes,
            "plan_changes": self._plan_changes,
            "awaiting_capabilities": self._awaiting_capabilities,
            "first_plan_from_cores": self._first_plan_from_cores,
            "launch_id": self._launch_id,
            "placement": None if self._placement is None else list(self._placement),
            "attempt": self._attempt,
            "decision": self.balancer.decision_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continues from a saved :meth:`state_dict` (after :meth:`load_checkpoint_state`,
        whose estimates the saved worker group keeps). Raises (and changes nothing) when
        ``state`` is not a saved state."""
        plan = Plan.from_dict(state["plan"]) if state.get("plan") else None
        next_version = max(int(state.get("next_version") or 0), plan.version + 1 if plan else 0)
        caps = _caps(state.get("caps"))
        memory_caps = _caps(state.get("memory_caps"))
        nodes = [dict(n) for n in state.get("nodes") or []]
        plan_changes = [dict(c) for c in state.get("plan_changes") or []]
        attempt = state.get("attempt")
        if attempt is not None:
            attempt = {"attempt": int(attempt["attempt"]), "num_workers": int(attempt["num_workers"]),
                       "start_global_step": int(attempt["start_global_step"]),
                       "end_global_step": attempt.get("end_global_step")}
        decision = None if attempt is None else DecisionState.from_dict(state.get("decision") or {},
                                                                        attempt["num_workers"])
        placement = state.get("placement")
        placement = None if not placement else (
            [str(n) for n in placement[0]], None if placement[1] is None else [str(k) for k in placement[1]])
        self._plan, self._next_version, self._caps = plan, next_version, caps
        self._memory_caps, self._micro_batches = memory_caps, bool(state.get("micro_batches"))
        self._nodes, self._plan_changes = nodes, plan_changes
        self._awaiting_capabilities = bool(state.get("awaiting_capabilities"))
        self._first_plan_from_cores = bool(state.get("first_plan_from_cores"))
        self._launch_id = state.get("launch_id")
        self._placement = placement
        if attempt is not None:
            self.begin_attempt(**attempt)
            self.balancer.load_decision_state(decision)

    def checkpoint_state(self) -> dict:
        """What a checkpoint carries: the estimates and the policy's state."""
        return self.balancer.state_dict()

    def load_checkpoint_state(self, state: dict) -> None:
        self.balancer.load_state_dict(state)


def _caps(saved) -> Optional[list[Optional[int]]]:
    return None if saved is None else [None if c is None else int(c) for c in saved]


def _from_warm_up(rank_fits: Sequence[Optional[dict]], profiled: Optional[Sequence]) -> list[Optional[RankCapacity]]:
    """Each rank's warm-up line where it has one (with the memory cap its device's profile
    measured, if any), else its profiled line (None: neither)."""
    profiled = list(profiled) if profiled else [None] * len(rank_fits)
    return [RankCapacity(float(f["alpha_s"]), float(f["beta_s_per_sample"]), None if p is None else p.max_batch_size,
                         float(f.get("floor_s") or 0.0)) if f else p
            for f, p in zip(rank_fits, profiled)]
