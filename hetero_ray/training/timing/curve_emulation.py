"""Emulated devices with the shape of real ones: each rank's busy time follows a device curve.

``--emulate-speeds`` makes a rank a constant factor slower, so every emulated device is a
line like this machine's CPU. A GPU is not: resnet18 on an H100 takes about 7 ms at every
batch from 8 to 64 (the kernel-launch floor). ``--emulate-devices`` gives each rank a curve

    t_dev(b) = max(τ, α + β·b)      (planning/cost_model.py's family)

and the rank pads its step so that its busy time at local batch ``b`` is

    busy(b) = k · t_dev(b) / v      v: the rank's emulated speed (1 unless --emulate-speeds
                                       or --emulate-speed-changes say otherwise)

**Where the curves come from** (one entry per rank, ``*COUNT`` repeats one):

* ``PROFILE.json[:NODE][:gpuN|cpuN]``: a device of a ``nodes.json`` (``hetero-ray profile
  --model M --json FILE``), refitted from its probe rows with the planner's own fit
  (:func:`~hetero_ray.planning.cost_model.fit_curve`, as ``hetero-ray plan`` refits), so
  the emulated device is what the planner would believe of the real one. ``NODE`` is a
  node id prefix, hostname or IP; without ``gpuN|cpuN`` the profile's first probed GPU is
  taken (else its first probed CPU).
* ``curve:FLOOR_MS:ALPHA_MS:BETA_MS``: a curve written out, e.g. ``curve:0:2:0.5`` for a
  CPU-like line of 2 ms + 0.5 ms per sample. Profiles rarely probe a CPU beside a GPU
  (the H100 profile in tests/data does not), and a line is all a CPU rank needs.

So "rank 0 behaves like the H100 in this nodes.json, ranks 1-2 like a CPU line" reads
``--emulate-devices h100_nodes.json:gpu0,curve:0:2:0.5*2``. A path names a file on the
driver's machine: the driver resolves every entry to its curve before anything starts and
sends the numbers to the workers (:func:`hetero_ray.runtime.device_curves.device_curves`).

**The common factor k.** A rank can only pad: it cannot run faster than this machine runs
the model. The H100 curve is 7 ms where this CPU takes far longer, so every curve is
stretched by one factor ``k ≥ 1``, the same for all ranks, which keeps the ratios between
the emulated devices (the shape the planner must cope with) while no rank's target is
ever below its real busy time:

    k = max(1, HEADROOM · max_i max_{b ∈ 1…B} r_i(b) / t_dev,i(b))

``r_i`` is rank i's real busy time, measured before step 0 with all ranks stepping the
model at once (so ranks that share cores are measured sharing them) and fitted with the
same curve; ``b`` runs over the whole range a plan may give one rank, up to the global
batch ``B`` (a plan may leave the other ranks out). Measured once before step 0 rather
than adapted online: k changing mid-run would move every rank's busy time at once, and
the balancer would read it as the cluster changing; and agreeing on a new k needs a
collective, which the gradient hook where the pad runs cannot enter. A step whose real
work overruns its target anyway (a noisy neighbour, a bigger batch than measured) is not
padded: it shows as measured, as a slowed device would (:attr:`CurveEmulator.overruns`).

**The pad.** Like :class:`~hetero_ray.training.timing.emulation.SpeedEmulator`, the pad runs
in the gradient hook and counts as busy time; unlike it, the curve is a whole step's time,
so the rank sleeps once, before its last gradient bucket leaves, until
``elapsed = k·t_dev(b)/v`` since the step began (earlier buckets leave as they are
ready: the curve says nothing about how a device spreads its backward pass).

Only the emulator reads the curves. Profiling, the warm-up lines of the first plan and
every policy measure the padded steps, as they would measure real devices.
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
