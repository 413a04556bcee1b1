"""``hetero_ray.train.report`` and what hetero_ray keeps inside the user's checkpoints.

A report is ``ray.train.report`` with three things added:

- hetero_ray's part of every checkpoint: the sampler position (the next step), the plan
  in force, what the data order depends on, and the planner's estimates, in a folder
  ``hetero_ray/`` beside the user's own files. It is written by the lowest rank that
  passes a checkpoint (all ranks agree on it with one all-gather), so a checkpoint from
  rank 0 alone — Ray Train's usual pattern — carries it;
- the step rows recorded so far are in the metrics store before the checkpoint that
  covers them is registered, so a crash right after it loses no step; on URI storage
  they are at the URI by then too (a resume on another machine finds them), and a
  checkpoint whose rows did not get there is not reported;
- the metrics also go to the run's ``reports`` table (rank 0), next to the step records.

Every rank must call it the same number of times (``ray.train.report`` is a barrier). A
rank that the plan has left out since its last copy of rank 0's state passes no
checkpoint, whatever the loop gives: its files would be stale.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Optional

import ray
import ray.train
import torch
import torch.distributed as dist

from hetero_ray.errors import UserError
from hetero_ray.training.rank.answers import answer
from hetero_ray.runs.checkpoint_names import (
    BALANCER_STATE_FILE,
    STATE_DIR,
    STATE_FILE,
    checkpoint_dir_name,
    next_checkpoint_count,
)
from hetero_ray.training.rank.identity import WorkerIdentity
from hetero_ray.training.rank.session import WorkerSession

logger = logging.getLogger("hetero_ray.worker")

STATE_FORMAT_VERSION = 1
TABLE_COPY_TIMEOUT_S = 120.0  # the tables' copy to URI storage, before a checkpoint


def report(session: WorkerSession, metrics: dict, checkpoint: Optional[ray.train.Checkpoint] = None) -> None:
    if not isinstance(metrics, dict) or not all(isinstance(k, str) for k in metrics):
        raise UserError(f"hetero_ray.train.report takes a dict of metrics with string keys, got {metrics!r:.80}")
    if checkpoint is not None and not isinstance(checkpoint, ray.train.Checkpoint):
        raise UserError("hetero_ray.train.report: checkpoint must be a ray.train.Checkpoint "
                        f"(e.g. Checkpoint.from_directory(path)), got {type(checkpoint).__name__}")
    loader = session.parts.loader
    if loader is not None:
        loader.finish_step()  # the step the user just completed belongs before this report
        if checkpoint is not None and session.identity.rank in loader.stale.ranks:
            # Left out since its last copy of rank 0's state: its files are stale, and Ray
            # Train keeps the last upload of a file name, which could be these.
            _say_stale_checkpoint_dropped(session.identity.rank)
            checkpoint = None
    position = loader.position if loader is not None else session.restored_position
    if not session.settings.allow_non_finite_loss:  # before any collective: the run stops here
        check_loss_is_finite(metrics.get("loss"), position.global_step - 1, session.identity.rank)
    writer = _lowest_rank_with_checkpoint(session.identity, checkpoint is not None)
    dir_name = None
    if writer is not None:
        if session.identity.rank == writer:
            _write_state(session, checkpoint, position, loader)
        session.flush_records()
        dir_name = _checkpoint_dir_name(session, position.global_step, _restored_checkpoint_name(session))
        if session.settings.tables_to_uri and not _copy_tables_before_the_checkpoint(session):
            checkpoint, dir_name = None, None  # a resume from it would lack its steps' rows
    if session.identity.rank == 0:
        session.store.add_report.remote({
            "global_step": position.global_step - 1, "epoch": position.epoch, "attempt": session.identity.attempt,
            "wall_time": time.time(), "metrics": _json_metrics(metrics),
        })
    session.ray_train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=dir_name)


_SAID_STALE: set[int] = set()


def _say_stale_checkpoint_dropped(rank: int) -> None:
    if rank not in _SAID_STALE:
        _SAID_STALE.add(rank)
        logger.info("rank %d passes no checkpoint while the plan has left it out since the last copy of rank 0's "
                    "state (its files would be stale); rank 0's checkpoint is the run's", rank)


def _copy_tables_before_the_checkpoint(session: WorkerSession) -> bool:
    """Collective; whether the tables reached the storage URI, on every rank.

    On URI storage the tables reach it before Ray Train registers the checkpoint
    (runs/remote_copy.py). Copied after, a driver that died in between left a resume on
    another machine a checkpoint past the steps the URI's tables held: the rows of those
    steps were lost. Every rank has flushed its rows; this all-reduce says so to rank 0,
    which has the store copy the tables and waits for it, then tells every rank how it
    went. A copy that failed (the store gone with a crashed driver, a URI that refused it)
    means no rank reports its checkpoint this time: training goes on, and the next
    checkpoint copies again."""
    device = session.identity.collective_device
    dist.all_reduce(torch.zeros(1, dtype=torch.int64, device=device))
    copied = torch.ones(1, dtype=torch.int64, device=device)
    if session.identity.rank == 0:
        try:
            copied[0] = int(bool(ray.get(session.store.checkpoint_reached.remote(), timeout=TABLE_COPY_TIMEOUT_S)))
        except Exception as e:  # noqa: BLE001 - a slow or restarting store must not stop training
            logger.warning("the run's tables did not reach the storage URI (%s: %s)", type(e).__name__, e)
            copied[0] = 0
        if not copied[0]:
            logger.warning("this checkpoint is not reported: a resume from it would lack the rows of its steps at "
                           "the storage URI; the next checkpoint copies the tables again")
    dist.broadcast(copied, src=0)
    return bool(copied[0])


def check_loss_is_finite(loss, global_step: int, rank: int) -> None:
    """A NaN or infinite loss stops the run (a :class:`UserError`: not retried, since a
    restart from the last checkpoint would meet it again); None and non-numbers pass.

    Every step after such a loss trains on garbage while the run still ends "finished";
    ``HeteroConfig(allow_non_finite_loss=True)`` (``hetero-ray train --allow-non-finite-loss``)
    is the way to train on regardless.
    """
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            return
        loss = loss.detach().item()
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or math.isfinite(loss):
        return
    raise UserError(f"the loss is {loss} at global step {global_step} on rank {rank}, so training stopped: every "
                    "later step would train on it. Lower the learning rate or check the data for NaN or infinite "
                    "values; HeteroConfig(allow_non_finite_loss=True) or hetero-ray train --allow-non-finite-loss "
                    "lets a run train on regardless")


def read_state(checkpoint: ray.train.Checkpoint) -> dict:
    """hetero_ray's part of a checkpoint; a checkpoint without one is a :class:`UserError`."""
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, STATE_DIR, STATE_FILE)
        if not os.path.exists(path):
            raise UserError(
                f"the checkpoint to resume from ({checkpoint.path}) has no {STATE_DIR}/{STATE_FILE}, so the "
                "position in the data is unknown and exactly-once cannot hold; report checkpoints with "
                "hetero_ray.train.report, not ray.train.report"
            )
        try:
            with open(path) as f:
                state = json.load(f)
            if state.get("format_version") != STATE_FORMAT_VERSION:
                raise ValueError(f"unknown format {state.get('format_version')!r}")
            balancer_path = os.path.join(directory, STATE_DIR, BALANCER_STATE_FILE)
            if os.path.exists(balancer_path):
                with open(balancer_path) as f:
                    state["balancer"] = json.load(f)
        except (OSError, ValueError) as e:
            raise UserError(f"{path} cannot be read ({e}); the checkpoint is damaged, so the run cannot "
                            "continue from it; start a new run under another RunConfig(name=...)") from None
    return state


