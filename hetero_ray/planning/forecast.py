"""How far a rank's measured level moves from one decision to the next: the noise margin's
standard error, measured instead of assumed.

A rank's speed may wander for tens of steps, far beyond its window's standard error; only
successive decisions tell a wander from a lasting difference. So for each rank at the same
local batch size as at the previous decision, its level's change less the ranks' median,

    e_i = ln(m_i,now / m_i,before) − median_j ln(m_j,now / m_j,before)

is kept for the last :data:`HISTORY_DECISIONS` decisions, pooled over ranks, and their
robust standard deviation, ``se_forecast = 1.4826 · median |e| / √2`` (an ``e`` holds two
levels' errors), is how far a rank's level will lie from today's at the next decision.
Plain Python, no Ray; its state is JSON-safe (the policy's checkpoint holds it).
Why: docs/profiling-and-planning.md#the-bar-a-new-plan-must-clear
"""

from __future__ import annotations

import collections
import math
from typing import Optional

import numpy as np

from hetero_ray.planning.estimates import DEFAULT_WINDOW_STEPS, Estimates

HISTORY_DECISIONS = 8  # the machine's wander changes slowly; 8 decisions are 160 steps at interval 20
MIN_CHANGES = 3  # pooled changes before se_forecast is known (a median of fewer says little)
# Levels are compared across windows that do not overlap: overlapping ones share records,
# and their change understates how far a level moves.
MIN_STEPS_APART = DEFAULT_WINDOW_STEPS
_MAD_TO_SIGMA = 1.4826


class LevelForecastNoise:
    """The pooled, robust spread of the ranks' level changes between decisions.

    :meth:`observe` is called with every decision's estimates; calling it again at the same
    step (a decision made twice, see the balancer's quota caps) returns the same answer.
    """

    def __init__(self):
        self._history: collections.deque = collections.deque(maxlen=HISTORY_DECISIONS)
        self._before: Optional[tuple[int, list[int], list[float]]] = None  # step, b_L, m_L per rank
        self._last: Optional[tuple[int, float]] = None  # (step, answer) of the last observe

    def observe(self, est: Estimates) -> float:
        """``se_forecast`` after the decision at ``est.global_step`` (NaN: not known yet)."""
        step = int(est.global_step)
        if self._last is not None and self._last[0] == step:
            return self._last[1]
        sizes = np.asarray(est.local_batch_size, dtype=np.int64)
        levels = np.where(est.fresh, np.asarray(est.busy_time_s, dtype=np.float64), np.nan)
        if self._before is not None and len(self._before[1]) == sizes.size:
            before_step, before_sizes, before_levels = self._before
            if step - before_step >= MIN_STEPS_APART:
                changes = level_changes(np.asarray(before_sizes), np.asarray(before_levels, dtype=np.float64),
                                        sizes, levels)
                if changes.size:
                    self._history.append(changes.tolist())
                self._before = (step, sizes.tolist(), levels.tolist())
        else:
            self._before = (step, sizes.tolist(), levels.tolist())
        pooled = np.abs(np.concatenate([np.asarray(c) for c in self._history])) if self._history else np.zeros(0)
        # e is the difference of two levels' errors: each level's is sd(e)/√2
        answer = float(_MAD_TO_SIGMA * np.median(pooled) / math.sqrt(2.0)) if pooled.size >= MIN_CHANGES else math.nan
        self._last = (step, answer)
        return answer

    def state_dict(self) -> dict:
        """Plain JSON (no NaN: a stale rank's level is None)."""
        before = None
        if self._before is not None:
            step, sizes, levels = self._before
            before = [step, sizes, [None if math.isnan(x) else x for x in levels]]
        return {"history": [list(c) for c in self._history], "before": before}

    def load_state_dict(self, state: Optional[dict]) -> None:
        state = state or {}
        self._history = collections.deque((list(c) for c in state.get("history") or ()), maxlen=HISTORY_DECISIONS)
        before = state.get("before")
        self._before = None if before is None else (
            int(before[0]), [int(b) for b in before[1]], [math.nan if x is None else float(x) for x in before[2]])
        self._last = None


def level_changes(sizes_before: np.ndarray, levels_before: np.ndarray, sizes_now: np.ndarray,
                  levels_now: np.ndarray) -> np.ndarray:
    """``e_i`` (module docstring) for the ranks at the same local batch size both times with
    finite, positive levels; empty with fewer than two such ranks (nothing to compare).

    With ``k`` ranks, a deviation from their centre has ``(k−1)/k`` of a rank's variance;
    the deviations are scaled back by ``sqrt(k/(k−1))``.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        log_ratio = np.log(levels_now / levels_before)
    same = (sizes_now == sizes_before) & (sizes_now > 0) & np.isfinite(log_ratio)
    k = int(same.sum())
    if k < 2:
        return np.zeros(0)
    e = log_ratio[same]
    return (e - np.median(e)) * math.sqrt(k / (k - 1))
