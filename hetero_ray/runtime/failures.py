"""Failures a retry cannot fix, and the one message a person gets for a failed run.

Some failures are not worth Ray Train's retries: a worker's :class:`UserError` (a corrupt
checkpoint, missing data on a node) and a full disk fail the same way every time, and a
metrics store that can no longer write would leave training running unrecorded. So does
an exception from the user's loop that every rank raised at the same global step, or that
came again at the same step after a restart (:class:`RepeatedFailures`): the same code on
the same data from the same checkpoint meets it every time.
:class:`RunGuard` stops those runs at once, and :func:`failure_for_user` turns what Ray
raises into one message that says what happened, where, and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Optional

import ray
from ray.train import ControllerError
# Ray Train's hook after every poll of the workers (a DeveloperAPI, pinned with ray 2.60):
# the one place a run can be stopped without counting as a retryable worker failure.
from ray.train.v2._internal.execution.callback import WorkerGroupCallback

from hetero_ray.constants import METRICS_STORE_ROLE
from hetero_ray.errors import LoopFailsEveryTime, TrainingFailed, UserError
from hetero_ray.metrics.store import StoreWriteFailed
from hetero_ray.runs.writer import free_space, is_disk_full
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
      from then on would be recorded nowhere;
    - the user's loop raised the same exception at the same global step on every rank, or
      again after a restart (:class:`RepeatedFailures`): it is raised as a
      :class:`LoopFailsEveryTime` with the loop's traceback.

    Raising a ``ControllerError`` (not a worker error) is what makes Ray Train shut the
    workers down and raise it from ``fit()`` instead of restarting them.
    """

    def __init__(self, experiment_name: str):
        self._experiment_name = experiment_name
        self._store = None
        self._asked = None  # the store's pending answer to failure()
        self._failures = RepeatedFailures()

    def before_worker_group_start(self, worker_group_context) -> None:
        self._failures.new_worker_group()

    def after_worker_group_poll_status(self, worker_group_status) -> None:
        for error in worker_group_status.errors.values():
            if _fatal_cause(error) is not None:
                raise ControllerError(error)
        statuses = worker_group_status.worker_statuses
        repeated = self._failures.judge({rank: loop_failure(status.error) for rank, status in statuses.items()
                                         if status.error is not None}, len(statuses))
        if repeated is not None:
            raise ControllerError(repeated)
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


@dataclass(frozen=True)
class LoopFailure:
    """A rank's exception from the user's loop, marked with the global step it came at
    (``training/rank/entry.py``); ``traceback`` is the worker's, and no part of the identity."""

    error_type: str
    message: str
    global_step: int
    traceback: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        return self.error_type, self.message, self.global_step


def loop_failure(error: Optional[BaseException]) -> Optional[LoopFailure]:
    """The loop failure behind a worker's error (as Ray Train reports it), None when the
    error is no marked exception of the user's loop (a lost peer, a Ray error)."""
    from hetero_ray.training.rank.entry import failed_at_step

    if error is None:
        return None
    base = getattr(error, "_base_exc", error)  # Ray Train's UserExceptionWithTraceback
    step = failed_at_step(base)
    if not isinstance(step, int):
        return None
    traceback = str(error) if base is not error else ""
    return LoopFailure(type(base).__name__, str(base), step, traceback)


class RepeatedFailures:
    """Tells when the user's loop failed in a way every retry would meet again.

    Plain class (Ray Train's poll results come in as values): :meth:`new_worker_group` at
    every worker-group start, :meth:`judge` with the failures of each poll. A failure will
    happen again when every rank of the group raised the same exception (type and message)
    at the same global step, or when one rank's exception is one an earlier worker group
    raised at that step: the restart came back from its checkpoint to the same code on the
    same data, and met it again. Anything else (a lost node, ranks failing differently) is
    left to Ray Train's retries.
    """

    def __init__(self):
        self._group = 0
        self._seen: dict[tuple[str, str, int], int] = {}  # failure → the first worker group that raised it

    def new_worker_group(self) -> None:
        self._group += 1

    def judge(self, failures: Mapping[int, Optional[LoopFailure]], num_workers: int) -> Optional[LoopFailsEveryTime]:
        """``failures``: the failed ranks' loop failures (None: not one of the loop's);
        returns the error that stops the run, or None."""
        marked = {rank: f for rank, f in failures.items() if f is not None}
        if not marked:
            return None
        rank, first = min(marked.items())
        if len(marked) == num_workers > 1 and len({f.key for f in marked.values()}) == 1:
            return _fails_every_time(first, rank, f"on every rank ({num_workers})")
        for rank, failure in sorted(marked.items()):
            if self._seen.get(failure.key, self._group) < self._group:
                return _fails_every_time(failure, rank, "again after a restart from the last checkpoint")
        for failure in marked.values():
            self._seen.setdefault(failure.key, self._group)
        return None


def _fails_every_time(failure: LoopFailure, rank: int, how: str) -> LoopFailsEveryTime:
    traceback = failure.traceback.strip()
    return LoopFailsEveryTime(
        f"train_loop_per_worker raised {failure.error_type}: {failure.message} at global step "
        f"{failure.global_step} {how}; a restart would meet it again. Fix the loop and run again."
        + (f" The loop's traceback (rank {rank}):\n{traceback}" if traceback else ""))


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


def _fatal_cause(error: BaseException) -> Optional[BaseException]:
    """The UserError, store failure or full disk behind ``error``, if any (else None)."""
    causes = list(_causes(error))
    for cause in causes:
        if isinstance(cause, (UserError, StoreWriteFailed)):
            return cause
    return next((cause for cause in causes if is_disk_full(cause)), None)


def failure_for_user(error: BaseException, run_dir: str, steps_on_disk: int) -> Exception:
    """What to raise for a failed run: a UserError (exit 2) for bad input met by a worker
    (a LoopFailsEveryTime stays one), a TrainingFailed with what, where and what to do for a
    full disk, else the error."""
    cause = _fatal_cause(error)
    recorded = f"the run's files up to step {steps_on_disk} are in {run_dir}"
    if isinstance(cause, UserError):
        kind = LoopFailsEveryTime if isinstance(cause, LoopFailsEveryTime) else UserError
        return kind(f"{cause} (the run stopped without retrying; {recorded})")
    if isinstance(cause, StoreWriteFailed):
        return TrainingFailed(f"training stopped: the metrics store could not write: {cause}; free space or "
                              f"choose another --storage-path; {recorded}")
    if cause is not None:  # a full disk met by a worker (Ray Train's checkpoint upload) or the driver
        # The error rarely names its file; how much room the run's disk has left tells a
        # full --storage-path from a full temporary folder on a worker.
        where = (f"disk full at {cause.filename}" if getattr(cause, "filename", None) else
                 f"disk full at {run_dir} while saving a checkpoint "
                 f"({free_space(run_dir)})")
        return TrainingFailed(f"training stopped: {where} ({_first_line(cause)}); free space or choose another "
                              f"--storage-path; {recorded}")
    return TrainingFailed(f"training failed: {error}; what was recorded is in {run_dir}")


def _first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"
