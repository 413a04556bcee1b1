"""Connecting to a Ray cluster, and checking that it can hold the workers.

Three ways in: an explicit ``--address`` (or ``RAY_ADDRESS``) joins an existing cluster;
no address starts a local Ray in this process — or, for ``HeteroTrainer.fit()``, joins the
cluster ``ray start`` runs on this machine, as plain ``ray.init()`` does; an already
initialised Ray (tests, a notebook) is used as it is. An address that does not answer fails within the connect
timeout with a message, instead of hanging.
"""

from __future__ import annotations

import math
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Optional

import ray

from hetero_ray.constants import RAY_NAMESPACE
from hetero_ray.errors import UserError
from hetero_ray.runtime.auth import prepare_auth_env, reload_ray_auth_config

# Train workers report their own lines; these quiet Ray's noise that means nothing here.
QUIET_ENV = {
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",  # no preemption on local/on-prem clusters
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # otherwise every worker line reaches the driver twice
}


@dataclass(frozen=True)
class Connection:
    address: str
    started_local: bool  # by this process (a second connect, e.g. by HeteroTrainer.fit after the CLI's, says so too)
    dashboard_url: Optional[str]
    # Through Ray Client (ray://): the driver's process cannot read the dashboard's address.
    via_client: bool = False


_started_here: Optional[str] = None  # the address of the local Ray this process started


def connect(address: Optional[str], *, local_num_cpus: int, timeout_s: float,
            include_dashboard: bool = True, join_local_cluster: bool = False) -> Connection:
    """Connects this process to Ray (see module docstring).

    Args:
        join_local_cluster: with no address, join the cluster that ``ray start`` runs on
            this machine, if one answers, before starting a Ray of our own (what a Ray
            Train user's ``ray.init()`` does; the CLI keeps its own Ray unless told
            ``--address auto``).
    """
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    global _started_here
    if ray.is_initialized():
        address = ray.get_runtime_context().gcs_address
        return Connection(address, address == _started_here, _dashboard_url(), _via_client())
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None and join_local_cluster:
        address = running_local_cluster()
    if address is None:
        # address="local": always a new Ray of our own, even if `ray start` runs on this machine
        # (plain ray.init() would join that one instead).
        ray.init(address="local", num_cpus=local_num_cpus, namespace=RAY_NAMESPACE, include_dashboard=include_dashboard,
                 logging_level="WARNING", log_to_driver=True)
        _started_here = ray.get_runtime_context().gcs_address
        return Connection(_started_here, True, _dashboard_url())
    _check_reachable(address, timeout_s)
    if prepare_auth_env(address):  # the CLI set it before Ray loaded; a Python caller may not have
        reload_ray_auth_config()
    _init_with_timeout(address, timeout_s)
    return Connection(address, False, _dashboard_url(), _via_client())


def running_local_cluster() -> Optional[str]:
    """The address of the cluster ``ray start`` last started on this machine, if it still
    answers (a cluster stopped without ``ray stop`` leaves its address file behind)."""
    from ray._private.services import find_bootstrap_address

    try:
        address = find_bootstrap_address(None)
    except Exception:  # noqa: BLE001 - no address file, or one Ray cannot read: none running
        return None
    if not address:
        return None
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            return address
    except (OSError, ValueError):
        return None


