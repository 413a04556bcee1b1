"""Profiling the nodes of a cluster: one :class:`NodeProfiler` actor pinned to each node.

:class:`NodeProfiler` is a plain class (inventory → micro-benchmarks → optional model
probe → :class:`NodeCapability`), unit-testable without Ray. :func:`profile_cluster` is the
Ray shell: it starts one profiler per alive node with
``NodeAffinitySchedulingStrategy(node_id, soft=False)``, each taking the CPUs one training
worker gets (``cpus_per_worker``) and the node's GPUs, runs them all in parallel, prints
a line per node as it finishes (and, every few seconds, what the others are doing), turns
an error or a timeout into a ``failed`` capability while the others complete, and kills
the actors afterwards.

Where this runs: ``hetero-ray profile`` and, before the first step, ``hetero-ray train``
(the driver), both on the driver process; the actors run on the nodes.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from hetero_ray import validate
from hetero_ray.config import DATASETS, MODELS
from hetero_ray.errors import ConfigError
from hetero_ray.flags import int_list, setting
from hetero_ray.profile_defaults import (  # noqa: F401 (re-exported)
    DEFAULT_MICROBENCH_S, DEFAULT_PROBE_BATCH_SIZES, DEFAULT_PROFILE_TIMEOUT_S, DEFAULT_RAM_FRACTION,
)
from hetero_ray.profiling.capability import (
    CPU, FAILED, GPU, DeviceCapability, NodeCapability,
)
from hetero_ray.profiling.recipe import ProfileModel

PROGRESS_EVERY_S = 5.0  # "still profiling …" lines while nodes are busy
STAGE_QUERY_TIMEOUT_S = 1.0
PROFILER_ROLE = "profiler"


@dataclass
class ProfileConfig:
    """What to profile; validated here, so the CLI and the driver reject the same values.

    The fields with a flag (:func:`hetero_ray.flags.setting`) are ``hetero-ray profile``'s
    settings: its parser is generated from them.
    """

    # A ProfileModel; a built-in model's name as the --model flag gives it, which the command
    # turns into its recipe before profiling; None: inventory and micro-benchmarks only.
    model: Any = setting(None, f"also probe this model: one of {', '.join(MODELS)}")
    dataset: Optional[str] = setting(  # shapes of its samples
        None, f"sample shapes for --model: one of {', '.join(DATASETS)} (default: the model's synthetic data)")
    batch_sizes: tuple[int, ...] = setting(
        DEFAULT_PROBE_BATCH_SIZES, "probe batch sizes", type=int_list, metavar="B1,B2,...")
    cpus_per_worker: float = setting(  # what one training worker gets, so that is what is measured
        1.0, "CPUs one training worker gets; each profiler takes (and measures with) that many", type=float)
    ram_fraction: float = setting(  # CPU cap: share of available RAM for one batch
        DEFAULT_RAM_FRACTION, "CPU nodes: share of available RAM one worker's batch may use", type=float)
    timeout_s: float = setting(
        DEFAULT_PROFILE_TIMEOUT_S, "seconds for the whole cluster; nodes not done are reported as failed",
        name="--timeout", type=float, metavar="TIMEOUT")
    # No flag: set from Python only (tests shorten the micro-benchmarks).
    microbench_s: float = DEFAULT_MICROBENCH_S
    probe_cpu_on_gpu_nodes: bool = False  # GPU nodes train on their GPUs; skip the CPU probe

    def __post_init__(self):
        if self.model is not None and not isinstance(self.model, ProfileModel):
            validate.choice("--model", self.model, MODELS)
        if self.dataset is not None:
            validate.choice("--dataset", self.dataset, DATASETS)
            if self.model is None:
                raise ConfigError("--dataset only shapes the --model probe; pass --model too")
        self.batch_sizes = tuple(validate.probe_sizes("--batch-sizes", self.batch_sizes or ()))
        validate.positive_number("--cpus-per-worker", self.cpus_per_worker)
        validate.positive_number("--timeout", self.timeout_s, unit="seconds")
        validate.positive_number("microbench_s", self.microbench_s, unit="seconds")
        validate.fraction("--ram-fraction", self.ram_fraction, of="the available RAM")

    @property
    def num_threads(self) -> int:
        return max(1, int(round(self.cpus_per_worker)))

    @property
    def model_name(self) -> Optional[str]:
        return model_name(self.model)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def model_name(model) -> Optional[str]:
    """What nodes.json and the progress lines call ``model`` (a name or a ProfileModel)."""
    return getattr(model, "name", model)


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
                                    labels=dict(facts.get("labels") or {}), cpu=cpu)
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


def profile_cluster(
    model: Any = None,
    batch_sizes: Optional[Sequence[int]] = None,
    cpus_per_worker: float = 1.0,
    timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S,
    emit: Callable[[str], None] = print,
    planner=None,
    *,
    ram_fraction: float = DEFAULT_RAM_FRACTION,
    microbench_s: float = DEFAULT_MICROBENCH_S,
    experiment_name: Optional[str] = None,
    node_ids: Optional[Sequence[str]] = None,
    profiler_cls: type = NodeProfiler,
    reserve_cpus: bool = True,
) -> list[NodeCapability]:
    """Profiles every alive node of the connected Ray cluster in parallel.

    Args:
        model: also probe this model (busy-time line, largest batch): a
            :class:`~hetero_ray.profiling.recipe.ProfileModel` (a built-in model's:
            :func:`hetero_ray.builtin.recipe.builtin_recipe`); None for hardware only.
        batch_sizes: probe batch sizes (default 8, 16, 32, 64).
        cpus_per_worker: CPUs each profiler takes (and threads it uses): one worker's share.
        timeout_s: for the whole cluster; nodes not done by then are reported as failed.
        emit: where progress lines go.
        planner: if given, ``planner.set_capabilities.remote([...dicts])`` is called
            (and awaited) with the result.
        experiment_name: names the actors ``<experiment>/profiler/<node id[:8]>``
            (``profiler/<node id[:8]>`` without) in the ``hetero_ray`` namespace.
        node_ids: profile only these nodes (default: all alive nodes).
        profiler_cls: the class each actor runs, ``(config_dict, gpu_reader, node_facts)``
            (a subclass of :class:`NodeProfiler`, e.g. a test's NVML that fails on one node).
        reserve_cpus: False: the profilers take no logical CPUs (they run beside a worker
            group that holds them all; see :mod:`hetero_ray.runtime.node_profiling`).

    Returns:
        One :class:`NodeCapability` per node, in ``ray.nodes()`` order; failed nodes have
        ``status == "failed"`` and ``error`` set.

    Raises:
        ConfigError: invalid arguments (before anything starts).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from hetero_ray.constants import RAY_NAMESPACE
    from hetero_ray.profiling.inventory import node_facts

    if model is not None and not isinstance(model, ProfileModel):
        raise ConfigError(f"profile_cluster(model=...) takes a ProfileModel (a built-in model's: "
                          f"hetero_ray.builtin.recipe.builtin_recipe({model!r})), got {type(model).__name__}")
    config = ProfileConfig(model=model,
                           batch_sizes=tuple(batch_sizes or DEFAULT_PROBE_BATCH_SIZES),
                           cpus_per_worker=cpus_per_worker, timeout_s=timeout_s,
                           ram_fraction=ram_fraction, microbench_s=microbench_s)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if node_ids is not None:
        wanted = set(node_ids)
        nodes = [n for n in nodes if n["NodeID"] in wanted]
    facts = [node_facts(n) for n in nodes]
    name = config.model_name
    what = f" and {name} at batch {','.join(map(str, config.batch_sizes))}" if model else ""
    emit(f"[profile] profiling {len(nodes)} node(s): inventory, micro-benchmarks{what}…")

    started = time.monotonic()
    deadline = started + config.timeout_s
    results: dict[str, NodeCapability] = {}
    actors: dict[str, Any] = {}
    pending: dict[Any, str] = {}
    remote_cls = ray.remote(profiler_cls)
    try:
        for fact in facts:
            node_id = fact["node_id"]
            node_cpus = float(fact["resources"].get("CPU", 0.0))
            options = dict(
                namespace=RAY_NAMESPACE,
                num_cpus=min(config.cpus_per_worker, node_cpus) if reserve_cpus else 0,
                num_gpus=math.floor(fact["resources"].get("GPU", 0.0)),  # all of them: it benchmarks each
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                max_restarts=0,
                max_concurrency=2,  # profile() runs while stage() answers
            )
            try:
                actor = _start_named(remote_cls, options, _profiler_name(experiment_name, node_id),
                                     config.to_dict(), None, fact)
            except Exception as e:  # noqa: BLE001 - this node fails, the others go on
                results[node_id] = NodeCapability.failed(node_id, f"could not start a profiler: {e}",
                                                         **_known_facts(fact))
                continue
            actors[node_id] = actor
            pending[actor.profile.remote()] = node_id
        last_progress = time.monotonic()
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            done, _ = ray.wait(list(pending), num_returns=1, timeout=min(remaining, 1.0))
            for ref in done:
                node_id = pending.pop(ref)
                fact = next(f for f in facts if f["node_id"] == node_id)
                try:
                    capability = NodeCapability.from_dict(ray.get(ref))
                except Exception as e:  # noqa: BLE001 - the actor died or raised
                    capability = NodeCapability.failed(node_id, _short_error(e), **_known_facts(fact))
                results[node_id] = capability
                emit(f"[profile] {describe_node(capability, time.monotonic() - started, name)}")
            if pending and time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                last_progress = time.monotonic()
                stages = _stages({pending[r]: actors[pending[r]] for r in pending})
                emit("[profile] still profiling: "
                     + ", ".join(f"{nid[:8]} ({stages.get(nid, 'starting')})" for nid in pending.values()))
        if pending:
            stages = _stages({pending[r]: actors[pending[r]] for r in pending})
            for ref, node_id in pending.items():
                fact = next(f for f in facts if f["node_id"] == node_id)
                capability = NodeCapability.failed(
                    node_id, f"timed out after {config.timeout_s:g} s (last stage: "
                             f"{stages.get(node_id, 'not started: no room for the profiler?')})",
                    **_known_facts(fact))
                results[node_id] = capability
                emit(f"[profile] {describe_node(capability, time.monotonic() - started, name)}")
    finally:
        for actor in actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
    ordered = [results[f["node_id"]] for f in facts if f["node_id"] in results]
    if planner is not None:
        ray.get(planner.set_capabilities.remote([c.to_dict() for c in ordered]), timeout=60)
    return ordered


def describe_node(capability: NodeCapability, elapsed_s: Optional[float] = None, model: Optional[str] = None) -> str:
    """One line: ``node 1a2b3c4d (10.0.0.5): cpu 0.21 TFLOPS fp32, 8.4 GB/s, simple_cnn α=… (4.2 s)``."""
    head = f"node {capability.node_id[:8]} ({capability.ip or '?'})"
    took = f" ({elapsed_s:.1f} s)" if elapsed_s is not None else ""
    parts = []
    for device in capability.devices:
        label = "cpu" if device.kind == CPU else f"gpu{device.index} {device.name}"
        figures = [f"{device.matmul_tflops_fp32:.3g} TFLOPS fp32" if device.matmul_tflops_fp32 is not None else None,
                   f"{device.matmul_tflops_bf16:.3g} bf16" if device.matmul_tflops_bf16 is not None else None,
                   f"{device.memory_bandwidth_gbps:.3g} GB/s" if device.memory_bandwidth_gbps is not None else None,
                   f"h2d {device.h2d_gbps:.3g} GB/s" if device.h2d_gbps is not None else None]
        if device.has_probe:
            floor = f"floor {device.floor_s * 1e3:.3g} ms " if device.floor_s else ""
            figures.append(f"{model + ' ' if model else ''}{floor}α={device.alpha_s * 1e3:.2g} ms β={device.beta_s_per_sample * 1e3:.3g} ms/sample"
                           + (f" max batch {device.max_batch_size}" if device.max_batch_size is not None else ""))
        parts.append(f"{label} " + ", ".join(f for f in figures if f))
    body = "; ".join(parts)
    if capability.status == FAILED:
        return f"{head}: FAILED: {capability.error}" + (f" [{body}]" if body else "") + took
    return f"{head}: {body}{took}"


def _profiler_name(experiment_name: Optional[str], node_id: str) -> str:
    role = f"{PROFILER_ROLE}/{node_id[:8]}"
    return f"{experiment_name}/{role}" if experiment_name else role


def _start_named(cls, options: dict, name: str, *args):
    """Starts the actor under ``name``; if the name is taken (another profile of the same
    cluster is running), under ``name-<random>``."""
    try:
        return cls.options(name=name, **options).remote(*args)
    except ValueError:
        return cls.options(name=f"{name}-{uuid.uuid4().hex[:6]}", **options).remote(*args)


def _stages(actors: dict[str, Any]) -> dict[str, str]:
    import ray

    refs = {actor.stage.remote(): node_id for node_id, actor in actors.items()}
    done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=STAGE_QUERY_TIMEOUT_S)
    out = {}
    for ref in done:
        try:
            out[refs[ref]] = ray.get(ref)
        except Exception:  # noqa: BLE001 - a dead actor has no stage
            pass
    return out


def _known_facts(fact: dict) -> dict:
    return {k: fact.get(k) for k in ("ip", "hostname", "resources", "labels")}


def _short_error(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), type(error).__name__)
    return f"{type(error).__name__}: {last.strip()}"[:500]


def _gpu_fields(gpu: dict) -> dict:
    fields = {k: v for k, v in gpu.items() if k in DeviceCapability.__dataclass_fields__ and k != "error"}
    fields.setdefault("name", f"GPU {gpu['index']}")
    return fields
