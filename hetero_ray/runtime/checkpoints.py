"""Which checkpoint a run continues from: the one Ray Train registered.

A restart, a ``--resume``, a restarted balancer and the driver's summary all ask the same
question of a run directory; Ray Train's checkpoint snapshot answers it.
"""

from __future__ import annotations

import os

from hetero_ray.constants import RAY_TRAIN_SUBDIR
from hetero_ray.metrics.run_files import read_json
from hetero_ray.training.checkpoint_names import POSITION_FILE

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
_POSITION_MARKERS = (POSITION_FILE, os.path.join("hetero_ray", "state.json"))


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
    for marker in _POSITION_MARKERS:
        try:
            position = (read_json(os.path.join(directory, marker)) or {}).get("position")
        except ValueError:
            continue
        if position:
            return (f"the checkpoint at global step {position.get('global_step')} "
                    f"(epoch {position.get('epoch')}, step {position.get('step')}): {directory}")
    return f"the checkpoint in {directory}"
