"""Every rank switches plans at the same step.

At every rebalance point (global steps that are multiples of the interval, and the first
step of each worker group) all ranks call :func:`agree_on_plan` together. Rank 0 alone
asks the planner for the latest plan (bounded wait: a slow or restarting actor means
"keep the current plan"), checks it fits this worker group, and broadcasts it over the
process group; every rank returns the same plan and applies it from this very step.
Because the broadcast is a collective that all ranks enter at the same global step, no
rank can run ahead with a different split, and none waits in a collective that another
will not enter.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from hetero_ray.planning.plan import Plan
from hetero_ray.planning.rank_facts import NO_FACTS, RankFacts
from hetero_ray.training.rank.answers import answer

logger = logging.getLogger(__name__)

WAIT_POLL_S = 0.2  # asking again while the planner awaits node profiles
WAIT_NOTE_EVERY_S = 5.0


def fetch_plan(planner, num_workers: int, global_batch_size: int, global_step: int,
               current: Optional[Plan], timeout_s: float, ranks: RankFacts = NO_FACTS, *, wait_s: float = 0.0,
               note: Callable[[str], None] = logger.info,
               micro_batches: bool = False) -> tuple[Optional[Plan], Optional[list[Optional[int]]]]:
    """Rank 0: the planner's plan if it is usable for this group, else ``current``; and
    the ranks' memory caps the planner knows (None: none, or no answer).

    What ``ranks`` says of the group (nodes and device kinds, warm-up lines, cores) lets
    the planner build its first plan from the devices the ranks actually run on.
    While the planner awaits node profiles for that plan, asks again for up to
    ``wait_s`` seconds (telling ``note`` what it waits for), then takes a plan without them.
    ``micro_batches``: the loop trains shares past the memory caps in micro-batches, so
    the planner may give them (see training/gradients/micro_batches.py).
    """
    try:
        reply = _ask_until_planned(planner, (num_workers, global_step, ranks), {"micro_batches": micro_batches},
                                   timeout_s, wait_s, note)
        candidate = Plan.from_dict(reply)
    except Exception as e:  # noqa: BLE001 - timeouts, a dead or restarting actor
        logger.warning("planner did not answer (%s); keeping plan %s", type(e).__name__, current)
        return current, None
    if candidate.num_workers != num_workers or candidate.global_batch_size != global_batch_size:
        logger.warning("ignoring plan %s: not for %d workers and batch %d", candidate, num_workers,
                       global_batch_size)
        return current, None
    caps = reply.get("memory_caps")
    return candidate, (list(caps) if caps is not None and len(caps) == num_workers else None)


def _ask_until_planned(planner, args: tuple, kwargs: dict, timeout_s: float, wait_s: float, note) -> dict:
    started = time.monotonic()
    said = started - WAIT_NOTE_EVERY_S  # the first wait is said at once
    while True:
        waiting = time.monotonic() - started < wait_s
        reply = answer(planner.plan_for.remote(*args, wait_for_capabilities=waiting, **kwargs), timeout_s)
        if "awaiting" not in reply:
            return reply
        if time.monotonic() - said >= WAIT_NOTE_EVERY_S:
            said = time.monotonic()
            note(f"waiting for the {reply['awaiting']} before the first plan ({said - started:.0f}s, "
                 f"at most {wait_s:.0f}s)…")
        time.sleep(WAIT_POLL_S)


def broadcast_plan(plan: Optional[Plan], rank: int, num_workers: int, device: torch.device,
                   memory_caps: Optional[list[Optional[int]]] = None) -> tuple[Plan, Optional[list[Optional[int]]]]:
    """All ranks: rank 0's ``plan`` and ``memory_caps`` (others pass None), as one tensor
    [version, b_0, …, b_{n-1}, cap_0, …, cap_{n-1}, probe_0, …, probe_{n-1}, check_after_steps]
    (cap 0: none known; probes all 0: the plan has none)."""
    n = num_workers
    buffer = torch.zeros(3 * n + 2, dtype=torch.int64, device=device)
    if rank == 0:
        if plan is None:
            raise RuntimeError("rank 0 has no plan to broadcast")
        buffer[0] = plan.version
        buffer[1:n + 1] = torch.tensor(plan.local_batch_sizes, dtype=torch.int64)
        if memory_caps is not None:
            buffer[n + 1:2 * n + 1] = torch.tensor([c or 0 for c in memory_caps], dtype=torch.int64)
        if plan.probe_sizes:
            buffer[2 * n + 1:3 * n + 1] = torch.tensor(plan.probe_sizes, dtype=torch.int64)
        buffer[3 * n + 1] = plan.check_after_steps
    dist.broadcast(buffer, src=0)
    values = buffer.tolist()
    caps = [c or None for c in values[n + 1:2 * n + 1]]
    caps = caps if any(c is not None for c in caps) else None
    if rank == 0:
        return plan, caps
    probes = tuple(values[2 * n + 1:3 * n + 1])
    return Plan(values[0], tuple(values[1:n + 1]), probe_sizes=probes if any(probes) else (),
                check_after_steps=values[3 * n + 1]), caps
