"""A worker's state, piece by piece and without Ray: the identity cannot change, the model's
hooks mark only the step in progress, and a finished step gives the row the steps table
expects."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hetero_ray.planning.plan import Plan
from hetero_ray.runs.records import STEP_COLUMNS
from hetero_ray.sampler import Position
from hetero_ray.training.rank.current_step import CurrentStep, StepNotes
from hetero_ray.training.rank.identity import WorkerIdentity
from hetero_ray.training.rank.step_record import HandedOutStep, sample_ids_row, step_row
from hetero_ray.training.timing import steps as timing

# Columns the in-training resource sampler adds to a step's row, where it measures.
RESOURCE_COLUMNS = {"gpu_util", "gpu_mem_used_bytes", "gpu_mem_peak_bytes", "gpu_mem_total_bytes", "gpu_temp_c",
                    "gpu_power_w", "cpu_util", "rss_bytes", "cpu_util_from_step", "cpu_quota_cores"}


def _identity(rank=1) -> WorkerIdentity:
    return WorkerIdentity(rank=rank, num_workers=2, local_rank=rank, device=torch.device("cpu"), node_id="node-a",
                          attempt=3, rank_node_ids=("node-a", "node-a"), rank_device_kinds=("cpu", "cpu"),
                          rank_cpu_cores=(4, 4), rank_cpus=({"threads": 1, "quota_cores": None},) * 2)


def test_the_identity_cannot_change():
    identity = _identity()
    with pytest.raises(dataclasses.FrozenInstanceError):
        identity.rank = 0


def test_the_hooks_mark_only_the_step_in_progress():
    current = CurrentStep()
    clock = timing.BucketClock(current)
    clock(is_last=True)  # a backward pass outside a training step: nothing to mark, nothing fails
    clock.reduced()

    timeline = timing.StepTimeline(torch.device("cpu"))
    current.begin(timeline)
    clock(is_last=False)
    assert not timeline.has(timing.LAST_BUCKET_READY)
    clock(is_last=True)
    clock.reduced()
    assert timeline.has(timing.LAST_BUCKET_READY) and timeline.has(timing.BACKWARD_DONE)

    current.note(StepNotes(loss=0.25, lr=0.1))
    assert current.end() == StepNotes(loss=0.25, lr=0.1)
    assert current.timeline is None
    current.begin(timing.StepTimeline(torch.device("cpu")))
    assert current.end() == StepNotes()  # notes belong to one step


def _finished_step(local_batch_size=5) -> HandedOutStep:
    timeline = timing.StepTimeline(torch.device("cpu"))
    for mark in (timing.STEP_START, timing.DATA_READY):
        timeline.mark(mark)
    timeline.end()  # no model hook ran: forward and backward end with the step
    return HandedOutStep(Position(epoch=1, step=2, global_step=12), Plan(4, (5, 3), "test"), local_batch_size,
                         8, timeline)


def test_a_finished_step_gives_the_row_the_steps_table_expects():
    row = step_row(_identity(), _finished_step(), StepNotes(loss=0.5, lr=0.01), pad_time_s=0.0,
                   data_source="ray_data:train")
    assert set(row) == set(STEP_COLUMNS) - RESOURCE_COLUMNS
    assert {k: row[k] for k in ("epoch", "step", "global_step", "rank", "node_id", "attempt", "local_batch_size",
                                "global_batch_size", "plan_version", "loss", "lr", "data_source")} == {
        "epoch": 1, "step": 2, "global_step": 12, "rank": 1, "node_id": "node-a", "attempt": 3,
        "local_batch_size": 5, "global_batch_size": 8, "plan_version": 4, "loss": 0.5, "lr": 0.01,
        "data_source": "ray_data:train"}
    assert row["pad_time_s"] == 0.0 and row["wait_time_s"] >= 0.0


def test_sample_ids_name_the_step_and_the_rank():
    row = sample_ids_row(_identity(), Position(1, 2, 12), [7, 3])
    assert row == {"epoch": 1, "step": 2, "global_step": 12, "rank": 1, "attempt": 3, "sample_indices": [7, 3]}
