"""What profiling found on each node.

:class:`NodeCapability` (one per node, holding :class:`DeviceCapability` per device) is
what a node profiler reports and what ``nodes.json`` and ``hetero-ray profile --json``
hold (:func:`capabilities_document`; the document's fields:
docs/profiling-and-planning.md#what-a-node-profile-holds). Every figure is measured on
that node (or read from NVML); a figure that was not measured is null. What the planner
makes of them (each rank's busy-time curve ``t_i(b) = max(τ_i, α_i + β_i·b)``, ``τ`` being
``floor_s``, and memory cap) is in :mod:`hetero_ray.planning.capacity`. Emulated speeds
are not applied here: a node profile cannot tell the ranks of one machine apart, so under
emulation the ranks measure themselves before step 0
(:mod:`hetero_ray.training.timing.warmup`) and only their memory caps come from here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
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
    # Model probe (when a model was given): t(b) = max(floor_s, alpha_s + beta_s_per_sample·b)
    alpha_s: Optional[float] = None
    beta_s_per_sample: Optional[float] = None
    floor_s: Optional[float] = None  # None in profiles from before the floor: a line
    fit_shape: Optional[str] = None  # "line" | "floor+line" | "flat" | "proportional"
    fit_max_rel_error: Optional[float] = None  # max |t(b) − measured| / measured over the probe
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
        if not (_finite(self.beta_s_per_sample) and self.beta_s_per_sample >= 0 and _finite(self.alpha_s)):
            return False
        floor = self.floor_s if _finite(self.floor_s) else 0.0
        return max(floor, self.alpha_s + self.beta_s_per_sample) > 0  # a positive busy time at one sample

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


# The platforms a node reports (NodeCapability.platform). A Windows machine joins a Linux
# cluster through WSL2 (docs/clusters.md): Python there says "Linux", and only the kernel's
# version string tells (profiling/inventory.py).
LINUX, WSL2, WSL1 = "linux", "wsl2", "wsl1"


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
    platform: Optional[str] = None  # linux, wsl2 (a Windows machine through WSL2), …; None: not read

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
                                                      "status", "error", "profile_time_s", "stage_times_s",
                                                      "platform")})
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


NODES_JSON_HINT = "write one with `hetero-ray profile --model MODEL --json FILE`"


def read_nodes_document(path: str, label: str) -> dict:
    """A ``nodes.json`` document as :func:`write_nodes_json` wrote it; a UserError naming
    ``label`` (the flag or field that gave the path) when it is missing, not JSON, or not
    a list of nodes."""
    from hetero_ray.errors import UserError

    if not os.path.isfile(path):
        raise UserError(f"{label} {path}: no such file; {NODES_JSON_HINT}")
    try:
        with open(path) as f:
            document = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{label} {path} is not JSON ({e}); {NODES_JSON_HINT}") from None
    nodes = document.get("nodes") if isinstance(document, dict) else None
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise UserError(f"{label} {path} has no list of nodes: not a nodes.json; {NODES_JSON_HINT}")
    return document


def node_named(node: dict, name: Optional[str]) -> bool:
    """Whether a node of a nodes.json document is the one a user named: a node-id prefix, a
    hostname or an IP (None names every node)."""
    return name is None or str(node.get("node_id", "")).startswith(name) or name in (node.get("hostname"),
                                                                                    node.get("ip"))


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
