"""Bounded moves: how far one move may take a rank beyond the shares it is known at.

Beyond the shares a rank has run, its busy time is extrapolated, and under a CPU quota the
extrapolation can be wrong for the whole step. A move is sized for that case: the step then
gets at most ``L`` = :data:`MOVE_LOSS_BOUND` longer, until the rollback at its check point:

    b  ≤  cap_i  =  max(b_i, m_i, ⌊ m_i · (1 + L) · max(1, T / (K · t̂_i(m_i))) ⌋)

``b_i``: rank i's share now; ``m_i``: the largest it ran in this worker group that its
current curve does not dispute by more than :data:`DISPUTE_MARGIN`; ``K`` = :data:`BURST_FACTOR`;
``T``: the plan in force's predicted step. A move beyond ``m_i`` is a *trial*, checked after
:data:`TRIAL_CHECK_STEPS` steps; the bounds yield where they alone would keep the global
batch from fitting (:func:`lift_to_hold`). Pure: rows in, caps out.
Why: docs/profiling-and-planning.md#a-move-is-bounded
"""

from __future__ import annotations

import collections
import math
from typing import Optional, Sequence

import numpy as np

from hetero_ray.formatting import format_list
from hetero_ray.planning.cost_model import curve_busy_time_s
from hetero_ray.planning.estimates import Estimates

# L: the most a move may lengthen the step if the shares it extrapolates to run at the worst
# speed the rule allows: a worse move costs at most this much, until its check point.
MOVE_LOSS_BOUND = 0.25
# K: the most a rank's measured speed is assumed to exceed its sustained one (a burst within a
# ⅓-core quota, as Kubernetes CPU limits give); bounds the growth of ranks idle most of the step.
BURST_FACTOR = 3.0
# Steps of a trial before its check: the fewest whose kept mean counts a stall that recurs every
# other step (cost_model.MIN_POINTS_FOR_MEAN; fewer are judged by their median, which misses it).
TRIAL_CHECK_STEPS = 5
# A share whose measured busy time the rank's curve puts more than this much lower is not known
# to the curve (see MeasuredShares.known): beyond the noise of a few steps' mean.
DISPUTE_MARGIN = 0.25
SHARES_KEPT = 8  # per rank, the newest shares it ran
TIMES_KEPT = 8  # per share, its newest busy times


