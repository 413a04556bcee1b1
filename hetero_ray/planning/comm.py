"""The step's communication ``c(G)``: the gradient all-reduce of the ranks in the plan.

A step under a plan whose ranks in are ``G`` takes ``T = max_{i∈G} t_i(b_i) + c(G)``
(:mod:`hetero_ray.planning.subset`). ``c`` is learned online per group of ranks in (the
ranks themselves, not their number): a step's all-reduce is the least ``wait_time_s`` of
its ranks in, a group's level the median of its last :data:`WINDOW_STEPS` steps. A group
never run yet is scaled from the measured group nearest in size (the larger on a tie) by a
ring all-reduce's hops:

    c(G) ≈ c(H) · (|G| − 1) / (|H| − 1)

One rank alone costs nothing, and before any group is measured ``c`` is 0 everywhere (the
compute-only plan). Plain Python, no Ray.
Why: docs/profiling-and-planning.md#communication-and-ranks-left-out
"""

from __future__ import annotations

import collections
import math
import statistics
from typing import Iterable, Mapping, Optional

WINDOW_STEPS = 16  # per group: a median of the latest steps, robust to a slow one
MIN_STEPS = 3  # a median of 3 already ignores one spike


class CommEstimates:
    """Per group of ranks in, the all-reduce time of its recent steps."""

    def __init__(self, window_steps: int = WINDOW_STEPS, min_steps: int = MIN_STEPS):
        if not isinstance(window_steps, int) or window_steps < 1:
            raise ValueError(f"window_steps must be a positive integer, got {window_steps!r}")
        if not isinstance(min_steps, int) or not 1 <= min_steps <= window_steps:
            raise ValueError(f"min_steps must be an integer in [1, window_steps={window_steps}], got {min_steps!r}")
        self.window_steps = window_steps
        self.min_steps = min_steps
        self._times_s: dict[tuple[int, ...], collections.deque] = {}

    @classmethod
    def of_every_rank(cls, num_ranks: int, allreduce_s: float) -> "CommEstimates":
        """Estimates that hold one measurement, every rank together (an all-reduce known
        before any step: ``hetero-ray plan --allreduce-ms``); a smaller group is scaled from
        it by a ring's hops, as the balancer's first guess is."""
        comm = cls(window_steps=1, min_steps=1)
        comm.add(range(num_ranks), allreduce_s)
        return comm

    def add(self, group: Iterable[int], comm_time_s: Optional[float]) -> None:
        """One step of ``group`` (its ranks in) and its all-reduce time; a missing, NaN or
        negative time is ignored (a record without the hook's timing)."""
        if comm_time_s is None or not math.isfinite(comm_time_s) or comm_time_s < 0:
            return
        key = tuple(sorted(int(r) for r in group))
        if len(key) <= 1:
            return  # nothing to learn: no all-reduce
        window = self._times_s.setdefault(key, collections.deque(maxlen=self.window_steps))
        window.append(float(comm_time_s))

    def measured(self) -> dict[tuple[int, ...], float]:
        """The level of every group with enough steps."""
        return {g: statistics.median(w) for g, w in self._times_s.items() if len(w) >= self.min_steps}

    def cost_s(self, group: Iterable[int]) -> float:
        """``c(G)`` in seconds: measured, else scaled from the nearest measured size (see above)."""
        key = tuple(sorted(int(r) for r in group))
        k = len(key)
        if k <= 1:
            return 0.0
        measured = self.measured()
        if key in measured:
            return measured[key]
        if not measured:
            return 0.0
        nearest = min(measured, key=lambda g: (abs(len(g) - k), -len(g)))
        return measured[nearest] * (k - 1) / (len(nearest) - 1)

    def describe(self, group: Iterable[int]) -> str:
        """``c(G)`` in words, with where it comes from (for a decision's reason)."""
        key = tuple(sorted(int(r) for r in group))
        how = ("none: one rank" if len(key) <= 1 else "measured" if key in self.measured()
               else "scaled from another group" if self.measured() else "not measured yet")
        return f"{self.cost_s(key) * 1e3:.2f} ms ({how})"

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        return {"groups": [[list(g), list(w)] for g, w in self._times_s.items()]}

    def load_state_dict(self, state: Mapping) -> None:
        self._times_s = {}
        for group, times in state.get("groups") or []:
            for t in times:
                self.add(group, t)
