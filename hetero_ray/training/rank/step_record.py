"""A rank's rows for one finished step: its row of the steps table and, where asked for,
the sample indices it consumed (the exactly-once audit)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from hetero_ray.planning.plan import Plan
from hetero_ray.sampler import Position
from hetero_ray.training.rank.current_step import StepNotes
from hetero_ray.training.rank.identity import WorkerIdentity
from hetero_ray.training.timing.steps import StepTimeline, step_durations


@dataclass(frozen=True)
class HandedOutStep:
    """A step whose batch the loader handed out: what its rows need, fixed when it began."""

    position: Position
    plan: Plan
    local_batch_size: int  # 0: the rank held no sample and ran one of the window with weight 0
    window_size: int  # the step's global batch (an epoch's last window may be short)
    timeline: StepTimeline
    probe_batch_size: int = 0  # a rank left out by the plan: the samples it timed (weight 0, no all-reduce)


def step_row(identity: WorkerIdentity, step: HandedOutStep, notes: StepNotes, pad_time_s: float,
             data_source: str) -> dict:
    """The step's row of the steps table; its timeline has ended (:meth:`StepTimeline.end`).
    ``data_source``: where the rank's batches came from (the ``data_source`` column)."""
    position = step.position
    return {
        "epoch": position.epoch, "step": position.step, "global_step": position.global_step,
        "rank": identity.rank, "node_id": identity.node_id, "attempt": identity.attempt,
        "local_batch_size": step.local_batch_size, "probe_batch_size": step.probe_batch_size,
        "global_batch_size": step.window_size,
        "plan_version": step.plan.version, "loss": notes.loss, "lr": notes.lr, "wall_time": time.time(),
        "data_source": data_source,
        **step_durations(step.timeline, pad_time_s),
    }


def sample_ids_row(identity: WorkerIdentity, position: Position, sample_indices: list[int]) -> dict:
    return {
        "epoch": position.epoch, "step": position.step, "global_step": position.global_step,
        "rank": identity.rank, "attempt": identity.attempt, "sample_indices": sample_indices,
    }