class MeasuredShares:
    """Each rank's busy times at the shares it ran in this worker group (steps, or probes
    while left out), and the caps a move must respect (see the module docstring)."""

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        # per rank: share → its newest busy times, for the newest SHARES_KEPT shares
        self._times: list[dict[int, collections.deque]] = [{} for _ in range(num_workers)]

    def add(self, rows: Sequence[dict]) -> None:
        """Takes step rows of the current worker group (any order, any ranks); a row counts
        when it has a busy time, at its local batch (or its probe, where that is 0)."""
        for row in rows:
            rank, busy = row.get("rank"), row.get("busy_time_s")
            if not isinstance(rank, int) or not 0 <= rank < self.num_workers:
                continue
            if busy is None or not (math.isfinite(busy) and busy > 0):
                continue
            size = int(row.get("local_batch_size") or row.get("probe_batch_size") or 0)
            if size <= 0:
                continue
            times = self._times[rank]
            if size not in times:
                times[size] = collections.deque(maxlen=TIMES_KEPT)
            else:
                times[size] = times.pop(size)  # the newest share last
            times[size].append(float(busy))
            while len(times) > SHARES_KEPT:
                del times[next(iter(times))]

    def known(self, estimates: Optional[Estimates]) -> tuple[int, ...]:
        """Per rank, ``m_i``: the largest share it ran whose busy time the rank's curve does
        not put more than :data:`DISPUTE_MARGIN` lower (0: none). A share the curve has
        forgotten (a quota's throttled steps, before the rank fell back into its burst and
        the estimates took that for a speed change) is no ground to extrapolate from."""
        if estimates is None or len(estimates) != self.num_workers:
            return (0,) * self.num_workers
        known = []
        for rank, times in enumerate(self._times):
            a, b, f = (float(x[rank]) for x in (estimates.alpha_s, estimates.beta_s_per_sample, estimates.floor_s))
            # the plain mean: a quota's stalls that recur count in full (a spike in TIMES_KEPT, an eighth)
            agreed = [size for size, t in times.items()
                      if sum(t) / len(t) <= (1.0 + DISPUTE_MARGIN) * float(curve_busy_time_s(a, b, f, size))]
            known.append(max(agreed, default=0))
        return tuple(known)

    def beyond(self, sizes: Sequence[int], estimates: Optional[Estimates]) -> tuple[int, ...]:
        """The ranks ``sizes`` gives more than they are known at (a trial's ranks)."""
        return tuple(r for r, (b, m) in enumerate(zip(sizes, self.known(estimates))) if b > m)

    def caps(self, sizes: Sequence[int], estimates: Optional[Estimates]) -> list[Optional[int]]:
        """Per rank, the largest share a move from ``sizes`` may give it (None: no cap)."""
        caps: list[Optional[int]] = [None] * self.num_workers
        if estimates is None or len(estimates) != self.num_workers:
            return caps
        known_sizes = self.known(estimates)
        b_now = np.asarray(sizes, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            at_now = curve_busy_time_s(estimates.alpha_s, estimates.beta_s_per_sample, estimates.floor_s, b_now)
            at_known = curve_busy_time_s(estimates.alpha_s, estimates.beta_s_per_sample, estimates.floor_s,
                                         np.asarray(known_sizes, dtype=np.float64))
        usable = estimates.fresh & np.isfinite(at_now) & (at_now > 0)
        counted = usable & (b_now > 0)
        if not counted.any():
            return caps
        step_s = float(np.max(at_now[counted]))  # T: the plan in force's predicted step
        for rank in range(self.num_workers):
            m, t_m = known_sizes[rank], float(at_known[rank])
            if not usable[rank] or not self._times[rank]:
                continue  # no estimate to act on (the policy keeps its share), or never measured
            if not (m > 0 and math.isfinite(t_m) and t_m > 0):
                caps[rank] = int(sizes[rank])  # its curve disputes every share it ran: no growth
                continue
            room = (1.0 + MOVE_LOSS_BOUND) * max(1.0, step_s / (BURST_FACTOR * t_m))
            if math.isfinite(room):
                caps[rank] = max(int(sizes[rank]), m, math.floor(m * room))
        return caps

    def describe(self, caps: Sequence[Optional[int]], sizes: Sequence[int], estimates: Optional[Estimates]) -> str:
        """The caps a plan with these shares meets, in words for a decision's reason ('' when
        none)."""
        known_sizes = self.known(estimates)
        parts = [f"rank {rank} ≤ {cap} (known at ≤ {known_sizes[rank]})"
                 for rank, cap in enumerate(caps) if cap is not None and sizes[rank] >= cap > known_sizes[rank]]
        if not parts:
            return ""
        return "bounded move: " + format_list(parts)


def lift_to_hold(move_caps: Sequence[Optional[int]], hard_caps: Sequence[Optional[int]],
                 total: int) -> tuple[list[Optional[int]], float]:
    """The move caps raised by the least common factor that lets the ranks hold ``total``
    samples within them and the hard caps (memory, rollbacks, CPU quotas; None: no cap), and
    that factor (1.0: they held it already, or the hard caps alone cannot). A bound on a
    move must not keep a plan the hard caps rule out, such as equal shares where a quota
    caps the slow rank far below its share."""
    def held(factor: float) -> list[Optional[int]]:
        return [None if m is None else max(m, math.floor(m * factor)) for m in move_caps]

    def fits(caps: Sequence[Optional[int]]) -> bool:
        tight = [tighter(m, h) for m, h in zip(caps, hard_caps)]
        return any(c is None for c in tight) or sum(tight) >= total

    if total <= 0 or fits(move_caps):
        return list(move_caps), 1.0
    high = float(total)  # every capped rank at ≥ total: fits unless the hard caps alone cannot
    if not fits(held(high)):
        return list(move_caps), 1.0
    low = 1.0
    for _ in range(40):  # the least factor, to within 2**-40 of the range
        middle = (low + high) / 2
        low, high = (low, middle) if fits(held(middle)) else (middle, high)
    return held(high), high


def tighter(a: Optional[int], b: Optional[int]) -> Optional[int]:
    """The smaller of two caps; None is no cap."""
    return b if a is None else a if b is None else min(a, b)
