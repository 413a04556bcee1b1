"""The end of a run, however it ended: the store's tables merged, summary.json written
(with each rank's bottleneck verdict), checkpoints Ray Train never registered removed,
and, for a built-in run that finished, the final model.

It runs after training finished, failed or was stopped by hand, so it must not raise:
what it cannot write or read it says, and goes on; a failure it meets becomes the run's
failure. summary.json is written with whatever could be read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

import ray

from hetero_ray.errors import TrainingFailed
from hetero_ray.metrics.store import StoreWriteFailed
from hetero_ray.metrics.summary import build_summary
from hetero_ray.runs import checkpoints, run_files
from hetero_ray.runtime.failures import failure_for_user


@dataclass(frozen=True)
class Outcome:
    """How training ended, as the lifecycle saw it."""

    result: Any  # Ray Train's Result; None when fit() did not return one
    wall_time_s: float
    error: Optional[BaseException] = None
    # The signal's name when one stopped training before its end: the summary says
    # "interrupted" (not "finished"), and there is no final model.
    interrupted_by: Optional[str] = None
    nodes: Optional[list[dict]] = None  # the node profiles, for the bottleneck verdicts


def finish_run(run_dir: str, store, planner, outcome: Outcome, summary_base: dict[str, Any], *,
               final_model: Optional[Callable[[str], Any]] = None,
               emit: Callable[[str], None] = print) -> tuple[dict[str, Any], Optional[Exception]]:
    """Merges the tables, writes summary.json (and the final model, when the job says how
    to read it from its last checkpoint); never raises.

    Each piece is guarded on its own: a piece that fails is said (``emit``) and the next
    one runs, so summary.json is written with whatever could be read.

    Args:
        summary_base: summary.json's fields that describe the job, not its outcome.
        final_model: reads the trained model's state from a checkpoint's directory; it is
            saved as the run's model file. None: a user's loop keeps its own checkpoints.

    Returns the summary and, for a failed run, the exception to raise (see
    :func:`failure_for_user`). A store that stopped writing fails the run even when
    training itself finished: its last rows are missing.
    """
    result, error, interrupted_by = outcome.result, outcome.error, outcome.interrupted_by
    try:
        ray.get(planner.close.remote(), timeout=30)
    except Exception as e:  # noqa: BLE001 - a lost decision row is not worth failing the run
        emit(f"[hetero_ray] warning: planner could not flush its last decision ({e})")
    try:
        store_failure = ray.get(store.failure.remote(), timeout=30)
        if store_failure and error is None:
            error = StoreWriteFailed(store_failure["message"])
        ray.get(store.finalize.remote(), timeout=120)
    except Exception as e:  # noqa: BLE001 - still summarise what is on disk
        emit(f"[hetero_ray] warning: metrics store could not finalise ({e}); reading parts")
    _guarded(emit, "removing unregistered checkpoints", _remove_unregistered_checkpoints, run_dir)
    if (final_model is not None and error is None and interrupted_by is None and result is not None
            and result.checkpoint is not None):
        try:
            _write_final_model(result.checkpoint, final_model, os.path.join(run_dir, run_files.MODEL_FILE))
        except Exception as e:  # noqa: BLE001 - the run's outcome: it failed to deliver its model
            error = e
    steps, epochs, plans = (_read_table(run_dir, table, emit) for table in ("steps", "epochs", "plans"))
    attempts = _guarded(emit, f"reading {run_files.ATTEMPTS_FILE}", run_files.read_json,
                        os.path.join(run_dir, run_files.ATTEMPTS_FILE), []) or []
    status = "failed" if error is not None else ("interrupted" if interrupted_by else "finished")
    base = {**summary_base, "wall_time_s": outcome.wall_time_s, "status": status, "error": None, "run_dir": run_dir}
    summary = _guarded(emit, "summarising the run", build_summary, steps, epochs, plans, attempts, base=base)
    if summary is None:  # the outcome is still worth a file: what the run was and how it ended
        summary = {**base, "global_steps": int(steps["global_step"].nunique()) if "global_step" in steps else 0}
    if interrupted_by:
        summary["interrupted_by"] = interrupted_by
    failure = None
    if error is not None:
        failure = _guarded(emit, "describing the failure", failure_for_user, error, run_dir,
                           summary.get("global_steps", 0))
        if failure is None:
            failure = TrainingFailed(f"training failed: {error}; what was recorded is in {run_dir}")
        summary["error"] = str(failure)
    summary["bottlenecks"] = _bottlenecks(steps, outcome.nodes)
    path = os.path.join(run_dir, run_files.SUMMARY_FILE)
    try:
        run_files.write_json(path, summary)
    except Exception as e:  # noqa: BLE001 - said, with the outcome, instead of raised
        emit(f"[hetero_ray] {path} could not be written ({getattr(e, 'strerror', None) or e}); status: "
             f"{summary['status']}" + (f", error: {summary['error']}" if summary["error"] else ""))
    return summary, failure


def _guarded(emit: Callable[[str], None], what: str, function: Callable, *args, **kwargs):
    """``function(*args, **kwargs)``, or None after saying why it failed: finishing goes on."""
    try:
        return function(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - finish_run must not raise; the piece is named instead
        emit(f"[hetero_ray] warning: {what} failed ({type(e).__name__}: {e})")
        return None


def _read_table(run_dir: str, table: str, emit: Callable[[str], None]):
    """A table for the summary; an unreadable one is said and summarised as empty."""
    from hetero_ray.runs.records import SCHEMAS

    df = _guarded(emit, f"reading the {table} table", run_files.read_table, run_dir, table)
    return df if df is not None else SCHEMAS[table].empty_table().to_pandas()


def _remove_unregistered_checkpoints(run_dir: str) -> None:
    """Removes checkpoint folders Ray Train never registered: uploads cut short (a full
    disk, a killed worker). Ray restores only registered ones, and a half-written
    checkpoint must not look like a good one to a person or a later tool."""
    import shutil

    train_dir = checkpoints.ray_train_dir(run_dir)
    try:
        registered = checkpoints.registered_checkpoint_names(run_dir)
        names = [n for n in os.listdir(train_dir) if n.startswith("checkpoint_") and n not in registered
                 and os.path.isdir(os.path.join(train_dir, n))]
    except (OSError, ValueError):  # no folder, or a snapshot that cannot be read: delete nothing
        return
    for name in names:
        shutil.rmtree(os.path.join(train_dir, name), ignore_errors=True)


def _bottlenecks(steps, nodes: Optional[list[dict]]) -> list[dict]:
    """Per-rank verdicts by the one rule of :func:`hetero_ray.bottlenecks.judge.judge_run`,
    with the memory caps the planner gives the ranks of ``nodes`` (the profiles, if any)."""
    from hetero_ray.bottlenecks.judge import judge_run

    try:
        return judge_run(steps, nodes)
    except Exception as e:  # noqa: BLE001 - a summary without verdicts beats no summary
        return [{"error": f"bottleneck analysis failed: {e}"}]


def _write_final_model(checkpoint, read_model: Callable[[str], Any], path: str) -> None:
    import torch

    with checkpoint.as_directory() as directory:
        model = read_model(directory)
    tmp = path + ".tmp"
    try:
        torch.save(model, tmp)
        run_files.fsync_file(tmp)  # on disk before the rename makes it the final model
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    run_files.fsync_dir(os.path.dirname(path))
