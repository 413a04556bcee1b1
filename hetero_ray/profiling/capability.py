"""What profiling found on each node, and what the scheduler makes of it.

:class:`NodeCapability` (one per node, holding :class:`DeviceCapability` per device) is
what a node profiler reports and what ``nodes.json`` and ``hetero-ray profile --json``
hold. The document shape is::

    {"model": "simple_cnn" | null, "batch_sizes": [8, 16, 32, 64],
     "nodes": [{"node_id", "ip", "hostname", "resources", "labels", "status": "ok" | "failed",
                "error", "cpu": {"model", "physical_cores", "logical_cores", "ram_bytes",
                "cpu_quota_cores"}, "profile_time_s", "stage_times_s",
                "devices": [{"kind": "cpu" | "gpu", "name", "index", "matmul_tflops_fp32",
                             "matmul_tflops_bf16", "matmul_tflops_fp16", "memory_bandwidth_gbps",
                             "h2d_gbps", "d2h_gbps", "memory_total_bytes", "sm_count",
                             "compute_capability", "driver_version", "cuda_version",
                             "power_limit_w", "pcie_gen", "pcie_width", "alpha_s",
                             "beta_s_per_sample", "fit_r2", "max_batch_size",
                             "max_batch_size_method", "probe": [{"batch_size", "busy_time_s"}]}]}]}

Every figure is measured on that node (or read from NVML); a figure that was not measured
is null. :func:`rank_capacities` and :func:`first_plan_weights` are the pure functions the
scheduler calls to turn capabilities into a first plan.

Per rank, busy time is modelled as in :mod:`hetero_ray.planning.cost_model`:

    t_i(b) = α_i + β_i·b        (the node's probe of its device, fitted by fit_linear)

Emulated speeds (``--emulate-speeds``) are not applied here: a node profile cannot tell
the ranks of one machine apart, so under emulation the ranks measure themselves before
step 0 (:mod:`hetero_ray.training.warmup`) and only their memory caps come from here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

OK = "ok"
FAILED = "failed"
CPU = "cpu"
GPU = "gpu"
NODES_FILE = "nodes.json"


@dataclass
class DeviceCapability:
    """One device of a node: a CPU (all the threads one worker uses) or one GPU."""

    kind: str  # "cpu" | "gpu"
    name: str
    index: int = 0  # GPU: NVML index on the node; CPU: 0
    matmul_tflops_fp32: Optional[float] = None
    matmul_tflops_bf16: Optional[float] = None  # GPU only
    matmul_tflops_fp16: Optional[float] = None  # GPU only
    memory_bandwidth_gbps: Optional[float] = None  # device memory copy (read + write), GB/s
    h2d_gbps: Optional[float] = None  # GPU: pinned host → device
    d2h_gbps: Optional[float] = None  # GPU: device → pinned host
    memory_total_bytes: Optional[int] = None  # GPU memory, or the node's RAM for a CPU
    sm_count: Optional[int] = None
    compute_capability: Optional[str] = None
    driver_version: Optional[str] = None
    cuda_version: Optional[str] = None
    power_limit_w: Optional[float] = None
    pcie_gen: Optional[int] = None
    pcie_width: Optional[int] = None
    # Model probe (when a model was given): t(b) = alpha_s + beta_s_per_sample·b
    alpha_s: Optional[float] = None
    beta_s_per_sample: Optional[float] = None
    fit_r2: Optional[float] = None
    max_batch_size: Optional[int] = None
    max_batch_size_method: Optional[str] = None  # "oom-search" | "ram-fraction" (+ " (lower bound…)")
    probe: list[dict] = field(default_factory=list)  # [{"batch_size", "busy_time_s"}]
    error: Optional[str] = None  # a benchmark of this device that failed (the rest stands)

    def __post_init__(self):
        if self.kind not in (CPU, GPU):
            raise ValueError(f"DeviceCapability.kind must be 'cpu' or 'gpu', got {self.kind!r}")

    @property
    def has_probe(self) -> bool:
        return _finite(self.beta_s_per_sample) and self.beta_s_per_sample > 0 and _finite(self.alpha_s)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceCapability":
        return cls(**_known(cls, d))


@dataclass
class CpuInfo:
    model: Optional[str] = None
    physical_cores: Optional[int] = None
    logical_cores: Optional[int] = None
    ram_bytes: Optional[int] = None
    cpu_quota_cores: Optional[float] = None  # the cgroup CPU quota of the profiler, if any

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "CpuInfo":
        return cls(**_known(cls, d or {}))


@dataclass
class NodeCapability:
    """A node as profiled: inventory, measured figures per device, or why it failed."""

    node_id: str
    ip: Optional[str] = None
    hostname: Optional[str] = None
    resources: dict[str, float] = field(default_factory=dict)  # its Ray resources
    labels: dict[str, str] = field(default_factory=dict)  # its Ray node labels
    status: str = OK
    error: Optional[str] = None
    cpu: CpuInfo = field(default_factory=CpuInfo)
    devices: list[DeviceCapability] = field(default_factory=list)
    profile_time_s: Optional[float] = None  # on the node, inventory to last probe
    stage_times_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in (OK, FAILED):
            raise ValueError(f"NodeCapability.status must be 'ok' or 'failed', got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == OK

    def device(self, kind: str, position: int = 0) -> Optional[DeviceCapability]:
        """The ``position``-th device of ``kind`` in index order, or None."""
        of_kind = sorted((d for d in self.devices if d.kind == kind), key=lambda d: d.index)
        return of_kind[position] if 0 <= position < len(of_kind) else None

    def to_dict(self) -> dict[str, Any]:
        d = _json_safe({k: getattr(self, k) for k in ("node_id", "ip", "hostname", "resources", "labels",
                                                      "status", "error", "profile_time_s", "stage_times_s")})
        d["cpu"] = self.cpu.to_dict()
        d["devices"] = [device.to_dict() for device in self.devices]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "NodeCapability":
        values = _known(cls, d)
        values["cpu"] = CpuInfo.from_dict(d.get("cpu"))
        values["devices"] = [DeviceCapability.from_dict(x) for x in d.get("devices") or []]
        values["resources"] = dict(values.get("resources") or {})
        values["labels"] = dict(values.get("labels") or {})
        values["stage_times_s"] = dict(values.get("stage_times_s") or {})
        return cls(**values)

    @classmethod
    def failed(cls, node_id: str, error: str, **known: Any) -> "NodeCapability":
        """A node that could not be profiled; ``known`` holds what the driver knows anyway."""
        return cls(node_id=node_id, status=FAILED, error=error, **known)


def capabilities_document(nodes: Sequence[NodeCapability], model: Optional[str] = None,
                          batch_sizes: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """The JSON document of ``nodes.json`` and ``hetero-ray profile --json``."""
    return {
        "model": model,
        "batch_sizes": list(batch_sizes) if model and batch_sizes else [],
        "nodes": [node.to_dict() for node in nodes],
    }


def nodes_from_document(document: dict) -> list[NodeCapability]:
    return [NodeCapability.from_dict(d) for d in document.get("nodes") or []]


def write_nodes_json(path: str, nodes: Sequence[NodeCapability], model: Optional[str] = None,
                     batch_sizes: Optional[Sequence[int]] = None) -> None:
    """Writes the document atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(capabilities_document(nodes, model, batch_sizes), f, indent=2, allow_nan=False)
    os.replace(tmp, path)


