"""Failures a retry cannot fix, and the one message a person gets for a failed run.

Some failures are not worth Ray Train's retries: a worker's :class:`UserError` (a corrupt
checkpoint, missing data on a node) and a full disk fail the same way every time, and a
metrics store that can no longer write would leave training running unrecorded.
:class:`RunGuard` stops those runs at once, and :func:`failure_for_user` turns what Ray
raises into one message that says what happened, where, and what to do.
"""

from __future__ import annotations

import os
from typing import Iterator, Optional

import ray
from ray.train import ControllerError
# Ray Train's hook after every poll of the workers (a DeveloperAPI, pinned with ray 2.60):
# the one place a run can be stopped without counting as a retryable worker failure.
from ray.train.v2._internal.execution.callback import WorkerGroupCallback

from hetero_ray.constants import METRICS_STORE_ROLE, RAY_TRAIN_SUBDIR
from hetero_ray.errors import TrainingFailed, UserError
from hetero_ray.metrics.run_writer import DISK_FULL_ERRNOS, free_space
from hetero_ray.metrics.store import StoreWriteFailed
from hetero_ray.runtime import actors


class RunGuard(WorkerGroupCallback):
    """Stops the run at once, without Ray Train's retries, where a retry cannot help.

    Runs in Ray Train's controller process after every poll of the workers (every
    ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s by default), so it must not block: the
    store is asked with a call whose answer is picked up at a later poll. It stops a run
    when

    - a worker failed with a :class:`UserError` or a full disk (a corrupt checkpoint, Ray
      Train's checkpoint upload): every retry would meet the same file or the same disk;
    - the metrics store stopped writing (:meth:`MetricsStore.failure`): the steps trained
      from then on would be recorded nowhere.

    Raising a ``ControllerError`` (not a worker error) is what makes Ray Train shut the
    workers down and raise it from ``fit()`` instead of restarting them.
    """

    def __init__(self, experiment_name: str):
        self._experiment_name = experiment_name
        self._store = None
        self._asked = None  # the store's pending answer to failure()

    def after_worker_group_poll_status(self, worker_group_status) -> None:
        for error in worker_group_status.errors.values():
            if _fatal_cause(error) is not None:
                raise ControllerError(error)
        failure = self._store_failure()
        if failure:
            raise ControllerError(StoreWriteFailed(failure["message"]))

    def _store_failure(self) -> Optional[dict]:
        """The store's answer to the question asked at the previous poll; asks again."""
        answer = None
        try:
            if self._asked is not None:
                ready, _ = ray.wait([self._asked], timeout=0)
                if not ready:
                    return None  # the store is busy (or restarting); the question stands
                asked, self._asked = self._asked, None
                answer = ray.get(asked)
            if self._store is None:
                self._store = actors.get_actor(self._experiment_name, METRICS_STORE_ROLE)
            self._asked = self._store.failure.remote()
        except Exception:  # noqa: BLE001 - a store restarting or not up yet: ask again next poll
            self._asked = None
        return answer


def _causes(error: BaseException) -> Iterator[BaseException]:
    """The error and everything it wraps: Ray Train's controller and worker errors,
    Ray's task errors, and Python's ``__cause__`` / ``__context__`` chains."""
    seen: set[int] = set()
    stack = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack.extend(getattr(e, "worker_failures", {}).values())  # WorkerGroupError
        stack.extend([getattr(e, "controller_failure", None),  # ControllerError
                      getattr(e, "_base_exc", None),  # Ray Train's UserExceptionWithTraceback
                      getattr(e, "cause", None),  # ray.exceptions.RayTaskError
                      e.__cause__, e.__context__])


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and (error.errno in DISK_FULL_ERRNOS or "No space left on device" in str(error))


def _fatal_cause(error: BaseException) -> Optional[BaseException]:
    """The UserError, store failure or full disk behind ``error``, if any (else None)."""
    causes = list(_causes(error))
    for cause in causes:
        if isinstance(cause, (UserError, StoreWriteFailed)):
            return cause
    return next((cause for cause in causes if is_disk_full(cause)), None)


def failure_for_user(error: BaseException, run_dir: str, steps_on_disk: int) -> Exception:
    """What to raise for a failed run: a UserError (exit 2) for bad input met by a worker,
    a TrainingFailed with what, where and what to do for a full disk, else the error."""
    cause = _fatal_cause(error)
    recorded = f"the run's files up to step {steps_on_disk} are in {run_dir}"
    if isinstance(cause, UserError):
        return UserError(f"{cause} (the run stopped without retrying; {recorded})")
    if isinstance(cause, StoreWriteFailed):
        return TrainingFailed(f"training stopped: the metrics store could not write: {cause}; free space or "
                              f"choose another --output-dir; {recorded}")
    if cause is not None:  # a full disk met by a worker (Ray Train's checkpoint upload) or the driver
        # The error rarely names its file; how much room the run's disk has left tells a
        # full --output-dir from a full temporary folder on a worker.
        where = (f"disk full at {cause.filename}" if getattr(cause, "filename", None) else
                 f"disk full at {os.path.join(run_dir, RAY_TRAIN_SUBDIR)} while saving a checkpoint "
                 f"({free_space(run_dir)})")
        return TrainingFailed(f"training stopped: {where} ({_first_line(cause)}); free space or choose another "
                              f"--output-dir; {recorded}")
    return TrainingFailed(f"training failed: {error}; what was recorded is in {run_dir}")


def _first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"
