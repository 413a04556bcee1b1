"""Emulated device speeds: heterogeneity on one machine.

A rank with emulated speed ``v`` (0 < v ≤ 1) behaves like a device ``1/v`` times slower:
before each gradient bucket is handed to the all-reduce, it sleeps until

    elapsed_wall = real_work / v,        real_work = elapsed_wall − padded_so_far

so every bucket leaves when it would have left on the slower device, and the padding
counts as busy time (the balancer must see the rank as slow). Nothing else is padded.
Speeds may change at given global steps (``--emulate-speed-change STEP:RANK:SPEED``), to
test how the balancer follows a device that slows down mid-run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence


@dataclass(frozen=True)
class SpeedChange:
    global_step: int
    rank: int
    speed: float


class SpeedSchedule:
    """Per-rank emulated speed as a function of the global step."""

    def __init__(self, speeds: Sequence[float], changes: Sequence[SpeedChange] = ()):
        self.speeds = list(speeds)
        self.changes = sorted(changes, key=lambda c: c.global_step)

    def speed(self, rank: int, global_step: int) -> float:
        value = self.speeds[rank] if rank < len(self.speeds) else 1.0
        for change in self.changes:
            if change.global_step <= global_step and change.rank == rank:
                value = change.speed
        return value


class SpeedEmulator:
    """Pads one rank's busy time so it runs at ``speed`` of its real speed.

    Args:
        synchronize: waits for the device's queued work (CUDA); without it the real work
            done so far cannot be known on an asynchronous device.
    """

    def __init__(self, synchronize: Optional[Callable[[], None]] = None):
        self._synchronize = synchronize
        self.speed = 1.0
        self._step_start = 0.0
        self.padded_s = 0.0

    def begin_step(self, speed: float, step_start: float) -> None:
        self.speed = speed
        self._step_start = step_start
        self.padded_s = 0.0

    def pad(self) -> None:
        if self.speed >= 1.0:
            return
        if self._synchronize is not None:
            self._synchronize()
        elapsed = time.perf_counter() - self._step_start
        real_work = elapsed - self.padded_s
        delay = real_work / self.speed - elapsed
        if delay > 0:
            slept_from = time.perf_counter()
            time.sleep(delay)
            self.padded_s += time.perf_counter() - slept_from