def read_nodes_json(path: str) -> list[NodeCapability]:
    with open(path) as f:
        return nodes_from_document(json.load(f))


@dataclass(frozen=True)
class RankCapacity:
    """One rank's expected busy time ``t(b) = alpha_s + beta_s_per_sample·b`` and memory cap."""

    alpha_s: float
    beta_s_per_sample: float
    max_batch_size: Optional[int] = None  # None: no measured cap

    def busy_time_s(self, batch_size: float) -> float:
        return self.alpha_s + self.beta_s_per_sample * batch_size

    def samples_per_s_at(self, batch_size: float) -> float:
        """Throughput at ``batch_size``: ``b / (α + β·b)``."""
        return batch_size / self.busy_time_s(batch_size)


def rank_capacities(
    nodes: Sequence[NodeCapability],
    rank_node_ids: Sequence[str],
    rank_device_kinds: Optional[Sequence[str]] = None,
) -> list[Optional[RankCapacity]]:
    """Each rank's capacity from the probe of the device it will train on.

    Args:
        nodes: the profiled nodes.
        rank_node_ids: the node of each rank (rank order).
        rank_device_kinds: "gpu" or "cpu" per rank; None means "gpu" on nodes that have a
            probed GPU, else "cpu". The k-th GPU rank of a node (in rank order) gets the
            node's k-th GPU (NVML index order).

    Returns:
        A :class:`RankCapacity` per rank, or None where its node is unknown, failed, or has
        no model probe for that device: the caller falls back (e.g. equal shares).
        CPU ranks sharing a node share its RAM, so each gets ``max_batch_size // k`` of the
        node's RAM-bound cap for ``k`` CPU ranks there (GPU ranks each have their own memory).
    """
    if rank_device_kinds is not None and len(rank_device_kinds) != len(rank_node_ids):
        raise ValueError(f"{len(rank_device_kinds)} device kinds for {len(rank_node_ids)} ranks")
    by_id = {node.node_id: node for node in nodes}
    kinds: list[str] = []
    for rank, node_id in enumerate(rank_node_ids):
        if rank_device_kinds is not None:
            kind = rank_device_kinds[rank]
            if kind not in (CPU, GPU):
                raise ValueError(f"rank {rank}: device kind must be 'cpu' or 'gpu', got {kind!r}")
        else:
            node = by_id.get(node_id)
            has_gpu = node is not None and any(d.kind == GPU and d.has_probe for d in node.devices)
            kind = GPU if has_gpu else CPU
        kinds.append(kind)
    cpu_ranks_per_node: dict[str, int] = {}
    for node_id, kind in zip(rank_node_ids, kinds):
        if kind == CPU:
            cpu_ranks_per_node[node_id] = cpu_ranks_per_node.get(node_id, 0) + 1

    gpus_taken: dict[str, int] = {}
    out: list[Optional[RankCapacity]] = []
    for rank, (node_id, kind) in enumerate(zip(rank_node_ids, kinds)):
        node = by_id.get(node_id)
        position = 0
        if kind == GPU:
            position = gpus_taken.get(node_id, 0)
            gpus_taken[node_id] = position + 1
        device = node.device(kind, position) if node is not None and node.ok else None
        if device is None or not device.has_probe:
            out.append(None)
            continue
        cap = device.max_batch_size
        if cap is not None and kind == CPU:
            cap = cap // cpu_ranks_per_node[node_id]
        out.append(RankCapacity(device.alpha_s, device.beta_s_per_sample, cap))
    return out