def _check_reachable(address: str, timeout_s: float) -> None:
    """Fails fast when nothing listens at ``host:port`` (ray:// and 'auto' are left to Ray)."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--address {address!r} must look like HOST:PORT (e.g. 10.0.0.5:6379), 'auto' or ray://HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=min(timeout_s, 10.0)):
            pass
    except OSError as e:
        raise UserError(
            f"cannot reach a Ray cluster at {address} ({e.strerror or e}). Start one there with "
            "`ray start --head` (see cluster_configs/), check the host and port, or leave out "
            "--address to run on a local Ray"
        ) from None


def _init_with_timeout(address: str, timeout_s: float) -> None:
    outcome: dict = {}

    def attempt():
        try:
            ray.init(address=address, namespace=RAY_NAMESPACE, logging_level="WARNING")
            outcome["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported below with the address
            outcome["error"] = e

    thread = threading.Thread(target=attempt, daemon=True, name="ray-connect")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise UserError(f"connecting to the Ray cluster at {address} did not finish within {timeout_s:.0f} s; "
                        "is it a Ray GCS address (port 6379 by default) and is token auth set up (RAY_AUTH_TOKEN)?")
    if "error" in outcome:
        raise UserError(f"cannot connect to the Ray cluster at {address}: {outcome['error']}") from None


def dashboard_note(connection: Connection) -> Optional[str]:
    """What a run on a cluster without Ray's dashboard should know; None with one (or
    where the driver cannot tell: through Ray Client)."""
    if connection.dashboard_url or connection.via_client:
        return None
    return ("[hetero_ray] note: this Ray cluster runs no dashboard. Ray Train's placement-group cleaner looks "
            "each run's controller up through it; without one, every run's end waits 12 s for the cleaner. "
            "Start the head with `ray start --head --include-dashboard=true` (ray[default]).")


def _via_client() -> bool:
    from ray.util.client import ray as client

    return client.is_connected()


def _dashboard_url() -> Optional[str]:
    try:
        url = ray._private.worker.get_dashboard_url()
    except Exception:  # noqa: BLE001 - no dashboard (ray without [default], or disabled)
        return None
    return f"http://{url}" if url else None


@dataclass(frozen=True)
class NodeResources:
    node_id: str
    address: str
    cpus: float
    gpus: float
    labels: dict = field(default_factory=dict)


def alive_nodes() -> list[NodeResources]:
    return [
        NodeResources(n["NodeID"], n.get("NodeManagerAddress", "?"), n["Resources"].get("CPU", 0.0),
                      n["Resources"].get("GPU", 0.0), dict(n.get("Labels") or {}))
        for n in ray.nodes() if n.get("Alive")
    ]


def placeable_workers(nodes: list[NodeResources], cpus_per_worker: float, gpus_per_worker: float) -> int:
    """How many workers of that size fit on the nodes (each worker on one node)."""
    total = 0
    for node in nodes:
        fit = math.floor(node.cpus / cpus_per_worker + 1e-9)
        if gpus_per_worker > 0:
            fit = min(fit, math.floor(node.gpus / gpus_per_worker + 1e-9))
        total += fit
    return total


def unmatched_selectors(nodes: list[NodeResources], selectors: Optional[list[dict]]) -> list[dict]:
    """Label selectors no alive node satisfies (exact key=value matches)."""
    return [s for s in selectors or [] if s and not any(
        all(node.labels.get(k) == v for k, v in s.items()) for node in nodes)]


def check_capacity(num_workers: int, cpus_per_worker: float, gpus_per_worker: float,
                   label_selectors: Optional[list[dict]] = None) -> None:
    """Raises a :class:`UserError` naming what the cluster has when the workers cannot fit."""
    nodes = alive_nodes()
    missing = unmatched_selectors(nodes, label_selectors)
    if missing:
        wanted = ", ".join(sorted({",".join(f"{k}={v}" for k, v in s.items()) for s in missing}))
        have = "; ".join(f"{n.address}: {n.labels or 'no labels'}" for n in nodes)
        raise UserError(f"no alive node has the labels {wanted} that the workers need (nodes: {have}). Start "
                        "nodes with cluster_configs/start_worker.sh (it sets hetero-ray.io/device), or change "
                        "--worker-devices / --worker-labels")
    fit = placeable_workers(nodes, cpus_per_worker, gpus_per_worker)
    if fit >= num_workers:
        return
    per_worker = f"{cpus_per_worker:g} CPU" + (f" + {gpus_per_worker:g} GPU" if gpus_per_worker else "")
    described = "; ".join(f"{n.address}: {n.cpus:g} CPU, {n.gpus:g} GPU" for n in nodes) or "no alive nodes"
    raise UserError(
        f"the cluster can place {fit} worker(s) of {per_worker}, but --num-workers is {num_workers} "
        f"(nodes: {described}). Lower --num-workers or --cpus-per-worker, or add nodes with "
        "`ray start --address=...`"
    )


def cluster_has_gpus() -> bool:
    return ray.cluster_resources().get("GPU", 0) > 0
