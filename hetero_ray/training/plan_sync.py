"""Every rank switches plans at the same step.

At every rebalance point (global steps that are multiples of the interval, and the first
step of each worker group) all ranks call :func:`agree_on_plan` together. Rank 0 alone
asks the scheduler for the latest plan (bounded wait: a slow or restarting actor means
"keep the current plan"), checks it fits this worker group, and broadcasts it over the
process group; every rank returns the same plan and applies it from this very step.
Because the broadcast is a collective that all ranks enter at the same global step, no
rank can run ahead with a different split, and none waits in a collective that another
will not enter.
"""

from __future__ import annotations

import logging
from typing import Optional

import ray
import torch
import torch.distributed as dist

from hetero_ray.plan import Plan

logger = logging.getLogger(__name__)


def fetch_plan(scheduler, num_workers: int, global_batch_size: int, global_step: int,
               current: Optional[Plan], timeout_s: float, rank_node_ids=None,
               rank_device_kinds=None, rank_fits=None) -> tuple[Optional[Plan], Optional[list]]:
    """Rank 0: the scheduler's plan if it is usable for this group, else ``current``; and
    the per-rank memory caps the scheduler knows (None when it knows none).

    The ranks' nodes and device kinds let the scheduler build a group's first plan from
    the profiles of the devices the ranks actually run on; ``rank_fits`` (each rank's
    warm-up line under emulated speeds) let it build that plan from the ranks themselves.
    """
    try:
        reply = ray.get(scheduler.plan_for.remote(num_workers, global_step, rank_node_ids, rank_device_kinds,
                                                  rank_fits), timeout=timeout_s)
        candidate = Plan.from_dict(reply)
    except Exception as e:  # noqa: BLE001 - timeouts, a dead or restarting actor
        logger.warning("scheduler did not answer (%s); keeping plan %s", type(e).__name__, current)
        return current, None
    if candidate.num_workers != num_workers or candidate.global_batch_size != global_batch_size:
        logger.warning("ignoring plan %s: not for %d workers and batch %d", candidate, num_workers,
                       global_batch_size)
        return current, None
    return candidate, reply.get("caps")


def broadcast_plan(plan: Optional[Plan], rank: int, num_workers: int, device: torch.device) -> Plan:
    """All ranks: rank 0's ``plan`` (others pass None), as a tensor [version, b_0, …, b_{n-1}]."""
    buffer = torch.zeros(num_workers + 1, dtype=torch.int64, device=device)
    if rank == 0:
        if plan is None:
            raise RuntimeError("rank 0 has no plan to broadcast")
        buffer[0] = plan.version
        buffer[1:] = torch.tensor(plan.local_batch_sizes, dtype=torch.int64)
    dist.broadcast(buffer, src=0)
    if rank == 0:
        return plan
    values = buffer.tolist()
    return Plan(values[0], tuple(values[1:]))
