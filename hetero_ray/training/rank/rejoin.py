"""Ranks left out and brought back: the groups of the ranks in, and the state a rank
receives when it rejoins.

A plan that leaves ranks out (``b_i = 0``) all-reduces over a process group of the ranks in
only. ``torch.distributed.new_group`` must be called by every rank, in the same order, for
every group; so every rank makes the group of each plan right after agreeing on it
(:meth:`Groups.for_plan`, inside the agreed plan protocol), and keeps it while a plan in
force or agreed ahead has those ranks in. Then it is destroyed (a gloo group holds sockets
and threads; a long run meets many sets of ranks), and made again by a later plan that
needs it.

A rank left out skips the gradient all-reduce (its hook returns a zero gradient), yet the
user's loop still runs its optimiser step: momentum, weight decay and Adam's moments move
its parameters away from the group's. Nothing of that survives: at the step a plan brings
ranks back, before its forward pass, every rank receives rank 0's whole training state
(:mod:`hetero_ray.training.rank.replica_state`), in a collective of all ranks at the same step,
like the plan's own.
"""

from __future__ import annotations

from typing import Optional

import torch.distributed as dist

from hetero_ray.planning.plan import Plan


class Groups:
    """The process group of each set of ranks in, made by all ranks together, and
    destroyed once no plan that can still run has those ranks in.

    The plans that can still run, at an agreement: the one of this rank's last step
    handed out (the loader asks :meth:`of` at every step, in step order) and every plan
    agreed after it. All ranks agree at the same step, having handed out the same steps,
    so they destroy the same groups in the same order and make the same ones again
    (``new_group`` is called by every rank in the same order). ``destroy_process_group``
    of a subgroup is local in torch's code (a non-member's call does nothing); a gloo
    group's sockets and threads go with the last reference to it. Without a prepared
    model the loader never asks, and every group is kept.
    """

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self._groups: dict[tuple[int, ...], Optional[dist.ProcessGroup]] = {}
        # The ranks in of each plan agreed, from the one of the last step handed out on.
        self._runnable: list[tuple[int, ...]] = []

    def for_plan(self, plan: Plan) -> None:
        """Collective (every rank, the same plans in the same order): makes the group of
        ``plan``'s ranks in unless it exists (every rank in: the default group), and
        destroys the groups of ranks no plan that can still run has in."""
        ranks = plan.in_ranks
        self._runnable.append(ranks)
        for unused in [r for r in self._groups if r not in self._runnable]:
            dist.destroy_process_group(self._groups.pop(unused))  # a non-member's is a no-op
        if ranks in self._groups or len(ranks) == self.num_workers:
            return
        self._groups[ranks] = dist.new_group(list(ranks))

    def of(self, plan: Plan) -> Optional[dist.ProcessGroup]:
        """The group of ``plan``'s ranks in (None: every rank); made by :meth:`for_plan`.

        Asked for the plan of each step handed out: the plans agreed before it no longer run.
        """
        ranks = plan.in_ranks
        # From the first plan with these ranks on: which of several runs now is not known
        # here, and keeping the earlier ones alive too is safe.
        if ranks in self._runnable:
            del self._runnable[:self._runnable.index(ranks)]
        if len(ranks) == self.num_workers:
            return None
        if ranks not in self._groups:
            raise RuntimeError(f"no process group for ranks {list(ranks)}: every plan's group is made when the ranks "
                               "agree on it")
        return self._groups[ranks]
