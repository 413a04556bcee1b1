"""Which checkpoint a run continues from: the one Ray Train registered.

A restart, a ``--resume``, a restarted balancer and the driver's summary all ask the same
question of a run directory; Ray Train's checkpoint snapshot answers it.
"""

from __future__ import annotations

import os
from typing import Optional

from hetero_ray.constants import RAY_TRAIN_SUBDIR
from hetero_ray.errors import UserError
from hetero_ray.runs.checkpoint_names import POSITION_FILE, STATE_DIR, STATE_FILE, checkpoint_order
from hetero_ray.runs.run_files import read_json, write_json

RAY_CHECKPOINT_SNAPSHOT = "checkpoint_manager_snapshot.json"


def latest_checkpoint_dir(run_dir: str) -> str | None:
    """The checkpoint a restart or --resume continues from: the one Ray Train registered.

    Ray Train's snapshot decides. A checkpoint folder can exist on storage seconds before
    Ray registers it (its controller takes the workers' reports in turn), and Ray does not
    restore an unregistered one, so neither does anything here.
    """
    train_dir = ray_train_dir(run_dir)
    snapshot = read_json(os.path.join(train_dir, RAY_CHECKPOINT_SNAPSHOT)) or {}
    latest = (snapshot.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name")
    if latest and any(os.path.exists(os.path.join(train_dir, latest, marker)) for marker in _POSITION_MARKERS):
        return os.path.join(train_dir, latest)
    return None


# A checkpoint of hetero_ray's: the built-in loop's position file, or the state a user
# loop's checkpoint carries (hetero_ray.train.report).
_POSITION_MARKERS = (POSITION_FILE, os.path.join(STATE_DIR, STATE_FILE))


def rebuild_torn_snapshot(run_dir: str) -> Optional[str]:
    """Replaces a snapshot cut short by one listing the run's checkpoint folders; returns
    the one a resume then continues from (None: there is none, and nothing was written).

    Ray Train rewrites its snapshot in place (it truncates the file, then writes it), so a
    driver or machine lost in that moment leaves it empty or cut short, and Ray Train could
    restore nothing. The folders still hold the checkpoints it listed. The newest is left
    out: the loss may have cut its copy (a later report's upload runs while the one before
    it is registered), and it is removed, as a finished run removes the folders Ray Train
    never registered (a resumed run could otherwise copy a new checkpoint into it). Each one
    listed carries its position as its metrics. Written whole or not at all (fsync, then
    rename).
    """
    import shutil

    import ray

    train_dir = ray_train_dir(run_dir)
    found = []
    for name in os.listdir(train_dir):
        order = checkpoint_order(name)
        position = _position(os.path.join(train_dir, name)) if order is not None else None
        if position is not None:
            found.append((order, name, position))
    ordered = [(name, position) for _, name, position in sorted(found)]
    kept = ordered[:-1]
    if not kept:
        return None
    results = [{"version": 0, "checkpoint_dir_name": name, "metrics": position} for name, position in kept]
    write_json(os.path.join(train_dir, RAY_CHECKPOINT_SNAPSHOT), {
        "ray_version": ray.__version__, "checkpoint_results": results,
        "checkpoint_report_indices": list(range(len(results))), "latest_checkpoint_result": results[-1],
        "pending_training_results": [], "pending_validation_specs": [], "current_report_index": len(results),
        "validated_checkpoint_dir_names": [], "timed_out_validation_checkpoint_dir_names": [],
        "failed_validation_checkpoint_dir_names": []})
    shutil.rmtree(os.path.join(train_dir, ordered[-1][0]), ignore_errors=True)
    return os.path.join(train_dir, kept[-1][0])


def repair_torn_snapshot(run_dir: str, start_afresh: str) -> Optional[str]:
    """Before a run continues: where Ray Train's snapshot was cut short, rebuilds it
    (:func:`rebuild_torn_snapshot`) and returns the line that says so; None where it reads.
    The built-in job's --resume and a user's fit() again meet the same torn file.

    Raises:
        UserError: it cannot be read and no checkpoint folder before the newest holds a
            position to rebuild it from (``start_afresh``: what to do instead).
    """
    try:
        latest_checkpoint_dir(run_dir)
        return None
    except ValueError as e:  # Ray Train's list of checkpoints, cut short (a lost machine) or edited
        snapshot = os.path.join(ray_train_dir(run_dir), RAY_CHECKPOINT_SNAPSHOT)
        checkpoint_dir = rebuild_torn_snapshot(run_dir)
        if checkpoint_dir is None:
            raise UserError(f"{snapshot} is not valid JSON ({e}) and no checkpoint folder before the newest one "
                            f"holds a position, so the run's latest checkpoint is unknown; {start_afresh}") from None
        return (f"[hetero_ray] {snapshot} was cut short ({e}); rebuilt from the checkpoint folders, the newest "
                f"left out (its copy may have been cut too): resuming from {checkpoint_dir}")


def _position(checkpoint_dir: str) -> Optional[dict]:
    """The position a hetero_ray checkpoint resumes at (None: none readable there)."""
    for marker in _POSITION_MARKERS:
        try:
            position = (read_json(os.path.join(checkpoint_dir, marker)) or {}).get("position")
        except (ValueError, AttributeError):
            continue
        if isinstance(position, dict) and position:
            return position
    return None


def ray_train_dir(run_dir: str) -> str:
    """Where Ray Train keeps a run's checkpoints: the run directory itself (Ray Train's
    ``storage_path / name``), or ``ray_train/`` in runs of ``hetero-ray train`` written by
    versions before it became a user of HeteroTrainer (still read: reports, dashboards)."""
    nested = os.path.join(run_dir, RAY_TRAIN_SUBDIR)
    return nested if os.path.isdir(nested) else run_dir


def registered_checkpoint_names(run_dir: str) -> set[str]:
    """Names of the checkpoint folders Ray Train's snapshot lists (the only ones it restores)."""
    snapshot = read_json(os.path.join(ray_train_dir(run_dir), RAY_CHECKPOINT_SNAPSHOT)) or {}
    results = list(snapshot.get("checkpoint_results") or []) + [snapshot.get("latest_checkpoint_result") or {}]
    return {r["checkpoint_dir_name"] for r in results if r.get("checkpoint_dir_name")}


def describe_latest(run_dir: str) -> str:
    """The checkpoint a resume continues from, for a person: ``the checkpoint at global step
    40 (epoch 1, step 8): <dir>``; ``the last checkpoint reported`` where the run directory
    does not hold it (URI storage) or its position cannot be read."""
    try:
        directory = latest_checkpoint_dir(run_dir)
    except ValueError:  # Ray Train's snapshot, cut short: a resume says so
        directory = None
    if directory is None:
        return "the last checkpoint reported"
    position = _position(directory)
    if position:
        return (f"the checkpoint at global step {position.get('global_step')} "
                f"(epoch {position.get('epoch')}, step {position.get('step')}): {directory}")
    return f"the checkpoint in {directory}"
