"""Emulated devices with the shape of real ones: each rank's busy time follows a device curve.

``--emulate-devices`` gives each rank a curve ``t_dev(b) = max(τ, α + β·b)``
(:mod:`hetero_ray.planning.cost_model`'s family), from a device of a ``nodes.json`` or
written out (``curve:FLOOR_MS:ALPHA_MS:BETA_MS``), and the rank pads its step so that its
busy time at local batch ``b`` is

    busy(b) = k · t_dev(b) / v      k ≥ 1: one factor for all ranks, measured before step 0
                                       (:func:`common_factor`); v: the rank's emulated speed

The rank sleeps once per step, in the gradient hook before its last bucket leaves, and the
pad counts as busy time; a step whose real work overruns its target is not padded. Why a
curve, where the curves come from, and why k is fixed: docs/worker-runtime.md#emulated-devices
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

from hetero_ray.errors import UserError
from hetero_ray.planning.cost_model import curve_busy_time_s

logger = logging.getLogger(__name__)

# The factor leaves this much room above the slowest rank's measured ratio: the real steps
# of a shared 2-core machine vary by tens of percent, and a step past its target is not
# padded (its busy time leaves the curve). Larger only slows every emulated run down.
HEADROOM = 1.25


@dataclass(frozen=True)
class DeviceCurve:
    """``t_dev(b) = max(floor_s, alpha_s + beta_s_per_sample·b)``: one emulated device."""

    floor_s: float
    alpha_s: float
    beta_s_per_sample: float
    source: str  # the entry it came from, for messages

    def busy_time_s(self, local_batch_size: float) -> float:
        # A rank holding no sample of a step still runs one (with weight 0): its time is one sample's.
        return float(curve_busy_time_s(self.alpha_s, self.beta_s_per_sample, self.floor_s,
                                       max(1.0, local_batch_size)))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceCurve":
        return cls(**d)


# ---------------------------------------------------------------------------- the pad rule
def curve_pad_s(elapsed_s: float, curve: DeviceCurve, factor: float, local_batch_size: int,
                speed: float = 1.0) -> float:
    """Seconds to sleep so that a step ``elapsed_s`` into its busy time ends at
    ``k·t_dev(b)/v``; 0 when the real work already took longer."""
    return max(0.0, factor * curve.busy_time_s(local_batch_size) / speed - elapsed_s)


def rank_ratio(real_s: Callable[[float], float], curve: DeviceCurve, global_batch_size: int) -> float:
    """``max_b r(b)/t_dev(b)`` over doubling sizes 1, 2, 4, … and ``B``: how much slower than
    its curve this rank really is, at worst, at any share a plan may give it."""
    sizes, b = [], 1
    while b < global_batch_size:
        sizes.append(b)
        b *= 2
    sizes.append(global_batch_size)
    return max(real_s(b) / curve.busy_time_s(b) for b in sizes)


def common_factor(ratios: Sequence[Optional[float]], headroom: float = HEADROOM) -> float:
    """``k = max(1, headroom · max ratio)`` over the ranks that measured themselves.

    Raises:
        UserError: no rank could measure its real busy time.
    """
    known = [r for r in ratios if r is not None and math.isfinite(r) and r > 0]
    if not known:
        raise UserError("emulated devices: no rank could time the model's step before step 0, so the factor "
                        "that keeps every curve within this machine's speed is unknown; see the workers' "
                        "warnings for why the step failed")
    return max(1.0, headroom * max(known))


class CurveEmulator:
    """Pads one rank's busy time to ``k·t_dev(b)/v`` (module docstring).

    Args:
        curve: this rank's device.
        factor: ``k``, the same on every rank.
        local_batch_size: this rank's share of the step in progress (the loader's), read at
            the pad: the loader begins the step before it knows the share.
        synchronize: waits for the device's queued work (CUDA), so that the pad starts
            after the real work, not while it is still queued.
    """

    def __init__(self, curve: DeviceCurve, factor: float,
                 local_batch_size: Callable[[], Optional[int]] = lambda: None,
                 synchronize: Optional[Callable[[], None]] = None):
        self.curve = curve
        self.factor = factor
        self.local_batch_size = local_batch_size
        self._synchronize = synchronize
        self.speed = 1.0
        self._step_start = 0.0
        self._batch_size: Optional[int] = None
        self.padded_s = 0.0
        self.overruns = 0  # steps whose real work took longer than their target

    def begin_step(self, speed: float, step_start: float, local_batch_size: Optional[int] = None) -> None:
        self.speed = speed
        self._step_start = step_start
        self._batch_size = local_batch_size
        self.padded_s = 0.0

    def pad(self, is_last: bool = True) -> None:
        if not is_last:
            return
        b = self._batch_size if self._batch_size is not None else self.local_batch_size()
        if b is None:  # a backward pass outside a step
            return
        if self._synchronize is not None:
            self._synchronize()
        delay = curve_pad_s(time.perf_counter() - self._step_start, self.curve, self.factor, b, self.speed)
        if delay <= 0:
            self.overruns += 1
            if self.overruns == 1:
                logger.warning("emulated device %s: a step at local batch %d took longer than its target "
                               "%.3g s (factor %.3g); such steps show their real busy time", self.curve.source, b,
                               self.factor * self.curve.busy_time_s(b) / self.speed, self.factor)
            return
        slept_from = time.perf_counter()
        time.sleep(delay)
        self.padded_s += time.perf_counter() - slept_from
