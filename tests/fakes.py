"""Fakes for what cannot run here, each behind the interface the real thing implements.

:class:`FakeGpuReader` is a :class:`~hetero_ray.profiling.gpu.GpuReader` with realistic
figures of an A100, so the GPU code paths run on a machine without a GPU.
:class:`StoreBridge` answers the dashboard's Ray bridge calls from an in-process
:class:`~hetero_ray.metrics.store.MetricsStore`, as the store actor would.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from hetero_ray.metrics.store import MetricsStore


# Published figures of an NVIDIA A100-SXM4-40GB on a typical driver, and readings of one
# under a training load; the fake's samples move a little around these.
A100_40GB_INVENTORY = {
    "name": "NVIDIA A100-SXM4-40GB",
    "memory_total_bytes": 40 * 1024**3,  # NVML reports 40960 MiB
    "sm_count": 108,
    "compute_capability": "8.0",
    "driver_version": "535.129.03",
    "cuda_version": "12.2",
    "power_limit_w": 400.0,
    "pcie_gen": 4,
    "pcie_width": 16,
}
A100_LOAD_SAMPLE = {
    "gpu_util": 87.0,
    "gpu_mem_used_bytes": 31.5 * 1024**3,
    "gpu_temp_c": 64.0,
    "gpu_power_w": 312.5,
}


class FakeGpuReader:
    """``count`` identical fake A100s for tests; ``inventory``/``sample`` overrides per field.

    Samples cycle deterministically through small variations (±3 % utilisation, ±1 °C…), so
    code that aggregates samples sees them change, but every value stays physically
    plausible. ``fail_with`` makes every call raise that exception (an NVML error path).
    """

    def __init__(self, count: int = 1, inventory: Optional[dict] = None, sample: Optional[dict] = None,
                 fail_with: Optional[BaseException] = None, torch_to_reader: Optional[dict[int, int]] = None):
        self.unavailable_reason = None if count > 0 else "fake reader with no GPUs"
        self._count = count
        self._inventory = {**A100_40GB_INVENTORY, **(inventory or {})}
        self._sample = {**A100_LOAD_SAMPLE, **(sample or {})}
        self._fail_with = fail_with
        self._torch_to_reader = dict(torch_to_reader or {})
        self._lock = threading.Lock()
        self.samples_taken = 0

    def device_count(self) -> int:
        return self._count

    def inventory(self, index: int) -> dict[str, Any]:
        self._check(index)
        return {**self._inventory, "uuid": f"GPU-fake-{index:04d}"}

    def sample(self, index: int) -> dict[str, Any]:
        self._check(index)
        with self._lock:
            n = self.samples_taken
            self.samples_taken += 1
        wiggle = (n % 7 - 3) / 3.0  # in [-1, 1], deterministic
        total = float(self._inventory["memory_total_bytes"])
        return {
            "gpu_util": min(100.0, max(0.0, self._sample["gpu_util"] + 3.0 * wiggle)),
            "gpu_mem_used_bytes": min(total, float(self._sample["gpu_mem_used_bytes"]) * (1 + 0.01 * wiggle)),
            "gpu_mem_total_bytes": total,
            "gpu_temp_c": self._sample["gpu_temp_c"] + wiggle,
            "gpu_power_w": self._sample["gpu_power_w"] * (1 + 0.02 * wiggle),
        }

    def index_for_torch_device(self, torch_index: int) -> int:
        return self._torch_to_reader.get(torch_index, torch_index)

    def _check(self, index: int) -> None:
        if self._fail_with is not None:
            raise self._fail_with
        if not 0 <= index < self._count:
            raise IndexError(f"no GPU {index}: the fake has {self._count}")


class StoreBridge:
    """The bridge's interface over an in-process MetricsStore (what the actor would answer)."""

    def __init__(self, store: MetricsStore):
        self.store = store
        self.gone = False
        self.down = False
        self.calls = 0

    def _check(self):
        from hetero_ray_dashboards.ray_bridge import BridgeUnavailable, ExperimentGone

        if self.down:
            raise BridgeUnavailable("lost connection to the Ray cluster at 10.0.0.1:6379; retrying every 5 s")
        if self.gone:
            raise ExperimentGone("experiment 'x' ended")

    def updates(self, experiment, cursors, limit=50_000):
        self._check()
        self.calls += 1
        return self.store.updates_since(cursors, limit)

    def call(self, experiment, method, **kwargs):
        self._check()
        return getattr(self.store, method)(**kwargs)

    def experiments(self):
        self._check()
        return [self.store.experiment_name]

    def nodes(self):
        return [{"node_id": "n1", "ip": "10.0.0.1", "alive": True, "resources": {"CPU": 8.0}}]

    def status(self):
        return {"state": "lost" if self.down else "connected", "address": "10.0.0.1:6379",
                "message": "lost connection" if self.down else "live: connected"}
