"""Ranks left out and brought back: the groups of the ranks in, and the state a rank
receives when it rejoins.

A plan that leaves ranks out (``b_i = 0``) all-reduces over a process group of the ranks in
only. ``torch.distributed.new_group`` must be called by every rank, in the same order, for
every group; so every rank makes the group of each plan right after agreeing on it
(:meth:`Groups.for_plan`, inside the agreed plan protocol), and keeps it for the next plan
with the same ranks in.

A rank left out skips the gradient all-reduce (its hook returns a zero gradient), yet the
user's loop still runs its optimiser step: momentum, weight decay and Adam's moments move
its parameters away from the group's. Nothing of that survives: at the step a plan brings
ranks back, before its forward pass, every rank receives rank 0's whole training state
(:mod:`hetero_ray.training.replica_state`), in a collective of all ranks at the same step,
like the plan's own.
"""

from __future__ import annotations

from typing import Optional

import torch.distributed as dist

from hetero_ray.planning.plan import Plan


class Groups:
    """The process group of each set of ranks in, made once by all ranks together."""

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self._groups: dict[tuple[int, ...], Optional[dist.ProcessGroup]] = {}

    def for_plan(self, plan: Plan) -> None:
        """Collective (every rank, the same plans in the same order): makes the group of
        ``plan``'s ranks in unless it exists. Every rank in: the default group."""
        ranks = plan.in_ranks
        if ranks in self._groups or len(ranks) == self.num_workers:
            return
        self._groups[ranks] = dist.new_group(list(ranks))

    def of(self, plan: Plan) -> Optional[dist.ProcessGroup]:
        """The group of ``plan``'s ranks in (None: every rank); made by :meth:`for_plan`."""
        ranks = plan.in_ranks
        if len(ranks) == self.num_workers:
            return None
        if ranks not in self._groups:
            raise RuntimeError(f"no process group for ranks {list(ranks)}: every plan's group is made when the ranks "
                               "agree on it")
        return self._groups[ranks]
