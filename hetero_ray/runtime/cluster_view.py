"""An elastic run's view of the cluster follows a lost node at the next worker-group start.

Ray Train 2.60 sizes an elastic worker group by the resources Ray Data's
AutoscalingCoordinator actor holds for it, and that actor looks at the cluster's nodes only
every 20 s. After a node dies, Ray Train goes on trying groups of the old size, each failing
on its start timeout, until the actor looks again: measured, 1–6 tries of 5 s and more on a
loaded machine. :class:`ClusterViewRefresh` asks the actor to look again before each
worker-group start and after each poll that saw a worker fail, so the next decision reads
the nodes that are alive.
"""

from __future__ import annotations

import logging

import ray
# Ray Train's worker-group hooks (a DeveloperAPI, pinned with ray 2.60).
from ray.train.v2._internal.execution.callback import WorkerGroupCallback

logger = logging.getLogger(__name__)

# Where Ray 2.60 keeps the actor (ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator).
COORDINATOR_NAME = "AutoscalingCoordinator"
COORDINATOR_NAMESPACE = "AutoscalingCoordinator"
REQUESTER_ID = "hetero_ray-cluster-view"  # holds no request: asking with recompute only refreshes


class ClusterViewRefresh(WorkerGroupCallback):
    """Asks the AutoscalingCoordinator to look at the cluster again; never blocks the
    controller (the call is sent and not awaited) and never fails the run (a Ray without
    that actor has nothing to refresh)."""

    def __init__(self, name: str = COORDINATOR_NAME, namespace: str = COORDINATOR_NAMESPACE):
        self._name, self._namespace = name, namespace

    def before_worker_group_start(self, worker_group_context) -> None:
        self.refresh()

    def after_worker_group_poll_status(self, worker_group_status) -> None:
        if worker_group_status.errors:
            self.refresh()

    def refresh(self) -> None:
        try:
            coordinator = ray.get_actor(self._name, namespace=self._namespace)
            coordinator.get_reserved_resources.remote(REQUESTER_ID, recompute=True)
        except Exception as e:  # noqa: BLE001 - no such actor (yet), or another Ray: Ray Train's own tick stands
            logger.debug("could not ask the AutoscalingCoordinator to look again: %s", e)
