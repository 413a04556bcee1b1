"""Profiling the nodes of a cluster: one :class:`~hetero_ray.profiling.node_profiler.NodeProfiler`
actor pinned to each node.

:func:`profile_cluster` starts one profiler per alive node with
``NodeAffinitySchedulingStrategy(node_id, soft=False)``, each taking the CPUs one training
worker gets (``cpus_per_worker``) and the node's GPUs, runs them all in parallel, prints
a line per node as it finishes (and, every few seconds, what the others are doing), turns
an error or a timeout into a ``failed`` capability while the others complete, and kills
the actors afterwards.

Where this runs: ``hetero-ray profile``, and a run's profiling
(:mod:`hetero_ray.runtime.node_profiling`), both on the driver process; the actors run on
the nodes.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any, Callable, Optional, Sequence

from hetero_ray.profiling.capability import NodeCapability
from hetero_ray.profiling.node_profiler import NodeProfiler
from hetero_ray.profiling.node_text import describe_node
from hetero_ray.profiling.profile_config import ProfileConfig

PROGRESS_EVERY_S = 5.0  # "still profiling …" lines while nodes are busy
STAGE_QUERY_TIMEOUT_S = 1.0
PROFILER_ROLE = "profiler"


def profile_cluster(config: ProfileConfig, *, emit: Callable[[str], None] = print, planner=None,
                    experiment_name: Optional[str] = None, node_ids: Optional[Sequence[str]] = None,
                    profiler_cls: type = NodeProfiler, reserve_cpus: bool = True) -> list[NodeCapability]:
    """Profiles every alive node of the connected Ray cluster in parallel, as ``config``
    says (its model: a :class:`~hetero_ray.profiling.recipe.ProfileModel`, a built-in
    model's by :func:`hetero_ray.builtin.recipe.builtin_recipe`; None for hardware only).

    Args:
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
        ConfigError: a model given by name (before anything starts).
    """
    import ray

    from hetero_ray.profiling.inventory import node_facts

    model = config.model
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if node_ids is not None:
        wanted = set(node_ids)
        nodes = [n for n in nodes if n["NodeID"] in wanted]
    facts = [node_facts(n) for n in nodes]
    name = config.model_name
    what = f" and {name} at batch {','.join(map(str, config.batch_sizes))}" if model else ""
    emit(f"[profile] profiling {len(nodes)} node(s): inventory, micro-benchmarks{what}…")

    run = _ProfilerRun(config, facts, emit, name)
    try:
        run.start(ray.remote(profiler_cls), experiment_name, reserve_cpus)
        run.gather()
        run.time_out_the_rest()
    finally:
        run.kill()
    ordered = [run.results[f["node_id"]] for f in facts if f["node_id"] in run.results]
    if planner is not None:
        ray.get(planner.set_capabilities.remote([c.to_dict() for c in ordered]), timeout=60)
    return ordered


class _ProfilerRun:
    """One profiling of the nodes: their profiler actors, what is still pending, the results."""

    def __init__(self, config: ProfileConfig, facts: list[dict], emit: Callable[[str], None], model_name):
        self.config, self.facts, self.emit, self.model_name = config, facts, emit, model_name
        self.started = time.monotonic()
        self.deadline = self.started + config.timeout_s
        self.results: dict[str, NodeCapability] = {}
        self.actors: dict[str, Any] = {}
        self.pending: dict[Any, str] = {}

    def start(self, remote_cls, experiment_name: Optional[str], reserve_cpus: bool) -> None:
        """A profiler pinned to each node, each asked to profile; a node whose actor cannot
        start fails at once, the others go on."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from hetero_ray.constants import RAY_NAMESPACE

        for fact in self.facts:
            node_id = fact["node_id"]
            node_cpus = float(fact["resources"].get("CPU", 0.0))
            options = dict(
                namespace=RAY_NAMESPACE,
                num_cpus=min(self.config.cpus_per_worker, node_cpus) if reserve_cpus else 0,
                num_gpus=math.floor(fact["resources"].get("GPU", 0.0)),  # all of them: it benchmarks each
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                max_restarts=0,
                max_concurrency=2,  # profile() runs while stage() answers
            )
            try:
                actor = _start_named(remote_cls, options, _profiler_name(experiment_name, node_id),
                                     self.config.to_dict(), None, fact)
            except Exception as e:  # noqa: BLE001 - this node fails, the others go on
                self.results[node_id] = NodeCapability.failed(node_id, f"could not start a profiler: {e}",
                                                              **_known_facts(fact))
                continue
            self.actors[node_id] = actor
            self.pending[actor.profile.remote()] = node_id

    def gather(self) -> None:
        """Each node's capability as it finishes (a line each), and every few seconds what
        the others are doing, until all are in or the deadline passes."""
        import ray

        last_progress = time.monotonic()
        while self.pending:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                return
            done, _ = ray.wait(list(self.pending), num_returns=1, timeout=min(remaining, 1.0))
            for ref in done:
                node_id = self.pending.pop(ref)
                try:
                    capability = NodeCapability.from_dict(ray.get(ref))
                except Exception as e:  # noqa: BLE001 - the actor died or raised
                    capability = NodeCapability.failed(node_id, _short_error(e), **_known_facts(self._fact(node_id)))
                self._done(node_id, capability)
            if self.pending and time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                last_progress = time.monotonic()
                stages = self._stages()
                self.emit("[profile] still profiling: "
                          + ", ".join(f"{nid[:8]} ({stages.get(nid, 'starting')})" for nid in self.pending.values()))

    def time_out_the_rest(self) -> None:
        """Every node still pending fails with the stage it was in."""
        if not self.pending:
            return
        stages = self._stages()
        for node_id in self.pending.values():
            self._done(node_id, NodeCapability.failed(
                node_id, f"timed out after {self.config.timeout_s:g} s (last stage: "
                         f"{stages.get(node_id, 'not started: no room for the profiler?')})",
                **_known_facts(self._fact(node_id))))

    def kill(self) -> None:
        import ray

        for actor in self.actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _done(self, node_id: str, capability: NodeCapability) -> None:
        self.results[node_id] = capability
        self.emit(f"[profile] {describe_node(capability, time.monotonic() - self.started, self.model_name)}")

    def _fact(self, node_id: str) -> dict:
        return next(f for f in self.facts if f["node_id"] == node_id)

    def _stages(self) -> dict[str, str]:
        return _stages({node_id: self.actors[node_id] for node_id in self.pending.values()})


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
