"""The CPU quota this process runs under: the cgroup limit behind Kubernetes CPU limits,
``docker --cpus`` and systemd's ``CPUQuota``.

A quota is no speed: a process under one runs at full speed for ``quota`` out of every
``period`` and is then stopped until the next period. Its busy time at small batches
(which fit in that burst) says nothing about large ones, so the planner needs the quota
itself, read here from the kernel's files the way NVML reads a GPU's memory size:

- cgroup v2: ``/proc/self/cgroup`` has ``0::<path>``; ``<root>/<path>/cpu.max`` holds
  ``"<quota_us> <period_us>"`` or ``"max <period_us>"``;
- cgroup v1: the line whose controllers include ``cpu`` names the path under the cpu
  hierarchy's mount; ``cpu.cfs_quota_us`` (``-1``: none) and ``cpu.cfs_period_us``.

The limit that binds is the tightest of the process's cgroup and every ancestor's. The
node inventory (``nodes.json``) and the in-training profiler both read it here.
"""

from __future__ import annotations

import os
from typing import Optional

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_SELF_CGROUP = "/proc/self/cgroup"


def cpu_quota_cores(proc_cgroup: str = PROC_SELF_CGROUP, root: str = CGROUP_ROOT) -> Optional[float]:
    """Cores this process may use on average (e.g. 0.5 for 50 ms per 100 ms); None when no
    quota limits it or the files cannot be read (no cgroups, another OS)."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:  # v1 first: on a hybrid system the v1 cpu controller is the one enforced
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "cpu" in controllers.split(","):
            for mount in (os.path.join(root, controllers), os.path.join(root, "cpu")):
                if os.path.isdir(mount):
                    return _tightest(mount, path, _v1_quota)
    for line in lines:
        if line.startswith("0::"):
            return _tightest(root, line[3:], _v2_quota)
    return None


def _tightest(mount: str, path: str, read) -> Optional[float]:
    """The smallest quota of ``path`` and its ancestors under ``mount``."""
    parts = [p for p in path.split("/") if p]
    quotas = [read(os.path.join(mount, *parts[:depth])) for depth in range(len(parts), -1, -1)]
    quotas = [q for q in quotas if q is not None]
    return min(quotas) if quotas else None


def _v1_quota(directory: str) -> Optional[float]:
    quota = _read_number(os.path.join(directory, "cpu.cfs_quota_us"))
    period = _read_number(os.path.join(directory, "cpu.cfs_period_us"))
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None
    return quota / period


def _v2_quota(directory: str) -> Optional[float]:
    try:
        with open(os.path.join(directory, "cpu.max")) as f:
            quota, _, period = f.read().strip().partition(" ")
    except OSError:
        return None
    try:
        return float(quota) / float(period) if quota != "max" and float(period) > 0 else None
    except ValueError:
        return None


def _read_number(path: str) -> Optional[float]:
    try:
        with open(path) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None
