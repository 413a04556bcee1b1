"""What a policy decides with and what it returns: its knobs (:class:`PolicyConfig`) and its
verdict at one rebalance point (:class:`Decision`, a row of the ``decisions`` table)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from hetero_ray import validate
from hetero_ray.errors import ConfigError
from hetero_ray.planning.estimates import Estimates
from hetero_ray.planning.plan import Plan


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs shared by the adaptive policies; defaults carry their reason."""

    # Adopt only if the predicted step time drops by more than this fraction: a switch
    # costs a broadcast and some lost overlap, and smaller gains drown in noise.
    rebalance_threshold: float = 0.05
    # Steps after an adoption before the next may be adopted (0: every interval may change).
    rebalance_cooldown: int = 0
    # b_min: the smallest local batch a rank is given (every rank needs ≥ 1 sample).
    min_local_batch_size: int = 1
    # Multiplier on the noise margin se·sqrt(2 ln n) added to the threshold (0: off).
    noise_margin: float = 1.0
    # A gain below this multiple of the required gain is adopted only when the decision
    # before, under the same plan, also saw one (1: at once): see planning/policies.py.
    confirm_below: float = 2.0

    def __post_init__(self):
        # The run's settings of the same names are checked here alone (PlanConfig builds one).
        validate.fraction_below_one(validate.named("rebalance_threshold"), self.rebalance_threshold,
                                    of="the step time")
        validate.non_negative_int(validate.named("rebalance_cooldown"), self.rebalance_cooldown)
        validate.positive_int("min_local_batch_size", self.min_local_batch_size)
        k = self.noise_margin
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0 <= k < math.inf:
            raise ConfigError(f"noise_margin must be a finite number ≥ 0, got {k!r}")
        c = self.confirm_below
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 1 <= c < math.inf:
            raise ConfigError(f"confirm_below must be a finite number ≥ 1, got {c!r}")


@dataclass(frozen=True)
class Decision:
    """What a policy decided at one rebalance point.

    Attributes:
        adopt: True when ``plan`` is a new plan to publish.
        plan: the plan in force after the decision (the new one, or the current one).
        reason: why, in words a person reads in the decision log.
        policy: the policy's name.
        global_step: the step the decision was made at.
        proposed_local_batch_sizes: what the policy would switch to (also when rejected);
            None when it proposed nothing.
        predicted_step_time_s: predicted step time of the proposal (NaN: none).
        current_predicted_step_time_s: predicted step time of the current plan (NaN: unknown).
        predicted_gain: ``(current − proposed)/current`` (NaN: nothing to compare).
        required_gain: the gain a proposal had to beat (threshold + noise margin).
        estimates: the estimates the decision was made from (None: none were given).
        left_out: the ranks the proposal leaves out (``b_i = 0``).
        all_ranks_step_time_s: predicted step time of the best split over every rank
            that could be in (NaN: not computed), to set beside a proposal that leaves
            ranks out.
    """

    adopt: bool
    plan: Plan
    reason: str
    policy: str
    global_step: int
    proposed_local_batch_sizes: Optional[tuple[int, ...]] = None
    predicted_step_time_s: float = math.nan
    current_predicted_step_time_s: float = math.nan
    predicted_gain: float = math.nan
    required_gain: float = math.nan
    estimates: Optional[Estimates] = field(default=None, repr=False, compare=False)
    left_out: tuple[int, ...] = ()
    all_ranks_step_time_s: float = math.nan

    def to_record(self) -> dict:
        """A row of the ``decisions`` table.

        ``local_batch_sizes`` is the proposal (the new plan when adopted); without one, the
        plan in force.
        """
        sizes = self.proposed_local_batch_sizes or self.plan.local_batch_sizes
        return {
            "global_step": int(self.global_step),
            "policy": self.policy,
            "adopted": bool(self.adopt),
            "reason": self.reason,
            "plan_version": int(self.plan.version),
            "local_batch_sizes": [int(b) for b in sizes],
            "predicted_step_time_s": _finite_or_none(self.predicted_step_time_s),
            "current_predicted_step_time_s": _finite_or_none(self.current_predicted_step_time_s),
            "predicted_gain": _finite_or_none(self.predicted_gain),
            "left_out_ranks": [int(r) for r in self.left_out],
            "all_ranks_predicted_step_time_s": _finite_or_none(self.all_ranks_step_time_s),
        }


def _finite_or_none(x: float) -> Optional[float]:
    return float(x) if x is not None and math.isfinite(x) else None
