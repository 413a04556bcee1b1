"""Profiling: what each node can do before training, and what each rank does while it trains.

- :mod:`~hetero_ray.profiling.profile_config`: what to profile (``ProfileConfig``, frozen);
- :mod:`~hetero_ray.profiling.node_profiler`: one node's profile → :class:`NodeCapability`, a plain
  class; :mod:`~hetero_ray.runtime.cluster_profiling`: one profiler actor per node
  (:func:`profile_cluster`), behind ``hetero-ray profile`` and a run's first plan;
  :mod:`~hetero_ray.profiling.node_text`: a profile as one line;
- :mod:`~hetero_ray.profiling.capability`: the capability records and ``nodes.json`` (what the
  planner makes of them: :mod:`hetero_ray.planning.capacity`);
- :mod:`~hetero_ray.profiling.inventory`, :mod:`~hetero_ray.profiling.microbench`,
  :mod:`~hetero_ray.profiling.model_probe`: what a profiler runs on its node;
- :mod:`~hetero_ray.profiling.gpu`: the GPU interface (NVML, or none; tests bring a fake);
- :mod:`~hetero_ray.bottlenecks.classify`: the per-rank bottleneck classifier over step records.

Importing this package imports neither torch nor Ray.
"""

from hetero_ray.profiling.capability import (
    DeviceCapability, NodeCapability, capabilities_document, nodes_from_document, read_nodes_json, write_nodes_json,
)

__all__ = [
    "DeviceCapability", "NodeCapability", "capabilities_document", "nodes_from_document", "read_nodes_json",
    "write_nodes_json",
]
