"""What a node is: host, CPU, RAM, its Ray identity (id, IP, resources, labels), its GPUs.

Runs on the node itself (inside the node profiler actor). Facts only — throughput is
measured by :mod:`hetero_ray.profiling.microbench`, never looked up from a model name.
"""

from __future__ import annotations

import platform
import socket
from typing import Any, Optional

import psutil

from hetero_ray.profiling.capability import LINUX, WSL1, WSL2, CpuInfo
from hetero_ray.profiling.cgroup import cpu_quota_cores
from hetero_ray.profiling.gpu import GpuReader

def cpu_info() -> CpuInfo:
    """CPU model, core counts, total RAM, and the CPU quota of this process's cgroup."""
    return CpuInfo(
        model=cpu_model(),
        physical_cores=psutil.cpu_count(logical=False),
        logical_cores=psutil.cpu_count(logical=True),
        ram_bytes=int(psutil.virtual_memory().total),
        cpu_quota_cores=cpu_quota_cores(),
    )


def node_platform() -> str:
    """This node's platform: ``wsl2`` for Linux inside WSL2, ``wsl1``, else the OS in lower case
    (``linux``, ``darwin``, ``windows``)."""
    try:
        with open("/proc/version") as f:
            proc_version = f.read()
    except OSError:
        proc_version = ""
    return platform_from(platform.system(), platform.release(), proc_version)


def platform_from(system: str, release: str, proc_version: str = "") -> str:
    """The platform from what the OS says about itself.

    WSL2's kernel names itself in its release and ``/proc/version``
    (``5.15.167.4-microsoft-standard-WSL2``); WSL1 has no Linux kernel and reports a
    Windows build as ``4.4.0-19041-Microsoft``. A custom WSL2 kernel may drop the
    ``-WSL2`` suffix but keeps ``microsoft-standard``.
    """
    text = f"{release} {proc_version}".lower()
    if system.lower() == "linux" and "microsoft" in text:
        return WSL2 if ("wsl2" in text or "microsoft-standard" in text) else WSL1
    return system.lower() or LINUX


def cpu_model() -> Optional[str]:
    """``model name`` from /proc/cpuinfo (x86), ``Model``/``Hardware`` (ARM), else platform's."""
    try:
        with open("/proc/cpuinfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        for key in ("model name", "Model", "Hardware", "cpu model"):
            for name, value in fields.items():
                if name.strip() == key and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def ray_node_info(node_id: Optional[str] = None) -> dict[str, Any]:
    """``node_id``, ``ip``, ``hostname``, ``resources`` and ``labels`` of a Ray node (this one
    by default), from the GCS node table; empty fields when Ray is not initialised."""
    import ray

    if not ray.is_initialized():
        return {"node_id": node_id or "", "ip": None, "hostname": socket.gethostname(),
                "resources": {}, "labels": {}}
    node_id = node_id or ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return node_facts(node)
    return {"node_id": node_id, "ip": None, "hostname": socket.gethostname(), "resources": {}, "labels": {}}


def node_facts(node: dict) -> dict[str, Any]:
    """The fields of :class:`NodeCapability` that one entry of ``ray.nodes()`` gives."""
    return {
        "node_id": node.get("NodeID", ""),
        "ip": node.get("NodeManagerAddress"),
        "hostname": node.get("NodeManagerHostname"),
        "resources": {str(k): float(v) for k, v in (node.get("Resources") or {}).items()
                      if not str(k).startswith("node:")},  # "node:<ip>" says nothing new
        "labels": {str(k): str(v) for k, v in (node.get("Labels") or {}).items()},
    }


def gpu_inventory(reader: GpuReader) -> list[dict[str, Any]]:
    """The reader's inventory of every GPU, with its ``index``; a GPU whose inventory fails
    is listed with ``error`` instead of being dropped."""
    out = []
    for index in range(reader.device_count()):
        try:
            out.append({"index": index, **reader.inventory(index)})
        except Exception as e:  # noqa: BLE001 - NVML error on one GPU: report it, go on
            out.append({"index": index, "name": f"GPU {index}", "error": f"{type(e).__name__}: {e}"})
    return out