def first_plan_weights(
    capacities: Sequence[Optional[RankCapacity]], mean_local_batch_size: float,
) -> tuple[list[float], list[Optional[int]]]:
    """Weights and caps for the first plan (the interim rule until the split solver uses α, β).

    ``weight_i = b̄ / t_i(b̄)`` — each rank's measured throughput at the mean local batch
    ``b̄ = B/n`` — and ``cap_i`` = its measured largest batch. A rank without a capacity
    (None) is assumed typical: it gets the median weight of the others and no cap.

    Returns:
        ``(weights, caps)`` for :func:`hetero_ray.planning.plan.proportional_split`.

    Raises:
        ValueError: no rank has a capacity, or ``mean_local_batch_size`` ≤ 0.
    """
    if not mean_local_batch_size > 0:
        raise ValueError(f"mean_local_batch_size must be > 0, got {mean_local_batch_size}")
    known = [c.samples_per_s_at(mean_local_batch_size) for c in capacities if c is not None]
    if not known:
        raise ValueError("no rank has a measured capacity; fall back to equal shares")
    typical = statistics.median(known)
    weights = [typical if c is None else c.samples_per_s_at(mean_local_batch_size) for c in capacities]
    caps = [None if c is None else c.max_batch_size for c in capacities]
    return weights, caps


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _json_safe(value):
    """NaN/inf → None, numpy scalars → Python, recursively (JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _known(cls, d: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}
