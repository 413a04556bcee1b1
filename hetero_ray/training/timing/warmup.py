"""Each rank measures itself before step 0: the first plan under emulated speeds.

A node profile measures a node's devices once, so it cannot tell two ranks of one machine
apart when their speeds are emulated: only the emulator knows them. So when speeds are
emulated, every rank times the model's step (the same recipe the node profiler runs) at a
few batch sizes in a short warm-up, with its emulator padding the step exactly as in
training, and fits ``t(b) = α + β·b``. A step is timed as the emulated device spends it
(:meth:`SpeedEmulator.busy_s`: the work stretched by the speed), not by the wall clock:
on a machine shared with other processes, a rank whose core was taken away for a moment
would otherwise be timed slower than it is emulated, while a slower rank's pad absorbs the
same wait — the 1.0-speed ranks then measured slower than the 0.5-speed one. All ranks
warm up at once, so ranks that share a node's cores are measured sharing them. Rank 0 hands the fits to the planner with the
group's first plan request: the first plan is measured, never read from the flag.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from hetero_ray.profiling.model_probe import StepRunner, fit_probe, measure_busy_times
from hetero_ray.training.timing.curve_emulation import CurveEmulator
from hetero_ray.training.timing.emulation import SpeedEmulator

logger = logging.getLogger(__name__)

WARMUP_TIME_BUDGET_S = 3.0  # per rank, all ranks at once: seconds before step 0, not a profile
WARMUP_REPEATS = 2  # blocks per size: a second round steadies the line at little cost


class _PaddedRunner(StepRunner):
    """A step runner whose every step is padded by the rank's emulator, as in training."""

    def __init__(self, model, recipe, device, emulator: SpeedEmulator | CurveEmulator, speed: float):
        super().__init__(model, recipe, device)
        self._emulator = emulator
        self._speed = speed
        self._batch_size: Optional[int] = None

    def busy_time_s(self, batch_size: int) -> float:
        self._batch_size = batch_size  # a curve's pad depends on it
        wall_s = super().busy_time_s(batch_size)
        if isinstance(self._emulator, SpeedEmulator):
            # The emulated device's time, not the host's: see SpeedEmulator.busy_s.
            return self._emulator.busy_s()
        return wall_s  # a curve's pad is the target itself; an overrun is real (curve_emulation.py)

    def _step(self, batch) -> None:
        self._emulator.begin_step(self._speed, time.perf_counter(), self._batch_size)
        super()._step(batch)
        self._emulator.pad()


def measure_rank(recipe, device: torch.device, batch_sizes: list[int], emulator: SpeedEmulator | CurveEmulator,
                 speed: float, time_budget_s: float = WARMUP_TIME_BUDGET_S,
                 hold: Optional[Callable[[Callable[[], None]], None]] = None) -> Optional[dict]:
    """This rank's fitted curve ``{"alpha_s", "beta_s_per_sample", "floor_s"}`` at its emulated
    ``speed``, or None when the recipe fails or the line is unusable (the plan then does
    without this rank's measurement).

    ``hold`` (collective, e.g. :func:`until_all_ranks_done`) is called exactly once, failure
    or not, with an untimed padded step to repeat until every rank has measured: a slow
    rank's last blocks are then timed beside the others' load, as in training, not alone
    on cores the faster ranks have left (which made it look faster than it is).
    """
    cuda = [device] if torch.device(device).type == "cuda" else []
    step: Callable[[], None] = lambda: None  # noqa: E731 - nothing to run when the runner could not be built
    fit = None
    try:
        # The user's loop starts after this: it finds torch's random state as it was.
        with torch.random.fork_rng(devices=cuda):
            runner = _PaddedRunner(recipe.build(), recipe, device, emulator, speed)
            timings = measure_busy_times(runner, batch_sizes, repeats=WARMUP_REPEATS, time_budget_s=time_budget_s)
            step = functools.partial(runner.busy_time_s, min(batch_sizes))
            if hold is not None:
                hold, held = None, hold
                held(step)
        fit = fit_probe(timings)
    except Exception as e:  # noqa: BLE001 - the first plan goes on without it
        logger.warning("warm-up measurement failed (%s: %s); the first plan does without it", type(e).__name__, e)
    if hold is not None:  # the measurement failed before holding: the others still wait for this rank
        hold(lambda: None)
    if fit is None or not fit.predict_s(1) > 0:
        return None
    return {"alpha_s": fit.alpha_s, "beta_s_per_sample": fit.beta_s_per_sample, "floor_s": fit.floor_s}


def until_all_ranks_done(step: Callable[[], None], poll_s: float = 0.001) -> None:
    """Collective: runs ``step`` until every rank of the default group has called this (an
    asynchronous barrier), so that no rank measures alone; sleeps ``poll_s`` between polls
    when ``step`` does nothing."""
    done = dist.barrier(async_op=True)
    while not done.is_completed():
        started = time.perf_counter()
        step()
        if time.perf_counter() - started < poll_s:
            time.sleep(poll_s)
    done.wait()


def gather_fits(fit: Optional[dict], num_workers: int) -> list[Optional[dict]]:
    """Collective: every rank's fit, in rank order."""
    fits: list = [None] * num_workers
    dist.all_gather_object(fits, fit)
    return fits
