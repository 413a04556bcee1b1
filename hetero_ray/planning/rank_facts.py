"""What a worker group knows of its ranks for its first plan, as one value.

Rank 0 gathers it as the group starts (the node, device, cores and warm-up line of every
rank: training/rank/identity.py, training/timing/warmup.py) and hands it to the planner
(:meth:`hetero_ray.planning.planner.Planner.plan_for`), which makes the group's first plan
from whatever of it is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class RankFacts:
    """One entry per rank, in rank order, for each fact the group knows; None where it
    does not know that fact (a later plan of the same group needs none of them)."""

    node_ids: Optional[Sequence[str]] = None  # the Ray node each rank runs on
    device_kinds: Optional[Sequence[str]] = None  # "gpu" | "cpu"
    fits: Optional[Sequence[Optional[dict]]] = None  # each rank's warm-up line {"alpha_s", "beta_s_per_sample", …}
    cpus: Optional[Sequence[dict]] = None  # {"threads", "quota_cores"}: the cores each rank can use

    def __post_init__(self):
        for name in ("node_ids", "device_kinds", "fits", "cpus"):  # a frozen value holds no lists
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value))

    def placed(self, num_workers: int) -> bool:
        """Whether the ranks' nodes are known for a group of ``num_workers``."""
        return self.node_ids is not None and len(self.node_ids) == num_workers


NO_FACTS = RankFacts()
