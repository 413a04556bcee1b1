"""What the planner makes of the node profiles: each rank's busy-time line and memory cap.

The profiles are the node documents of ``nodes.json`` (``NodeCapability.to_dict()``, see
:mod:`hetero_ray.profiling.capability`), read here as plain dicts so that planning needs
nothing of profiling. Per rank, busy time is modelled as everywhere in planning:

    t_i(b) = max(τ_i, α_i + β_i·b)   (the probe of the rank's device, fitted by fit_curve)

The one memory-cap rule (the first plan, the policies and the bottleneck verdicts all use
it, through :func:`rank_memory_caps`): a GPU rank has its own device's cap; the CPU ranks
of a node share its RAM, so each gets ``cap // k`` of the node's CPU cap for ``k`` CPU
ranks there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from hetero_ray.planning.cost_model import fit_curve

CPU = "cpu"
GPU = "gpu"


@dataclass(frozen=True)
class RankCapacity:
    """One rank's expected busy time ``t(b) = max(floor_s, alpha_s + beta_s_per_sample·b)``
    and memory cap."""

    alpha_s: float
    beta_s_per_sample: float
    max_batch_size: Optional[int] = None  # None: no measured cap
    floor_s: float = 0.0  # τ: 0 for a line

    def busy_time_s(self, batch_size: float) -> float:
        return max(self.floor_s, self.alpha_s + self.beta_s_per_sample * batch_size)

    def samples_per_s_at(self, batch_size: float) -> float:
        """Throughput at ``batch_size``: ``b / t(b)``."""
        return batch_size / self.busy_time_s(batch_size)


def rank_capacities(
    nodes: Sequence[Mapping],
    rank_node_ids: Sequence[str],
    rank_device_kinds: Optional[Sequence[str]] = None,
) -> list[Optional[RankCapacity]]:
    """Each rank's capacity from the probe of the device it trains on.

    Args:
        nodes: the profiled nodes (node dicts of ``nodes.json``).
        rank_node_ids: the node of each rank (rank order).
        rank_device_kinds: "gpu" or "cpu" per rank; None means "gpu" on nodes that have a
            probed GPU, else "cpu". The k-th GPU rank of a node (in rank order) gets the
            node's k-th GPU (index order).

    Returns:
        A :class:`RankCapacity` per rank (its cap by the rule of the module docstring), or
        None where its node is unknown, failed, or has no model probe for that device: the
        caller falls back (e.g. equal shares).

    Raises:
        ValueError: device kinds that are not one per rank, or not "cpu"/"gpu".
    """
    out: list[Optional[RankCapacity]] = []
    for device, sharing in _rank_devices(nodes, rank_node_ids, rank_device_kinds):
        if device is None or not _has_probe(device):
            out.append(None)
            continue
        out.append(RankCapacity(float(device["alpha_s"]), float(device["beta_s_per_sample"]),
                                _share_of_cap(device, sharing), _floor_s(device)))
    return out


def rank_memory_caps(
    nodes: Optional[Sequence[Mapping]],
    rank_node_ids: Sequence[str],
    rank_device_kinds: Optional[Sequence[str]] = None,
) -> list[Optional[int]]:
    """Each rank's largest local batch by the one rule (module docstring); None where no
    cap was measured. Arguments as for :func:`rank_capacities`; odd entries in ``nodes``
    (not a dict, a failed node) count as unprofiled."""
    return [None if device is None else _share_of_cap(device, sharing)
            for device, sharing in _rank_devices(nodes or (), rank_node_ids, rank_device_kinds)]


def core_capacities(
    rank_node_ids: Sequence[str],
    rank_device_kinds: Sequence[str],
    rank_cpus: Sequence[Mapping],
) -> Optional[list[RankCapacity]]:
    """CPU ranks' lines from the cores they can use, before anything is timed.

    A CPU rank's speed is taken to be its cores: ``t_i(b) = b / cores_i`` (α = 0, in units
    that only compare ranks). A rank's cores are its compute threads (``threads``); the
    ranks of a node share its cgroup CPU quota (``quota_cores``, None: none), so where their
    threads add up to more than the quota each gets its part of the quota. This is what
    makes a CPU-starved node's rank small from the first step; a difference the count
    cannot see (an older CPU, a slower model on it) is the balancer's to measure.

    Returns None when a rank trains on a GPU (its speed is no core count) or a rank's
    cores are unknown.
    """
    if len(rank_device_kinds) != len(rank_node_ids) or len(rank_cpus) != len(rank_node_ids):
        raise ValueError(f"{len(rank_device_kinds)} device kinds and {len(rank_cpus)} CPU counts for "
                         f"{len(rank_node_ids)} ranks")
    if any(kind != CPU for kind in rank_device_kinds):
        return None
    threads = [c.get("threads") for c in rank_cpus]
    if not all(_finite(t) and t > 0 for t in threads):
        return None
    cores = [float(t) for t in threads]
    for node_id in set(rank_node_ids):
        ranks = [r for r, n in enumerate(rank_node_ids) if n == node_id]
        quotas = [rank_cpus[r].get("quota_cores") for r in ranks if _finite(rank_cpus[r].get("quota_cores"))]
        wanted = sum(cores[r] for r in ranks)
        if quotas and 0 < min(quotas) < wanted:
            for r in ranks:
                cores[r] *= min(quotas) / wanted
    return [RankCapacity(0.0, 1.0 / c) for c in cores]


def _rank_devices(nodes, rank_node_ids, rank_device_kinds) -> list[tuple[Optional[Mapping], int]]:
    """Per rank: its device's dict (None: unknown) and how many ranks share that device."""
    if rank_device_kinds is not None and len(rank_device_kinds) != len(rank_node_ids):
        raise ValueError(f"{len(rank_device_kinds)} device kinds for {len(rank_node_ids)} ranks")
    by_id = {str(n.get("node_id")): n for n in nodes if isinstance(n, Mapping) and n.get("status", "ok") == "ok"}
    kinds: list[str] = []
    for rank, node_id in enumerate(rank_node_ids):
        if rank_device_kinds is not None:
            kind = rank_device_kinds[rank]
            if kind not in (CPU, GPU):
                raise ValueError(f"rank {rank}: device kind must be 'cpu' or 'gpu', got {kind!r}")
        else:
            has_gpu = any(_has_probe(d) for d in _devices(by_id.get(node_id), GPU))
            kind = GPU if has_gpu else CPU
        kinds.append(kind)
    cpu_ranks = {node_id: sum(1 for n, k in zip(rank_node_ids, kinds) if n == node_id and k == CPU)
                 for node_id in set(rank_node_ids)}
    gpus_taken: dict[str, int] = {}
    out = []
    for node_id, kind in zip(rank_node_ids, kinds):
        position = 0
        if kind == GPU:
            position = gpus_taken.get(node_id, 0)
            gpus_taken[node_id] = position + 1
        devices = _devices(by_id.get(node_id), kind)
        device = devices[position] if position < len(devices) else None
        out.append((device, cpu_ranks[node_id] if kind == CPU else 1))
    return out


