"""Reading GPUs through one small interface: NVML on a real machine, a fake in tests.

Everything that reads a GPU (the node profiler's inventory, the in-training resource
sampler) goes through a :class:`GpuReader`. :class:`NvmlGpuReader` is the real one
(``pynvml`` from the ``nvidia-ml-py`` package, imported only when used);
:class:`NoGpuReader` has no devices. Tests run the GPU code paths on a machine without a
GPU through a fake reader of their own (``tests/fakes.py``).

A value the hardware does not report (NVML ``NotSupported``, a field missing on an old
driver) is left out of the returned dict, never filled with a guess: the step records then
hold null, and the app shows a gap.

Indices are NVML's (physical order). A training worker sees its GPU as ``cuda:0`` when Ray
sets ``CUDA_VISIBLE_DEVICES``; :meth:`GpuReader.index_for_torch_device` maps a torch
index to the NVML one.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Protocol, runtime_checkable

# Fields of GpuReader.inventory (all but "name" may be absent when not reported).
INVENTORY_FIELDS = (
    "name", "memory_total_bytes", "sm_count", "compute_capability", "driver_version",
    "cuda_version", "power_limit_w", "pcie_gen", "pcie_width", "uuid",
)
# Fields of GpuReader.sample: the in-training columns of the steps table that NVML fills.
# gpu_util is a percentage (0–100) over NVML's last sample period (1/6 s to 1 s).
SAMPLE_FIELDS = ("gpu_util", "gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_temp_c", "gpu_power_w")


@runtime_checkable
class GpuReader(Protocol):
    """What the profiler and the resource sampler need to know about a node's GPUs."""

    #: Why there are no GPUs (NVML missing, driver not loaded…); None when there are.
    unavailable_reason: Optional[str]

    def device_count(self) -> int:
        """GPUs this reader sees (0 when there are none or NVML is unavailable)."""

    def inventory(self, index: int) -> dict[str, Any]:
        """Static facts of GPU ``index``: the keys of :data:`INVENTORY_FIELDS` it reports.

        Raises:
            IndexError: no GPU with that index.
        """

    def sample(self, index: int) -> dict[str, Any]:
        """Current readings of GPU ``index``: the keys of :data:`SAMPLE_FIELDS` it reports.

        Raises:
            IndexError: no GPU with that index.
        """

    def index_for_torch_device(self, torch_index: int) -> int:
        """The reader's index of the GPU torch calls ``cuda:<torch_index>``."""


class NoGpuReader:
    """A node without GPUs: nothing to inventory, nothing to sample."""

    def __init__(self, reason: Optional[str] = "no GPU"):
        self.unavailable_reason = reason

    def device_count(self) -> int:
        return 0

    def inventory(self, index: int) -> dict[str, Any]:
        raise IndexError(f"no GPU {index}: {self.unavailable_reason}")

    def sample(self, index: int) -> dict[str, Any]:
        raise IndexError(f"no GPU {index}: {self.unavailable_reason}")

    def index_for_torch_device(self, torch_index: int) -> int:
        return torch_index


