"""Per-step timing of one rank: where its time goes, and how long it was busy.

Under DDP every rank's *step* takes as long as the slowest rank's (the all-reduce waits),
so step time says nothing about who is slow. Busy time does:

    busy_time_s = data_time_s + forward_time_s + backward_time_s + pad_time_s

measured from the start of the step to the moment this rank's last gradient bucket is
ready (the DDP hook sees it), i.e. before it waits for anybody. The rest of the step,

    step_time_s − busy_time_s − optimizer_time_s,

is time spent communicating or waiting for others: the straggler signal.

On CPU the marks are ``time.perf_counter`` readings. On GPU kernels run asynchronously,
so compute phases are timed with CUDA events on the current stream and read once per
step, after the step's last event completed; data loading (host work) stays wall-clock.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from hetero_ray.training.rank.current_step import CurrentStep
    from hetero_ray.training.timing.curve_emulation import CurveEmulator
    from hetero_ray.training.timing.emulation import SpeedEmulator

STEP_START = "start"
HOST_BATCH_READY = "host_batch"  # GPU only: the batch gathered in host memory, before the copy
DATA_READY = "data"
FORWARD_DONE = "forward"
LAST_BUCKET_READY = "last_bucket"
BACKWARD_DONE = "backward"
STEP_DONE = "end"


class StepTimeline:
    """Named time marks of one step; durations between marks in seconds."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        self._wall: dict[str, float] = {}
        self._events: dict[str, torch.cuda.Event] = {}

    def mark(self, name: str) -> None:
        self._wall[name] = time.perf_counter()
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._events[name] = event

    def mark_wall_latest(self, name: str) -> None:
        """A wall-clock mark that only moves forward; safe from another thread.

        For moments seen outside the training thread, such as the completion of a gradient
        all-reduce (a gloo or NCCL thread); with several, the latest one counts.
        """
        now = time.perf_counter()
        if now > self._wall.get(name, float("-inf")):
            self._wall[name] = now

    def wall_s(self, start: str, stop: str) -> float:
        return self._wall[stop] - self._wall[start]

    def device_s(self, start: str, stop: str) -> float:
        """Device time between two marks (wall time on CPU, or where a mark is wall-only).
        Call :meth:`synchronize` first."""
        if self._cuda and start in self._events and stop in self._events:
            return self._events[start].elapsed_time(self._events[stop]) / 1000.0
        return self.wall_s(start, stop)

    def synchronize(self) -> None:
        if self._cuda and self._events:
            self._events[STEP_DONE if STEP_DONE in self._events else list(self._events)[-1]].synchronize()

    def has(self, name: str) -> bool:
        return name in self._wall

    def end(self) -> None:
        """Marks the end of the step and waits for its device work. A phase no hook marked
        (no prepared model, or no gradient reached the hook) ends there too."""
        self.mark(STEP_DONE)
        for missing in (FORWARD_DONE, LAST_BUCKET_READY, BACKWARD_DONE):
            if not self.has(missing):
                self.mark(missing)
        self.synchronize()


def step_durations(timeline: StepTimeline, pad_time_s: float) -> dict[str, float]:
    """The step record's timing columns from a finished, synchronised timeline.

    Phases before the last bucket are compute of this rank alone; the emulation pad is
    spent inside the backward pass (in the hook) and reported separately.
    """
    data_time_s = timeline.wall_s(STEP_START, DATA_READY)
    forward_time_s = timeline.device_s(DATA_READY, FORWARD_DONE)
    to_last_bucket_s = timeline.device_s(FORWARD_DONE, LAST_BUCKET_READY)
    backward_time_s = max(0.0, to_last_bucket_s - pad_time_s)
    optimizer_time_s = timeline.device_s(BACKWARD_DONE, STEP_DONE)
    step_time_s = timeline.wall_s(STEP_START, STEP_DONE)
    busy_time_s = data_time_s + forward_time_s + to_last_bucket_s
    # Host-to-device copy (GPU): from the gathered host batch to the batch on the device.
    h2d_time_s = timeline.device_s(HOST_BATCH_READY, DATA_READY) if timeline.has(HOST_BATCH_READY) else None
    return {
        "h2d_time_s": h2d_time_s,
        "data_time_s": data_time_s,
        "forward_time_s": forward_time_s,
        "backward_time_s": backward_time_s,
        "pad_time_s": pad_time_s,
        "busy_time_s": busy_time_s,
        "optimizer_time_s": optimizer_time_s,
        "step_time_s": step_time_s,
        "wait_time_s": max(0.0, step_time_s - busy_time_s - optimizer_time_s),
    }


class BucketClock:
    """Callback for the DDP hook: marks the last bucket and lets emulation pad before it.

    Runs inside the autograd engine, between gradient computation and the all-reduce of
    each bucket; whatever it spends delays this rank's communication exactly like a
    slower device would. ``current`` is the worker's
    :class:`~hetero_ray.training.rank.current_step.CurrentStep`: the hook cannot be handed
    the step it runs in, so it reads the step in progress there.
    """

    def __init__(self, current: "CurrentStep", emulator: Optional["SpeedEmulator | CurveEmulator"] = None):
        self._current = current
        self.emulator = emulator

    def __call__(self, is_last: bool) -> None:
        timeline = self._current.timeline
        if timeline is None:  # a backward pass outside a training step (nothing to time)
            return
        if self.emulator is not None:
            self.emulator.pad(is_last)
        if is_last:
            timeline.mark(LAST_BUCKET_READY)

    def reduced(self) -> None:
        """A bucket's all-reduce completed (called from the communication thread): the
        latest such moment ends the rank's backward pass, waiting for others included."""
        timeline = self._current.timeline
        if timeline is not None:
            timeline.mark_wall_latest(BACKWARD_DONE)