def _devices(node: Optional[Mapping], kind: str) -> list[Mapping]:
    """The node's devices of ``kind``, in index order."""
    if node is None:
        return []
    of_kind = [d for d in node.get("devices") or () if isinstance(d, Mapping) and d.get("kind") == kind]
    return sorted(of_kind, key=lambda d: d.get("index") or 0)


def _share_of_cap(device: Mapping, sharing: int) -> Optional[int]:
    cap = device.get("max_batch_size")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
        return None
    return cap // sharing


def probe_rows(device: Mapping) -> list[dict]:
    """A device's probe rows ``{"batch_size", "busy_time_s"}`` that hold a batch size ≥ 1 and
    a positive busy time (the rest of a profile's rows are dropped)."""
    rows = []
    for row in device.get("probe") or ():
        b, t = (row.get("batch_size"), row.get("busy_time_s")) if isinstance(row, Mapping) else (None, None)
        if isinstance(b, int) and not isinstance(b, bool) and b >= 1 and _finite(t) and t > 0:
            rows.append({"batch_size": b, "busy_time_s": float(t)})
    return rows


def refit_old_curve(device: dict) -> bool:
    """A device profiled before curves had a floor (no ``fit_shape``): its curve is fitted
    again from its probe rows with the planner's fit, in place, and marked ``refitted``
    (``hetero-ray plan`` reads a saved profile through this; a run profiles its nodes
    afresh). True when it was refitted."""
    rows = probe_rows(device)
    if device.get("fit_shape") or not rows:
        return False
    fit = fit_curve([r["batch_size"] for r in rows], [r["busy_time_s"] for r in rows])
    device.update(alpha_s=fit.alpha_s, beta_s_per_sample=fit.beta_s_per_sample, floor_s=fit.floor_s,
                  fit_shape=fit.shape, fit_max_rel_error=fit.max_rel_error, refitted=True)
    return True


def _has_probe(device: Mapping) -> bool:
    alpha, beta = device.get("alpha_s"), device.get("beta_s_per_sample")
    return (_finite(alpha) and _finite(beta) and beta >= 0
            and max(_floor_s(device), alpha + beta) > 0)  # a positive busy time at one sample


def _floor_s(device: Mapping) -> float:
    """The curve's floor τ (profiles from before the floor have none: a line)."""
    floor = device.get("floor_s")
    return float(floor) if _finite(floor) and floor > 0 else 0.0


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