def check_data_matches(restored: Optional[dict], data_order: dict) -> None:
    """A restored position is only valid for the same data order: same dataset length,
    global batch, seed, shuffle and drop_last."""
    if not restored:
        return
    saved = restored.get("data_order", {})
    changed = {k: (saved.get(k), v) for k, v in data_order.items() if saved.get(k) != v}
    if changed:
        described = ", ".join(f"{k} was {a!r}, now {b!r}" for k, (a, b) in changed.items())
        raise UserError(f"the checkpoint this run resumes from was made with another data order ({described}); "
                        "the position in the epoch would not mean the same samples. Resume with the original "
                        "dataset and settings, or start a new run under another RunConfig(name=...)")


def _write_state(session: WorkerSession, checkpoint: ray.train.Checkpoint, position, loader) -> None:
    directory = checkpoint.path
    if not os.path.isdir(directory):
        raise UserError(f"hetero_ray.train.report: the checkpoint must be a local directory "
                        f"(Checkpoint.from_directory), got {directory}")
    folder = os.path.join(directory, STATE_DIR)
    os.makedirs(folder, exist_ok=True)
    plan = loader.plan if loader is not None else session.restored_plan
    state = {
        "format_version": STATE_FORMAT_VERSION,
        "position": position.to_dict(),
        "plan": plan.to_dict() if plan is not None else None,
        "data_order": loader.data_order() if loader is not None else (session.restored or {}).get("data_order"),
    }
    with open(os.path.join(folder, STATE_FILE), "w") as f:
        json.dump(state, f)
    try:
        balancer_state = answer(session.planner.checkpoint_state.remote(), 5)
    except Exception as e:  # noqa: BLE001 - the checkpoint matters more than this part of it
        logger.warning("planner estimates not saved with this checkpoint (%s)", type(e).__name__)
        return
    with open(os.path.join(folder, BALANCER_STATE_FILE), "w") as f:
        json.dump(balancer_state, f)


def _lowest_rank_with_checkpoint(identity: WorkerIdentity, has_checkpoint: bool) -> Optional[int]:
    """Collective: the lowest rank that passes a checkpoint, or None when none does."""
    flags = torch.zeros(identity.num_workers, dtype=torch.int64, device=identity.collective_device)
    flags[identity.rank] = int(has_checkpoint)
    dist.all_reduce(flags)
    ranks = flags.nonzero().flatten().tolist()
    return ranks[0] if ranks else None


def _checkpoint_dir_name(session: WorkerSession, global_step: int, restored_name: Optional[str]) -> str:
    """``checkpoint_<global step>``, with a suffix when a step is checkpointed again —
    never the name of the checkpoint this group resumed from (``restored_name``), which
    Ray Train holds as its latest (see :func:`next_checkpoint_count`)."""
    count = next_checkpoint_count(global_step, session.checkpoints_at.get(global_step, 0), restored_name)
    session.checkpoints_at[global_step] = count + 1
    return checkpoint_dir_name(global_step, count)


def _restored_checkpoint_name(session: WorkerSession) -> Optional[str]:
    """The folder name of the checkpoint this worker group started from, or None."""
    checkpoint = session.ray_train.get_checkpoint()
    return os.path.basename(checkpoint.path.rstrip("/")) if checkpoint is not None else None


def _json_metrics(metrics: dict) -> str:
    def plain(value):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return value.item()
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        return value

    return json.dumps({k: plain(v) for k, v in metrics.items()}, default=str)
