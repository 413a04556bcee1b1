"""The in-training profiler: GPU and process readings attached to a rank's step records.

Runs on every training worker. The training step never reads NVML or psutil itself: every
``interval_steps`` steps :meth:`ResourceSampler.maybe_sample` wakes a daemon thread that
takes the readings, and returns at once with the latest ones it has, so a row carries
readings at most one interval old. It fills the steps table's GPU columns (NVML through the
:class:`~hetero_ray.profiling.gpu.GpuReader`, and torch's memory peak; GPU ranks only),
``cpu_util``, ``rss_bytes`` and ``cpu_util_from_step`` (psutil, every rank) and
``cpu_quota_cores`` (:mod:`hetero_ray.profiling.cgroup`). On a rank without a GPU the GPU
columns are left out, never invented. Each column, and why a thread:
docs/worker-runtime.md#resource-readings
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import torch

from hetero_ray.profiling.cgroup import cpu_quota_cores


class ResourceSampler:
    """Background readings of this worker's device and process.

    Args:
        device: the worker's torch device; GPU fields only for ``cuda``.
        gpu_reader: a :class:`~hetero_ray.profiling.gpu.GpuReader`; default NVML (or none).
        interval_steps: read every this many steps; 0 disables everything (no thread).
    """

    def __init__(self, device: torch.device, gpu_reader=None, interval_steps: int = 10):
        if isinstance(interval_steps, bool) or not isinstance(interval_steps, int) or interval_steps < 0:
            raise ValueError(f"--profile-interval must be a non-negative integer, got {interval_steps!r}")
        self.device = torch.device(device)
        self.interval_steps = interval_steps
        self._latest: dict[str, Any] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_triggered: Optional[int] = None
        self._asked_at: Optional[int] = None  # the step of the newest wake-up (set before it)
        self._last_read_step: Optional[int] = None  # the step the latest reading was asked at
        self._thread: Optional[threading.Thread] = None
        self.samples_taken = 0
        self.last_error: Optional[str] = None
        if interval_steps == 0:
            return
        import psutil

        self._process = psutil.Process()
        self._process.cpu_percent(None)  # primes the counter: the first real reading covers an interval
        self._gpu_index: Optional[int] = None
        self._reader = None
        # Without CUDA, torch answers 0 for the peak: that would be an invented reading.
        self._torch_cuda = self.device.type == "cuda" and torch.cuda.is_available()
        if self.device.type == "cuda":
            if gpu_reader is None:
                from hetero_ray.profiling.gpu import gpu_reader as default_reader

                gpu_reader = default_reader()
            self._reader = gpu_reader
            if gpu_reader.device_count() > 0:
                self._gpu_index = gpu_reader.index_for_torch_device(self.device.index or 0)
        self._thread = threading.Thread(target=self._run, name="hetero-ray-resource-sampler", daemon=True)
        self._thread.start()

    def maybe_sample(self, global_step: int) -> dict[str, Any]:
        """The latest readings (possibly empty before the first lands); wakes the reader
        thread when ``interval_steps`` steps have passed since it was last woken.

        Never blocks on a reading: it returns a copy of what is there.
        """
        if self.interval_steps == 0:
            return {}
        if self._last_triggered is None or global_step - self._last_triggered >= self.interval_steps \
                or global_step < self._last_triggered:  # a restart goes back in steps
            self._last_triggered = global_step
            self._asked_at = global_step
            self._wake.set()
        return dict(self._latest)

    def sample_now(self) -> dict[str, Any]:
        """Takes the readings in the calling thread (tests, and the first row of a run)."""
        if self.interval_steps == 0:
            return {}
        readings = self._read()
        self._latest = readings
        return dict(readings)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stops the reader thread (it is a daemon: a worker that exits without this is fine)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            asked_at = self._asked_at
            try:
                readings = self._read()
                if self._last_read_step is not None and asked_at is not None and asked_at >= self._last_read_step:
                    readings["cpu_util_from_step"] = int(self._last_read_step)
                self._last_read_step = asked_at
                self._latest = readings  # one reference swap: readers never see half a dict
            except Exception as e:  # noqa: BLE001 - a failed reading must never stop training
                self.last_error = f"{type(e).__name__}: {e}"

    def _read(self) -> dict[str, Any]:
        readings: dict[str, Any] = {}
        with self._process.oneshot():
            readings["cpu_util"] = float(self._process.cpu_percent(None))
            readings["rss_bytes"] = float(self._process.memory_info().rss)
        quota = cpu_quota_cores()
        if quota is not None:
            readings["cpu_quota_cores"] = quota
        if self.device.type == "cuda":
            if self._reader is not None and self._gpu_index is not None:
                try:
                    readings.update(self._reader.sample(self._gpu_index))
                except Exception as e:  # noqa: BLE001 - NVML hiccup: leave the GPU fields out
                    self.last_error = f"{type(e).__name__}: {e}"
            if self._torch_cuda:
                try:
                    readings["gpu_mem_peak_bytes"] = float(torch.cuda.max_memory_allocated(self.device))
                    torch.cuda.reset_peak_memory_stats(self.device)
                except Exception as e:  # noqa: BLE001 - a device torch cannot query: leave it out
                    self.last_error = f"{type(e).__name__}: {e}"
        self.samples_taken += 1
        return readings

    def __enter__(self) -> "ResourceSampler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
