"""Emulated device speeds: heterogeneity on one machine.

A rank with emulated speed ``v`` (0 < v ≤ 1) behaves like a device ``1/v`` times slower:
before each gradient bucket is handed to the all-reduce, it sleeps until

    elapsed_wall = work / v      work: what the device did (on a CPU, the compute thread's
                                 CPU time; on a GPU, wall time with its queue drained)

and the padding counts as busy time. Every speed is scaled by one factor so that each
node's CPU ranks fit on ``USABLE_CORE_FRACTION`` of its cores (:func:`fit_to_cores`), and
speeds may change at given steps (``--emulate-speed-changes``). A device of another shape
(a GPU's floor): :mod:`hetero_ray.training.timing.curve_emulation`.
Why: docs/worker-runtime.md#emulated-speeds
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

# Of a node's cores, what emulated CPU ranks may plan to use: Ray's own processes, the
# gloo threads and the data loading need the rest.
USABLE_CORE_FRACTION = 0.8


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
        self.scale = 1.0  # set once the ranks' placement is known: see fit_to_cores

    def speed(self, rank: int, global_step: int) -> float:
        return self.scale * self.relative_speed(rank, global_step)

    def relative_speed(self, rank: int, global_step: int) -> float:
        value = self.speeds[rank] if rank < len(self.speeds) else 1.0
        for change in self.changes:
            if change.global_step <= global_step and change.rank == rank:
                value = change.speed
        return value

    def change_steps(self) -> list[int]:
        """The steps where some rank's speed may differ from the step before (0 included)."""
        return sorted({0, *(c.global_step for c in self.changes)})


def fit_to_cores(schedule: SpeedSchedule, rank_node_ids: Sequence[str], rank_cpu_cores: Sequence[Optional[int]],
                 usable_fraction: float = USABLE_CORE_FRACTION) -> float:
    """The factor on every speed that keeps each node's CPU ranks within its cores.

    ``rank_cpu_cores[i]`` is the core count of rank i's node when rank i computes on the
    CPU, None when it does not (a GPU rank needs no core to run at its speed). The demand
    of a node is the largest sum of its CPU ranks' speeds over the schedule.
    """
    demand: dict[str, float] = {}
    cores: dict[str, int] = {}
    for step in schedule.change_steps():
        at_step: dict[str, float] = {}
        for rank, (node, node_cores) in enumerate(zip(rank_node_ids, rank_cpu_cores)):
            if node_cores is not None:
                at_step[node] = at_step.get(node, 0.0) + schedule.relative_speed(rank, step)
                cores[node] = node_cores
        for node, total in at_step.items():
            demand[node] = max(demand.get(node, 0.0), total)
    fits = [usable_fraction * cores[node] / total for node, total in demand.items() if total > 0]
    return min([1.0, *fits])


def cpu_work_clock() -> Callable[[], float]:
    """CPU seconds spent computing by this process's torch work.

    With one intra-op thread the forward and (CPU) backward passes run on the calling
    thread, so its CPU time is the work and gloo's or Ray's background threads are not.
    With an intra-op pool the work is spread over the process's threads.
    """
    return time.thread_time if torch.get_num_threads() == 1 else time.process_time


class SpeedEmulator:
    """Pads one rank's busy time so it runs at ``speed`` of its real speed.

    Args:
        synchronize: waits for the device's queued work (CUDA); without it the real work
            done so far cannot be known on an asynchronous device. Given, work is wall time.
        work_clock: seconds of work done so far, when the device is the host CPU (default
            :func:`cpu_work_clock`); ignored when ``synchronize`` is given.
    """

    def __init__(self, synchronize: Optional[Callable[[], None]] = None,
                 work_clock: Optional[Callable[[], float]] = None):
        self._synchronize = synchronize
        self._work_clock = work_clock or cpu_work_clock()
        self.speed = 1.0
        self._step_start = 0.0
        self._work_start = 0.0
        self.padded_s = 0.0

    def begin_step(self, speed: float, step_start: float, local_batch_size: Optional[int] = None) -> None:
        """``local_batch_size`` is not needed here (a speed stretches any work); it is taken
        for the curve emulator's sake, which shares this interface."""
        self.speed = speed
        self._step_start = step_start
        self._work_start = self._work_clock()
        self.padded_s = 0.0

    def busy_s(self) -> float:
        """The step so far as the emulated device spends it: its ``work / speed``, the wall
        time the pad makes the step last less any moment the host gave the core to another
        process (which a slower device would not multiply, and which the pad only meets
        when the host let the step run past its target). At speed ≥ 1 there is no pad: the
        work itself, at most the wall time (an intra-op pool's CPU time exceeds it).

        What the warm-up times (training/timing/warmup.py): a fast rank whose core was taken away
        by another process would otherwise be timed slower than a slow rank whose pad
        absorbed the same wait, and the first plan would mis-order them.
        """
        if self._synchronize is not None:
            self._synchronize()
        elapsed = time.perf_counter() - self._step_start
        # a GPU's drained queue: wall time is the work (module docstring)
        work = elapsed - self.padded_s if self._synchronize is not None else self._work_clock() - self._work_start
        return work / self.speed if self.speed < 1.0 else min(work, elapsed)

    def pad(self, is_last: bool = True) -> None:
        """Before each gradient bucket (``is_last``: the step's last): every bucket leaves late."""
        if self.speed >= 1.0:
            return
        if self._synchronize is not None:
            self._synchronize()
        elapsed = time.perf_counter() - self._step_start
        if self._synchronize is not None:
            work = elapsed - self.padded_s
        else:
            work = self._work_clock() - self._work_start
        delay = work / self.speed - elapsed
        if delay > 0:
            slept_from = time.perf_counter()
            time.sleep(delay)
            self.padded_s += time.perf_counter() - slept_from
