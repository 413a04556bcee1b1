"""Who a worker is in its worker group: fixed from the registration of the group's start
until the group ends.

A :class:`WorkerIdentity` is made once per worker-group start by :func:`register_attempt`
(a collective: rank 0 registers the attempt with the metrics store, every rank learns its
id and where every rank runs) and never changes afterwards; a restart makes a new one.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import ray
import torch
import torch.distributed as dist

from hetero_ray.constants import DEFAULT_REGISTER_ATTEMPT_TIMEOUT_S, REGISTER_ATTEMPT_TIMEOUT_S_ENV_VAR, env_float
from hetero_ray.profiling.cgroup import cpu_quota_cores


@dataclass(frozen=True)
class WorkerIdentity:
    rank: int
    num_workers: int
    local_rank: int
    device: torch.device
    node_id: str
    attempt: int  # the metrics store's id of this worker-group start
    # Every rank's placement, by rank (ranks are ordered by node, not by anything we chose).
    rank_node_ids: tuple[str, ...]
    rank_device_kinds: tuple[str, ...]  # "gpu" | "cpu"
    rank_cpu_cores: tuple[int, ...]  # cores each rank's process may run on
    # What each rank can compute with on the CPU: ``{"threads", "quota_cores"}`` (its torch
    # threads within those cores; its cgroup's CPU quota, None without one).
    rank_cpus: tuple[dict, ...]

    @property
    def collective_device(self) -> torch.device:
        return collective_device(self.device)


def collective_device(device: torch.device) -> torch.device:
    """Where tensors for the process group's collectives live: NCCL only moves CUDA
    tensors, gloo takes CPU ones."""
    return device if dist.get_backend() == "nccl" else torch.device("cpu")


def register_attempt(store, *, rank: int, num_workers: int, local_rank: int, device: torch.device, node_id: str,
                     global_step: int) -> WorkerIdentity:
    """Collective: rank 0 registers this worker-group start (resuming at ``global_step``)
    with the metrics store; every rank learns its id and where every rank runs, and
    registers itself."""
    attempt = torch.zeros(1, dtype=torch.int64, device=collective_device(device))
    if rank == 0:
        attempt[0] = _begin_attempt(store, global_step, num_workers)
    dist.broadcast(attempt, src=0)
    placement: list = [None] * num_workers
    cores = _cpu_cores()
    cpus = {"threads": min(torch.get_num_threads(), cores), "quota_cores": cpu_quota_cores()}
    dist.all_gather_object(placement, (node_id, "gpu" if device.type == "cuda" else "cpu", cores, cpus))
    identity = WorkerIdentity(
        rank=rank, num_workers=num_workers, local_rank=local_rank, device=device, node_id=node_id,
        attempt=int(attempt.item()),
        rank_node_ids=tuple(node for node, _, _, _ in placement),
        rank_device_kinds=tuple(kind for _, kind, _, _ in placement),
        rank_cpu_cores=tuple(cores for _, _, cores, _ in placement),
        rank_cpus=tuple(cpus for _, _, _, cpus in placement),
    )
    store.register_worker.remote({
        "rank": rank, "pid": os.getpid(), "node_id": node_id, "hostname": socket.gethostname(),
        "device": str(device), "attempt": identity.attempt,
    })
    return identity


def _begin_attempt(store, global_step: int, num_workers: int) -> int:
    timeout_s = env_float(REGISTER_ATTEMPT_TIMEOUT_S_ENV_VAR, DEFAULT_REGISTER_ATTEMPT_TIMEOUT_S)
    try:
        return ray.get(store.begin_attempt.remote(global_step, num_workers), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"rank 0 waited {timeout_s:g} s for the metrics store to register this worker-group start (at global "
            f"step {global_step}, {num_workers} workers) and got no answer; the store actor is stuck or its node "
            f"is overloaded. Ray Train retries the start; raise {REGISTER_ATTEMPT_TIMEOUT_S_ENV_VAR} if its node "
            "is just slow") from None


def _cpu_cores() -> int:
    """Cores this process may run on (its affinity; the machine's count where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
