"""Named actors of an experiment: plain classes wrapped by one factory.

Every actor lives in the ``hetero_ray`` namespace as ``<experiment>/<role>`` so that the
Ray dashboard shows what it is and the performance app finds running experiments by
listing actors. They take no CPU (they are bookkeeping, and must never keep training
workers from being placed) and restart after a crash.
"""

from __future__ import annotations

from typing import Any, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hetero_ray.constants import (
    BALANCER_ROLE, DEFAULT_PARQUET_FLUSH_INTERVAL_S, DEFAULT_STORE_MAX_RECENT_STEPS, METRICS_STORE_ROLE,
    PARQUET_FLUSH_INTERVAL_S_ENV_VAR, RAY_NAMESPACE, SCHEDULER_ROLE,
    STORE_MAX_RECENT_STEPS_ENV_VAR, actor_name, env_float,
)
from hetero_ray.metrics.store import MetricsStore
from hetero_ray.scheduler import Scheduler


def start_actor(cls: type, experiment_name: str, role: str, *args: Any,
                node_id: Optional[str] = None, **kwargs: Any) -> "ray.actor.ActorHandle":
    """Starts (or finds, if it already runs) the experiment's actor for ``role``.

    Args:
        node_id: pin the actor to this node (e.g. the driver's, where the run directory is).
    """
    options: dict[str, Any] = dict(
        name=actor_name(experiment_name, role),
        namespace=RAY_NAMESPACE,
        get_if_exists=True,
        num_cpus=0,
        max_restarts=-1,
        max_task_retries=-1,
    )
    if node_id is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return ray.remote(cls).options(**options).remote(*args, **kwargs)


def get_actor(experiment_name: str, role: str) -> "ray.actor.ActorHandle":
    return ray.get_actor(actor_name(experiment_name, role), namespace=RAY_NAMESPACE)


def start_metrics_store(experiment_name: str, run_dir: str, node_id: str):
    return start_actor(
        MetricsStore, experiment_name, METRICS_STORE_ROLE, run_dir, experiment_name,
        max_recent_steps=int(env_float(STORE_MAX_RECENT_STEPS_ENV_VAR, DEFAULT_STORE_MAX_RECENT_STEPS)),
        parquet_flush_interval_s=env_float(PARQUET_FLUSH_INTERVAL_S_ENV_VAR, DEFAULT_PARQUET_FLUSH_INTERVAL_S),
        node_id=node_id,
    )


def start_scheduler(experiment_name: str, node_id: str, **kwargs: Any):
    return start_actor(Scheduler, experiment_name, SCHEDULER_ROLE, node_id=node_id, **kwargs)


def start_balancer(experiment_name: str, run_dir: str, node_id: str, **kwargs: Any):
    """Needs the store and the scheduler running: it looks them up by name."""
    from hetero_ray.runtime.balancer_actor import BalancerActor

    return start_actor(BalancerActor, experiment_name, BALANCER_ROLE, experiment_name, run_dir,
                       node_id=node_id, **kwargs)


def kill_actor(handle) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone is fine
        pass
