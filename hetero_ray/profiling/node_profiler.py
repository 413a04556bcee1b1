"""Profiling one node: :class:`NodeProfiler`, a plain class (inventory → micro-benchmarks →
optional model probe → :class:`NodeCapability`), unit-testable without Ray. On a cluster
it runs as one actor pinned to each node
(:func:`hetero_ray.runtime.cluster_profiling.profile_cluster`).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Optional

from hetero_ray.profiling.capability import CPU, FAILED, GPU, DeviceCapability, NodeCapability
from hetero_ray.profiling.profile_config import ProfileConfig


class NodeProfiler:
    """Profiles the node it runs on (see the module docstring).

    Args:
        config: a :class:`ProfileConfig` or its dict.
        gpu_reader: default :func:`hetero_ray.profiling.gpu.gpu_reader` (NVML or none).
        node: the fields of this node from ``ray.nodes()`` (see
            :func:`~hetero_ray.profiling.inventory.node_facts`); default: looked up.
    """

    def __init__(self, config, gpu_reader=None, node: Optional[dict] = None):
        self.config = config if isinstance(config, ProfileConfig) else ProfileConfig(**config)
        self._gpu_reader = gpu_reader
        self._node = node
        self._stage = "starting"
        self._lock = threading.Lock()

    def stage(self) -> str:
        """What the profiler is doing now (callable while :meth:`profile` runs)."""
        with self._lock:
            return self._stage

    def profile(self) -> dict:
        """:meth:`run` as a plain dict (what crosses the Ray boundary)."""
        return self.run().to_dict()

    def run(self) -> NodeCapability:
        from hetero_ray.profiling import inventory
        from hetero_ray.profiling.gpu import gpu_reader

        started = time.perf_counter()
        stage_times: dict[str, float] = {}

        def timed(name: str, fn: Callable[[], Any]) -> Any:
            self._set_stage(name)
            t0 = time.perf_counter()
            try:
                return fn()
            finally:
                stage_times[name] = round(time.perf_counter() - t0, 3)

        facts = self._node if self._node is not None else timed("inventory", inventory.ray_node_info)
        reader = self._gpu_reader if self._gpu_reader is not None else gpu_reader()
        cpu = timed("cpu inventory", inventory.cpu_info)
        gpus = timed("gpu inventory", lambda: inventory.gpu_inventory(reader))
        capability = NodeCapability(**{k: facts.get(k) for k in ("node_id", "ip", "hostname")},
                                    resources=dict(facts.get("resources") or {}),
                                    labels=dict(facts.get("labels") or {}), cpu=cpu,
                                    platform=inventory.node_platform())
        problems: list[str] = []
        declared = int(capability.resources.get("GPU", 0))
        if declared > len(gpus):
            problems.append(f"Ray declares {declared} GPU(s) but {len(gpus)} could be read "
                            f"({getattr(reader, 'unavailable_reason', None) or 'no reason given'})")

        torch_index = self._torch_indices(reader, len(gpus))
        gpus = node_gpus(gpus, torch_index, declared)
        cpu_device = DeviceCapability(kind=CPU, name=cpu.model or "CPU", index=0,
                                      memory_total_bytes=cpu.ram_bytes)
        capability.devices.append(cpu_device)
        self._benchmark(cpu_device, "cpu", timed, probe=not gpus or self.config.probe_cpu_on_gpu_nodes)
        for gpu in gpus:
            device = DeviceCapability(kind=GPU, **_gpu_fields(gpu))
            capability.devices.append(device)
            if gpu.get("error"):
                problems.append(f"GPU {gpu['index']}: {gpu['error']}")
                continue
            if gpu["index"] not in torch_index:
                device.error = "not visible to torch in the profiler's process (CUDA_VISIBLE_DEVICES?)"
                problems.append(f"GPU {gpu['index']}: {device.error}")
                continue
            self._benchmark(device, f"cuda:{torch_index[gpu['index']]}", timed, probe=True)

        capability.profile_time_s = round(time.perf_counter() - started, 3)
        capability.stage_times_s = stage_times
        if problems:
            capability.status = FAILED
            capability.error = "; ".join(problems)
        self._set_stage("done")
        return capability

    def _benchmark(self, device: DeviceCapability, torch_device: str, timed, probe: bool) -> None:
        from hetero_ray.profiling.microbench import run_microbenchmarks
        from hetero_ray.profiling.model_probe import probe_model

        label = "cpu" if device.kind == CPU else f"gpu{device.index}"
        errors: list[str] = []
        figures = timed(f"{label} micro-benchmarks", lambda: run_microbenchmarks(
            torch_device, num_threads=self.config.num_threads, duration_s=self.config.microbench_s,
            on_stage=lambda s: self._set_stage(f"{label} {s}")))
        errors.append(figures.pop("error", None) or "")
        for key, value in figures.items():
            setattr(device, key, value)
        if self.config.model and probe:
            try:
                result = timed(f"{label} model probe", lambda: probe_model(
                    self.config.model, torch_device, batch_sizes=self.config.batch_sizes, num_threads=self.config.num_threads,
                    ram_fraction=self.config.ram_fraction,
                    on_stage=lambda s: self._set_stage(f"{label} {s}")))
                device.alpha_s = result.fit.alpha_s
                device.beta_s_per_sample = result.fit.beta_s_per_sample
                device.floor_s = result.fit.floor_s
                device.fit_shape = result.fit.shape
                device.fit_max_rel_error = result.fit.max_rel_error
                device.fit_r2 = result.fit.r2 if math.isfinite(result.fit.r2) else None
                device.max_batch_size = result.max_batch_size
                device.max_batch_size_method = result.max_batch_size_method + (
                    "" if result.max_batch_size_exhaustive else " (lower bound: search ran out of time)")
                device.probe = result.probe_rows()
            except Exception as e:  # noqa: BLE001 - the micro-benchmarks still stand
                errors.append(f"model probe: {type(e).__name__}: {e}")
        errors = [e for e in errors if e]
        if errors:
            device.error = "; ".join(errors)

    @staticmethod
    def _torch_indices(reader, count: int) -> dict[int, int]:
        """Reader (NVML) index → torch index, for the GPUs torch can use here."""
        if count == 0:
            return {}
        try:
            import torch

            if not torch.cuda.is_available():
                return {}
            return {reader.index_for_torch_device(i): i for i in range(torch.cuda.device_count())}
        except Exception:  # noqa: BLE001 - a CPU-only torch on a GPU node
            return {}

    def _set_stage(self, stage: str) -> None:
        with self._lock:
            self._stage = stage


def node_gpus(gpus: list[dict], torch_index: dict[int, int], declared: int) -> list[dict]:
    """The GPUs that belong to this Ray node: NVML lists every GPU of the machine, but a node
    started with ``--num-gpus=0`` and ``CUDA_VISIBLE_DEVICES=`` (a CPU-only node beside a GPU
    node on one machine, or a GPU machine lent to CPU work) owns none of them. A GPU torch
    cannot see is the node's only when Ray gives the node as many GPUs as NVML lists;
    otherwise it is another node's, and this node is profiled as CPU-only."""
    if declared >= len(gpus):
        return gpus
    return [g for g in gpus if g.get("error") or g["index"] in torch_index]


def _gpu_fields(gpu: dict) -> dict:
    fields = {k: v for k, v in gpu.items() if k in DeviceCapability.__dataclass_fields__ and k != "error"}
    fields.setdefault("name", f"GPU {gpu['index']}")
    return fields
