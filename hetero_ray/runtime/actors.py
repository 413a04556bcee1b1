"""Named actors of an experiment: plain classes wrapped by one factory.

Every actor lives in the ``hetero_ray`` namespace as ``<experiment>/<role>`` so that the
Ray dashboard shows what it is and the performance app finds running experiments by
listing actors. They take no CPU (they are bookkeeping, and must never keep training
workers from being placed) and restart after a crash.

The names make an experiment's name unique on a cluster while it runs: a second run of
the same name would otherwise talk to the first one's actors and write into its files.
:func:`check_name_free` refuses it before it writes anything, and :func:`start_actor`
never attaches to an actor that already exists.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

import ray
# Ray Train's hook as its controller starts (a DeveloperAPI, pinned with ray 2.60); an
# exception there ends fit() without a retry.
from ray.train.v2._internal.execution.callback import ControllerCallback
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hetero_ray.constants import (
    DEFAULT_PARQUET_FLUSH_INTERVAL_S, DEFAULT_STORE_MAX_RECENT_STEPS, METRICS_STORE_ROLE,
    PARQUET_FLUSH_INTERVAL_S_ENV_VAR, PLANNER_ROLE, RAY_NAMESPACE, STORE_MAX_RECENT_STEPS_ENV_VAR, actor_name,
    data_feed_role, env_float,
)
from hetero_ray.errors import TrainingFailed, UserError
from hetero_ray.metrics.store import MetricsStore
from hetero_ray.runtime.data_feed import DataFeed
from hetero_ray.runtime.planner_actor import PlannerActor

EXPERIMENT_ROLES = (METRICS_STORE_ROLE, PLANNER_ROLE)  # what every run starts
_KILL_WAIT_S = 30.0  # a killed actor is gone in well under a second; this only bounds a hung GCS
_FEED_CLOSE_WAIT_S = 10.0  # Ray Data gives a stopping execution 2 s; a feed holds at most a few
# Starting an actor's process (a Python with torch imported) takes seconds on an idle
# machine and can take minutes on a loaded one: the calls after it, with their own short
# timeouts, only start once it is up.
ACTOR_START_TIMEOUT_S = 300.0
_ACTOR_START_NOTE_S = 15.0  # how long a start may take before the wait says what it waits for


def check_name_free(experiment_name: str, option: str) -> None:
    """Raises a :class:`UserError` when a run of ``experiment_name`` is alive on this cluster.

    Call it after connecting and before writing anything. ``option`` says how the person
    chose the name (``--name``, ``RunConfig(name=...)``), for the message.
    """
    alive = [actor_name(experiment_name, role) for role in EXPERIMENT_ROLES if _exists(experiment_name, role)]
    if alive:
        raise UserError(_name_taken(experiment_name, option, alive))


def _exists(experiment_name: str, role: str) -> bool:
    try:
        ray.get_actor(actor_name(experiment_name, role), namespace=RAY_NAMESPACE)
    except ValueError:
        return False
    return True


def _name_taken(experiment_name: str, option: str, actor_names: list[str]) -> str:
    return (f"a run named {experiment_name!r} is already running on this Ray cluster (its actors "
            f"{', '.join(actor_names)} are alive in namespace {RAY_NAMESPACE!r}); a second run of one name would "
            f"share them and write into the other run's files. Choose another {option}, or wait until that run "
            "has ended (nothing was written)")


def start_actor(cls: type, experiment_name: str, role: str, *args: Any,
                node_id: Optional[str] = None, wait: bool = True, max_concurrency: int = 1,
                **kwargs: Any) -> "ray.actor.ActorHandle":
    """Starts the experiment's actor for ``role`` and returns once it is up.

    Args:
        node_id: pin the actor to this node (e.g. the driver's, where the run directory is).
        wait: False returns at once (its name is taken already); :func:`wait_until_started`
            then waits, so that two actors start side by side.
        max_concurrency: calls it serves at once, in threads (it then locks its own state).

    Raises:
        UserError: the name is taken: another run of this experiment started in the moment
            since :func:`check_name_free` (never attach to its actors).
        TrainingFailed: it did not start within :data:`ACTOR_START_TIMEOUT_S`.
    """
    name = actor_name(experiment_name, role)
    options: dict[str, Any] = dict(
        name=name,
        namespace=RAY_NAMESPACE,
        num_cpus=0,
        max_restarts=-1,
        max_task_retries=-1,
        max_concurrency=max_concurrency,
    )
    if node_id is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    try:
        handle = ray.remote(cls).options(**options).remote(*args, **kwargs)
    except ray.exceptions.ActorAlreadyExistsError:
        raise UserError(_name_taken(experiment_name, "experiment name", [name])) from None
    if wait:
        wait_until_started(handle, name)
    return handle


def wait_until_started(handle, name: str) -> None:
    """Returns once the actor is up; kills it (its name must not block the next run) and
    raises when it is not up within :data:`ACTOR_START_TIMEOUT_S` or its constructor failed."""
    try:
        _wait_until_started(handle, name)
    except BaseException:
        kill_actor(handle)
        raise


def _wait_until_started(handle, name: str) -> None:
    ready = handle.__ray_ready__.remote()
    if ray.wait([ready], timeout=_ACTOR_START_NOTE_S)[0]:
        ray.get(ready)  # raises what its constructor raised
        return
    print(f"[hetero_ray] waiting for the run's actor {name} to start (a loaded machine; at most "
          f"{ACTOR_START_TIMEOUT_S:.0f} s)", flush=True)
    try:
        ray.get(ready, timeout=ACTOR_START_TIMEOUT_S - _ACTOR_START_NOTE_S)
    except ray.exceptions.GetTimeoutError:
        raise TrainingFailed(f"the run's actor {name} did not start within {ACTOR_START_TIMEOUT_S:.0f} s; "
                             "`ray status` shows whether the cluster is short of memory or its nodes are "
                             "overloaded") from None


class ActorsStarted(ControllerCallback):
    """Ray Train's controller waits for the run's actors before its first worker group.

    The driver starts them without waiting (:func:`start_actor` ``wait=False``): each is a
    process of its own, and its start then overlaps the controller's instead of coming
    before it (a second or two of every ``fit()``). Nothing of the run calls them before
    the workers do, so the controller's start is the last moment to check that they are
    up; one whose constructor failed, or that is not up within
    :data:`ACTOR_START_TIMEOUT_S`, ends ``fit()`` at once (no retry would help).
    """

    def __init__(self, handles: dict[str, "ray.actor.ActorHandle"]):
        self._handles = handles  # by actor name

    def after_controller_start(self, train_run_context) -> None:
        for name, handle in self._handles.items():
            try:
                _wait_until_started(handle, name)
            except ray.exceptions.RayActorError as e:
                raise TrainingFailed(f"the run's actor {name} could not start: {e}") from None


def get_actor(experiment_name: str, role: str) -> "ray.actor.ActorHandle":
    return ray.get_actor(actor_name(experiment_name, role), namespace=RAY_NAMESPACE)


def start_metrics_store(experiment_name: str, run_dir: str, node_id: str, remote_run_uri: Optional[str] = None,
                        wait: bool = True):
    return start_actor(
        MetricsStore, experiment_name, METRICS_STORE_ROLE, run_dir, experiment_name,
        max_recent_steps=int(env_float(STORE_MAX_RECENT_STEPS_ENV_VAR, DEFAULT_STORE_MAX_RECENT_STEPS)),
        parquet_flush_interval_s=env_float(PARQUET_FLUSH_INTERVAL_S_ENV_VAR, DEFAULT_PARQUET_FLUSH_INTERVAL_S),
        remote_run_uri=remote_run_uri, node_id=node_id, wait=wait,
    )


def start_planner(experiment_name: str, run_dir: str, node_id: str, wait: bool = True, **planner_kwargs: Any):
    """The run's one planning authority (arguments of :class:`PlannerActor`). Needs the
    store started: the planner is handed its handle; ``run_dir`` keeps its state, so that a
    restart continues the plan in force."""
    store = get_actor(experiment_name, METRICS_STORE_ROLE)
    if isinstance(planner_kwargs.get("policy"), type):
        _ship_with_its_code(planner_kwargs["policy"])
    return start_actor(PlannerActor, experiment_name, PLANNER_ROLE, store, run_dir, node_id=node_id, wait=wait,
                       **planner_kwargs)


def _ship_with_its_code(cls: type) -> None:
    """A policy from a user's module (``--policy-module``, or a module their script imports)
    travels to the planner actor with its code, so the actor's node needs no copy of the
    module; hetero_ray's own are imported there, ``__main__``'s always travel so."""
    module = sys.modules.get(cls.__module__)
    if module is not None and cls.__module__ != "__main__" and not cls.__module__.startswith("hetero_ray."):
        ray.cloudpickle.register_pickle_by_value(module)


def start_data_feed(experiment_name: str, dataset_name: str, dataset, node_id: str):
    """The feed of a Ray Data dataset that follows the plan (:class:`DataFeed`); it serves
    every rank's request of a step at once. Not waited for: the first request waits."""
    return start_actor(DataFeed, experiment_name, data_feed_role(dataset_name), dataset, dataset_name,
                       node_id=node_id, wait=False, max_concurrency=16)


def stop_data_feed(handle) -> None:
    """Stops the feed's Ray Data executions (the one read ahead for an epoch that will not
    come among them), then kills it."""
    try:
        ray.get(handle.close.remote(), timeout=_FEED_CLOSE_WAIT_S)
    except Exception:  # noqa: BLE001 - a feed already gone or hung holds nothing killing it leaves behind
        pass
    kill_actor(handle)


def kill_actor(handle) -> None:
    """Kills an actor for good, and waits until it is dead: Ray frees its name only then,
    and the next run of the experiment (a --resume, a second fit() in this process) must
    not be refused as a concurrent one."""
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone is fine
        return
    deadline = time.monotonic() + _KILL_WAIT_S
    while time.monotonic() < deadline:
        try:
            ray.get(handle.__ray_ready__.options(max_task_retries=0).remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return  # dead
        except ray.exceptions.GetTimeoutError:
            continue
        time.sleep(0.05)  # the kill has not reached it yet
