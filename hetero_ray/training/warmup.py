"""Each rank measures itself before step 0: the first plan under emulated speeds.

A node profile measures a node's devices once, so it cannot tell two ranks of one machine
apart when their speeds are emulated: only the emulator knows them. So when speeds are
emulated, every rank times the model's step (the same recipe the node profiler runs) at a
few batch sizes in a short warm-up, with its emulator padding the step exactly as in
training, and fits ``t(b) = α + β·b``. All ranks warm up at once, so ranks that share a
node's cores are measured sharing them. Rank 0 hands the fits to the planner with the
group's first plan request: the first plan is measured, never read from the flag.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch
import torch.distributed as dist

from hetero_ray.profiling.model_probe import StepRunner, fit_probe, measure_busy_times
from hetero_ray.training.curve_emulation import CurveEmulator
from hetero_ray.training.emulation import SpeedEmulator

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
        return super().busy_time_s(batch_size)

    def _step(self, batch) -> None:
        self._emulator.begin_step(self._speed, time.perf_counter(), self._batch_size)
        super()._step(batch)
        self._emulator.pad()


def measure_rank(recipe, device: torch.device, batch_sizes: list[int], emulator: SpeedEmulator | CurveEmulator,
                 speed: float, time_budget_s: float = WARMUP_TIME_BUDGET_S) -> Optional[dict]:
    """This rank's fitted curve ``{"alpha_s", "beta_s_per_sample", "floor_s"}`` at its emulated
    ``speed``, or None when the recipe fails or the line is unusable (the plan then does
    without this rank's measurement)."""
    cuda = [device] if torch.device(device).type == "cuda" else []
    try:
        # The user's loop starts after this: it finds torch's random state as it was.
        with torch.random.fork_rng(devices=cuda):
            runner = _PaddedRunner(recipe.build(), recipe, device, emulator, speed)
            timings = measure_busy_times(runner, batch_sizes, repeats=WARMUP_REPEATS, time_budget_s=time_budget_s)
        fit = fit_probe(timings)
    except Exception as e:  # noqa: BLE001 - the first plan goes on without it
        logger.warning("warm-up measurement failed (%s: %s); the first plan does without it", type(e).__name__, e)
        return None
    if not fit.predict_s(1) > 0:
        return None
    return {"alpha_s": fit.alpha_s, "beta_s_per_sample": fit.beta_s_per_sample, "floor_s": fit.floor_s}


def gather_fits(fit: Optional[dict], num_workers: int) -> list[Optional[dict]]:
    """Collective: every rank's fit, in rank order."""
    fits: list = [None] * num_workers
    dist.all_gather_object(fits, fit)
    return fits
