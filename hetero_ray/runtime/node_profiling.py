"""Profiling a run's nodes for its first plan, beside the worker group's start where that
costs the plan nothing.

A node profile takes seconds, which before the workers' start come before the first step.
So: on a single machine without GPUs the profilers run while the worker group starts
(reserving no logical CPUs), and rank 0's first plan request waits for them; on several
nodes without GPUs no node is profiled, and the first plan shares the batch by the CPU
cores each rank can use (:meth:`~hetero_ray.planning.planner.Planner.first_plan_from_cores`);
with GPUs, the nodes with GPUs are profiled before the workers start (the out-of-memory
search needs their GPUs free), and the CPU-only nodes once the first plan is made, beside
training, their ranks timing the model in a warm-up (:mod:`hetero_ray.training.timing.warmup`)
meanwhile. Why, and where each profile goes:
docs/profiling-and-planning.md#when-a-node-is-profiled-and-why
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Optional, Sequence

import ray

from hetero_ray.constants import DEVICE_LABEL
from hetero_ray.profiling.profile_config import ProfileConfig
from hetero_ray.runs import run_files

# Beyond the profiling's own timeout: the profilers' start, and handing the result over.
JOIN_SLACK_S = 30.0
FIRST_PLAN_POLL_S = 1.0  # the CPU-only nodes of a GPU cluster: asking whether the first plan is made


class NodeProfiling:
    """One run's node profiling, its course chosen from the nodes alive when it is made
    (the module docstring says which): :attr:`first_plan` for the planner's start, then
    :meth:`start` (now, beside the workers' start, or after the first plan), then
    :meth:`nodes` for the summary's verdicts."""

    def __init__(self, run_dir: str, experiment_name: str, config: ProfileConfig, uses_gpus: bool, *,
                 emit: Callable[[str], None] = print):
        from hetero_ray.runtime.cluster import alive_nodes

        self._run_dir, self._experiment_name, self._config = run_dir, experiment_name, config
        self._emit, self.timeout_s = emit, config.timeout_s
        nodes = alive_nodes()
        self._uses_gpus, self._num_nodes = uses_gpus, len(nodes)
        self._gpu_nodes, self._cpu_only = split_by_gpus(nodes)
        self._planner = None
        self._nodes: Optional[list[dict]] = None
        self._thread: Optional[threading.Thread] = None
        self._finishing = threading.Event()  # the run ended: a profiling still to start does not

    @property
    def first_plan(self) -> Optional[str]:
        """Where the first plan comes from (:meth:`Planner.start_launch`): the ranks' CPU
        cores on several CPU-only nodes, the profiles made beside the workers' start on
        one, and with GPUs the profiles handed over before training (None)."""
        if self._uses_gpus:
            return None
        return "cores" if self._num_nodes > 1 else "profiles"

    @property
    def first_plan_wait_s(self) -> float:
        """How long rank 0 waits for the profiles at its first plan request."""
        return self.timeout_s + JOIN_SLACK_S

    def start(self, store, planner) -> None:
        """Profiles beside the workers' start where that costs the first plan nothing, not
        at all on several CPU-only nodes, the GPU nodes now and the others after the first
        plan where there are GPUs (see the module docstring). ``planner`` was started with
        :attr:`first_plan`; nothing here waits for it, except the profiles of GPU nodes."""
        self._args = (self._run_dir, store, planner, self._experiment_name, self._config)
        self._kwargs = dict(emit=self._emit)
        self._planner = planner
        if self.first_plan == "cores":
            self._emit(f"[hetero_ray] {self._num_nodes} CPU-only nodes: no node profiles before the first step; the "
                       "ranks measure themselves (first plan by the CPU cores each can use, then by their step times)")
        elif self.first_plan == "profiles":
            self._thread = threading.Thread(target=self._run_beside, name="hetero_ray-node-profiling", daemon=True)
            self._thread.start()
        elif not self._gpu_nodes:  # GPUs asked for where no node declares one: every node is profiled first
            self._nodes = profile_nodes(*self._args, **self._kwargs)
        else:
            self._nodes = profile_nodes(*self._args, node_ids=self._gpu_nodes, **self._kwargs)  # the planner has them
            if self._cpu_only:
                self._emit(f"[hetero_ray] {len(self._cpu_only)} CPU-only node(s) are profiled after the first plan, "
                           "not before the first step: their ranks time the model themselves before step 0")
                self._thread = threading.Thread(target=self._run_after_first_plan, args=(self._cpu_only,),
                                                name="hetero_ray-node-profiling", daemon=True)
                self._thread.start()

    def _run_after_first_plan(self, node_ids: list[str]) -> None:
        """The CPU-only nodes of a GPU cluster, once the first plan is made: until then
        their probes would compete with the ranks' warm-up for the nodes' CPUs."""
        if not wait_for_first_plan(self._first_plan_made, self._finishing, FIRST_PLAN_POLL_S):
            return  # the run ended before its first plan: nothing waits for these profiles
        try:
            self._nodes = profile_nodes(*self._args, reserve_cpus=False, node_ids=node_ids, known=self._nodes or (),
                                        **self._kwargs)
            self._emit(f"[hetero_ray] the {len(node_ids)} CPU-only node(s) are profiled; the planner uses their "
                       "profiles from here on")
        except Exception as e:  # noqa: BLE001 - training goes on without them
            self._emit(f"[hetero_ray] warning: profiling the CPU-only nodes failed ({type(e).__name__}: {e}); "
                       "training goes on without their profiles")

    def _first_plan_made(self) -> bool:
        try:
            return ray.get(self._planner.info.remote(), timeout=30).get("plan") is not None
        except Exception:  # noqa: BLE001 - a planner restarting: ask again
            return False

    def _run_beside(self) -> None:
        try:
            self._nodes = profile_nodes(*self._args, reserve_cpus=False, **self._kwargs)
        except Exception as e:  # noqa: BLE001 - training goes on without profiles; it must not wait for them
            self._emit(f"[hetero_ray] warning: node profiling failed ({type(e).__name__}: {e}); the first plan "
                       "does without it")
            try:
                ray.get(self._planner.set_capabilities.remote([]), timeout=30)
            except Exception:  # noqa: BLE001 - a planner that is gone waits for nothing
                pass

    def nodes(self, wait: bool = True) -> Optional[list[dict]]:
        """The node profiles (node dicts of ``nodes.json``), or None: no profiles, or (with
        ``wait=False``, e.g. after Ctrl-C) not finished yet."""
        self._finishing.set()
        if self._thread is not None and self._thread.is_alive() and wait:
            self._emit("[hetero_ray] waiting for the node profiling to finish…")
            self._thread.join(timeout=self.first_plan_wait_s)
        return self._nodes


def wait_for_first_plan(first_plan_made: Callable[[], bool], finishing: threading.Event, poll_s: float) -> bool:
    """Whether the first plan was made, asking every ``poll_s`` until it is or the run
    ends (``finishing``). A run that ends between two questions is asked once more: a
    short run can make its first plan and finish within one poll, and its CPU-only nodes
    must still be profiled for nodes.json."""
    while True:
        ending = finishing.is_set()
        if first_plan_made():
            return True
        if ending:
            return False
        finishing.wait(poll_s)


def split_by_gpus(nodes: Sequence) -> tuple[list[str], list[str]]:
    """The ids of the nodes with GPUs (declared to Ray, or labelled as GPU machines) and of
    the others (``nodes``: :class:`~hetero_ray.runtime.cluster.NodeResources` each)."""
    with_gpus = [n.node_id for n in nodes if n.gpus > 0 or n.labels.get(DEVICE_LABEL) == "gpu"]
    return with_gpus, [n.node_id for n in nodes if n.node_id not in with_gpus]


def profile_nodes(run_dir: str, store, planner, experiment_name: str, config: ProfileConfig, *,
                  emit: Callable[[str], None] = print, reserve_cpus: bool = True,
                  node_ids: Optional[Sequence[str]] = None, known: Sequence[dict] = ()) -> list[dict]:
    """Profiles every node (or the nodes ``node_ids``) for the planner (hardware and
    ``config.model``: a ProfileModel); hands the profiles to the planner, and
    them with the ``known`` ones (node dicts profiled before) to the store and nodes.json.

    Returns the node profiles, known ones first (the node dicts of ``nodes.json``), for the
    bottleneck analysis.
    """
    from hetero_ray.profiling.capability import NodeCapability, capabilities_document, write_nodes_json
    from hetero_ray.runtime.cluster_profiling import profile_cluster

    profiled = profile_cluster(config, emit=emit, planner=planner, experiment_name=experiment_name,
                               reserve_cpus=reserve_cpus, node_ids=node_ids)
    again = {n.node_id for n in profiled}
    nodes = [NodeCapability.from_dict(n) for n in known if n.get("node_id") not in again] + profiled
    name, batch_sizes = config.model_name, list(config.batch_sizes)
    document = capabilities_document(nodes, name, batch_sizes)
    try:
        ray.get(store.set_nodes.remote(document["nodes"]), timeout=30)
    except Exception as e:  # noqa: BLE001 - the file below is the durable copy
        emit(f"[hetero_ray] warning: metrics store did not take the node profiles ({e})")
    write_nodes_json(os.path.join(run_dir, run_files.NODES_FILE), nodes, name, batch_sizes)
    failed = [n for n in profiled if not n.ok]
    if failed:
        emit(f"[hetero_ray] {len(failed)} node(s) could not be profiled; their ranks start with typical shares")
    unprobed = [n for n in profiled if n.ok and not any(d.has_probe for d in n.devices)]
    if unprobed:  # e.g. the user's ProfileModel raised: say so, not just train unbalanced
        errors = sorted({d.error for n in unprobed for d in n.devices if d.error})
        emit(f"[hetero_ray] warning: {name} could not be probed on {len(unprobed)} node(s) "
             f"({'; '.join(errors) or 'no probe result'}); their ranks start with typical shares")
    return document["nodes"]
