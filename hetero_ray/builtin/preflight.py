"""Checks of files and directories before a run starts: fail before writing anything.

Runs after :class:`~hetero_ray.builtin.config.TrainConfig` validated the values themselves and
before the run directory is created, so bad input leaves nothing behind.
"""

from __future__ import annotations

import os
import tempfile

from hetero_ray.builtin.checkpointing import load_state, model_shapes, run_fingerprint
from hetero_ray.builtin.config import FILE_DATASETS, TrainConfig, changed_on_resume
from hetero_ray.constants import RAY_TRAIN_SUBDIR
from hetero_ray.errors import UserError
from hetero_ray.runs.checkpoints import latest_checkpoint_dir, repair_torn_snapshot
from hetero_ray.runs.run_files import CONFIG_FILE, read_json


def run_dir_of(config: TrainConfig) -> str:
    return os.path.abspath(os.path.join(config.storage_path, config.name))


def check(config: TrainConfig) -> str:
    """Validates data, output and resume state; returns the run directory's path."""
    if config.dataset in FILE_DATASETS:
        from hetero_ray.builtin.data import check_data_dir

        check_data_dir(config.dataset, config.data_dir, download=config.download,
                       verify_checksums=config.verify_checksums)
    check_output_dir(config.storage_path)
    return check_run_dir(config)


def check_run_dir(config: TrainConfig) -> str:
    """The run directory: new unless --resume, and then one a resume can continue;
    returns its path. Run again under the directory's lock, where nothing can change it."""
    run_dir = run_dir_of(config)
    if config.resume:
        check_resumable(run_dir, config)
    elif os.path.exists(run_dir):
        raise UserError(
            f"run directory {run_dir} already exists; pass --resume to continue that run, or "
            "choose another --name (nothing was overwritten)"
        )
    return run_dir


def check_output_dir(output_dir: str) -> None:
    path = os.path.abspath(output_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--storage-path {output_dir} exists and is not a directory; choose a directory")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    problem = None
    if not os.path.isdir(existing):
        problem = f"{existing} is not a directory"
    else:
        try:  # the only reliable test (root passes os.access everywhere): write, then remove
            with tempfile.TemporaryFile(dir=existing):
                pass
        except OSError as e:
            problem = f"cannot create files in {existing}: {e.strerror or e}"
    if problem:
        raise UserError(f"--storage-path {output_dir} cannot be written ({problem}); "
                        "choose a directory you can write to")


def check_resumable(run_dir: str, config: TrainConfig) -> None:
    """--resume: there is a checkpoint, made with these settings, that this model can load.

    The checkpoint is read here, on the driver (CPU, ``weights_only``), because a worker
    that meets a bad one only fails after the cluster has started, and Ray Train would
    retry it ``--max-failures`` times before saying why.
    """
    if os.path.isdir(os.path.join(run_dir, RAY_TRAIN_SUBDIR)):
        raise UserError(f"--resume: {run_dir} was written by an earlier hetero_ray, which kept Ray Train's "
                        f"checkpoints in {RAY_TRAIN_SUBDIR}/ (this one keeps them beside the tables); continue it "
                        "with the version that started it, or start a new run under another --name")
    checkpoint_dir = None
    if os.path.isdir(run_dir):
        try:
            note = repair_torn_snapshot(run_dir, "start again under another --name")
        except UserError as e:
            raise UserError(f"--resume: {e}") from None
        if note:
            print(note, flush=True)
        checkpoint_dir = latest_checkpoint_dir(run_dir)
    if checkpoint_dir is None:
        raise UserError(
            f"--resume: nothing to resume in {run_dir} (no checkpoint there). Check --storage-path "
            "and --name, or start a new run without --resume"
        )
    check_settings_unchanged(recorded_settings(run_dir, checkpoint_dir), config)
    check_checkpoint_loads(checkpoint_dir, config)


def recorded_settings(run_dir: str, checkpoint_dir: str) -> dict:
    """The settings the run was started with: its config.json, else (a run directory
    without one) the fingerprint its latest checkpoint carries; {} if neither is readable."""
    path = os.path.join(run_dir, CONFIG_FILE)
    try:
        saved = read_json(path)
    except ValueError as e:  # a truncated or hand-edited file
        raise UserError(f"--resume: {path} is not valid JSON ({e}); restore it "
                        "or start a new run with another --name") from None
    if saved is not None and not isinstance(saved, dict):
        raise UserError(f"--resume: {path} does not hold a configuration (a JSON object); restore it "
                        "or start a new run with another --name")
    if saved:
        return saved
    try:
        return dict(load_state(checkpoint_dir).fingerprint)
    except (UserError, TypeError, ValueError):  # check_checkpoint_loads says why
        return {}


def check_settings_unchanged(recorded: dict, config: TrainConfig) -> None:
    """Refuses a --resume that changes a setting of the training (see
    :data:`hetero_ray.builtin.config.RESUME_MAY_CHANGE` for those that may change)."""
    changes = changed_on_resume(recorded, config)
    if changes:
        raise UserError(
            f"--resume cannot change settings that change the training: {'; '.join(changes)}. Resume with "
            "the original values, or start a new run under another --name"
        )


def check_checkpoint_loads(checkpoint_dir: str, config: TrainConfig) -> None:
    """Raises the :class:`UserError` of :func:`load_state` for a corrupt or foreign checkpoint."""
    try:
        load_state(checkpoint_dir, run_fingerprint(config), expected_shapes=model_shapes(config.model, config.dataset))
    except UserError as e:
        raise UserError(f"--resume: {e}") from None
