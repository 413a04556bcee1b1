"""An elastic run's view of the cluster (runtime/cluster_view.py): Ray Data's
AutoscalingCoordinator, Ray 2.60's own actor class, reads the nodes again when asked.

The coordinator runs as a real actor on the session's Ray; only its list of nodes comes
from a file here (a node cannot be made to die cheaply), as Ray's ``ray.nodes()`` gives it.
"""

from __future__ import annotations

import functools
import json

import pytest
from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import _AutoscalingCoordinatorActor

from hetero_ray.runtime.cluster_view import ClusterViewRefresh

pytestmark = pytest.mark.ray

NAME, NAMESPACE = "TestAutoscalingCoordinator", "hetero_ray_test_cluster_view"


def _nodes_from(path: str) -> list[dict]:
    with open(path) as f:
        return json.load(f)


def _node(node_id: str, cpus: float, alive: bool = True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus, "memory": 1e9}, "Labels": {}}


def _reserved_cpus(coordinator, ray) -> dict[str, float]:
    reserved = ray.get(coordinator.get_reserved_resources.remote("train"))
    return {node: resources.get("CPU", 0) for node, resources in reserved.items() if resources.get("CPU")}


def test_a_refresh_makes_the_coordinator_read_the_nodes_again(ray_session, tmp_path):
    ray = ray_session
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps([_node("a", 2), _node("b", 1)]))
    coordinator = ray.remote(num_cpus=0)(_AutoscalingCoordinatorActor).options(name=NAME, namespace=NAMESPACE).remote(
        send_resources_request=lambda *args: None, get_cluster_nodes=functools.partial(_nodes_from, str(nodes)))
    try:
        ray.get(coordinator.request_resources.remote("train", [{"CPU": 1}] * 3, expire_after_s=60))
        assert _reserved_cpus(coordinator, ray) == {"a": 2, "b": 1}

        nodes.write_text(json.dumps([_node("a", 2), _node("b", 1, alive=False)]))  # b dies
        assert _reserved_cpus(coordinator, ray) == {"a": 2, "b": 1}, "the coordinator looked without being asked"
        ClusterViewRefresh(NAME, NAMESPACE).refresh()  # sent, not awaited; the next call comes after it
        assert _reserved_cpus(coordinator, ray) == {"a": 2}
    finally:
        ray.kill(coordinator)


def test_without_a_coordinator_a_refresh_does_nothing(ray_session):
    ClusterViewRefresh("NoSuchCoordinator", NAMESPACE).refresh()  # must not raise: Ray Train's tick stands