class NvmlGpuReader:
    """The real GPUs of this machine through NVML.

    Initialises NVML on construction; when that fails (no driver, no library, a container
    without the device files) the reader has no devices and ``unavailable_reason`` says why.
    Individual readings that a GPU does not support are left out. Safe to call from several
    threads (NVML is thread-safe).
    """

    def __init__(self):
        self.unavailable_reason: Optional[str] = None
        self._nvml = None
        self._count = 0
        try:
            import pynvml  # nvidia-ml-py; imported here so machines without it still work

            pynvml.nvmlInit()
            self._count = int(pynvml.nvmlDeviceGetCount())
            self._nvml = pynvml
            if self._count == 0:
                self.unavailable_reason = "NVML found no GPU"
        except Exception as e:  # noqa: BLE001 - ImportError, NVMLError_*: no GPUs, reason kept
            self.unavailable_reason = f"NVML unavailable: {type(e).__name__}: {e}"

    def device_count(self) -> int:
        return self._count

    def inventory(self, index: int) -> dict[str, Any]:
        nv, handle = self._nvml, self._handle(index)
        out: dict[str, Any] = {}
        _read(out, "name", lambda: _text(nv.nvmlDeviceGetName(handle)))
        _read(out, "uuid", lambda: _text(nv.nvmlDeviceGetUUID(handle)))
        _read(out, "memory_total_bytes", lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).total))
        _read(out, "compute_capability",
              lambda: "{}.{}".format(*nv.nvmlDeviceGetCudaComputeCapability(handle)))
        _read(out, "driver_version", lambda: _text(nv.nvmlSystemGetDriverVersion()))
        _read(out, "cuda_version", lambda: _cuda_version(nv.nvmlSystemGetCudaDriverVersion()))
        _read(out, "power_limit_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
        # The max link this device and this slot support; the current link drops to gen 1
        # when the GPU idles, which would misreport an idle node.
        _read(out, "pcie_gen", lambda: int(nv.nvmlDeviceGetMaxPcieLinkGeneration(handle)))
        _read(out, "pcie_width", lambda: int(nv.nvmlDeviceGetMaxPcieLinkWidth(handle)))
        sm_count = _torch_sm_count(out.get("uuid"), index)  # NVML has no SM count
        if sm_count is not None:
            out["sm_count"] = sm_count
        return out

    def sample(self, index: int) -> dict[str, Any]:
        nv, handle = self._nvml, self._handle(index)
        out: dict[str, Any] = {}
        _read(out, "gpu_util", lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).gpu))
        memory = _try(lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        if memory is not None:
            out["gpu_mem_used_bytes"] = float(memory.used)
            out["gpu_mem_total_bytes"] = float(memory.total)
        _read(out, "gpu_temp_c", lambda: float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)))
        _read(out, "gpu_power_w", lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        return out

    def index_for_torch_device(self, torch_index: int) -> int:
        """Matches by UUID (exact under any CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER), then
        by the integer entries of CUDA_VISIBLE_DEVICES, then the index itself."""
        try:
            import torch

            uuid = str(torch.cuda.get_device_properties(torch_index).uuid)
            handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            return int(self._nvml.nvmlDeviceGetIndex(handle))
        except Exception:  # noqa: BLE001 - fall back to the environment's mapping
            pass
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if torch_index < len(visible) and visible[torch_index].isdigit():
            return int(visible[torch_index])
        return torch_index

    def _handle(self, index: int):
        if not 0 <= index < self._count:
            raise IndexError(f"no GPU {index}: NVML sees {self._count}"
                             + (f" ({self.unavailable_reason})" if self.unavailable_reason else ""))
        return self._nvml.nvmlDeviceGetHandleByIndex(index)


def gpu_reader() -> GpuReader:
    """NVML when it initialises and sees at least one GPU, otherwise a reader with none
    (its ``unavailable_reason`` says why)."""
    reader = NvmlGpuReader()
    if reader.device_count() > 0:
        return reader
    return NoGpuReader(reader.unavailable_reason)


def _try(read):
    try:
        return read()
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: not reported
        return None


def _read(out: dict, key: str, read) -> None:
    value = _try(read)
    if value is not None:
        out[key] = value


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(raw: int) -> str:
    """NVML's 12040 → "12.4"."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def _torch_sm_count(uuid: Optional[str], index: int) -> Optional[int]:
    """SMs of the GPU with this UUID (or this index) as torch sees it; None if torch cannot."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            if uuid and str(props.uuid) in uuid:
                return int(props.multi_processor_count)
        if index < torch.cuda.device_count() and not os.environ.get("CUDA_VISIBLE_DEVICES"):
            return int(torch.cuda.get_device_properties(index).multi_processor_count)
    except Exception:  # noqa: BLE001 - no CUDA torch, or a device torch cannot open
        return None
    return None
