"""Per-rank gauges on Ray's metrics pipeline (Prometheus endpoint, Ray dashboard views).

Each training worker holds one :class:`RankGauges` and feeds it its step rows. Gauges are
tagged by ``experiment`` and ``rank`` (and ``node_id``) and appear, prefixed ``ray_`` by
Ray, about 10 s later on the node's metrics endpoint:

    ray_hetero_ray_samples_per_s     own throughput: local_batch_size / busy_time_s
    ray_hetero_ray_busy_time_s       busy time of the last step
    ray_hetero_ray_local_batch_size  this rank's share of the global batch
    ray_hetero_ray_gpu_util          percent, when the in-training profiler read it

Updates are rate-limited (``min_interval_s``): the last row wins, so calling
:meth:`RankGauges.update` every step costs a time check most of the time.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional

GAUGES = {
    "hetero_ray_samples_per_s": "samples per second of this rank's own compute (local batch / busy time)",
    "hetero_ray_busy_time_s": "busy time of the rank's last step: data + forward + backward (s)",
    "hetero_ray_local_batch_size": "the rank's share of the global batch (samples per step)",
    "hetero_ray_gpu_util": "GPU utilisation of the rank's device (percent)",
}
TAG_KEYS = ("experiment", "rank", "node_id")
DEFAULT_MIN_INTERVAL_S = 1.0  # Prometheus scrapes every 10 s or so; faster updates are lost anyway


class RankGauges:
    """Exports one rank's figures as ``ray.util.metrics`` gauges (see module docstring).

    Args:
        experiment_name: the ``experiment`` tag.
        min_interval_s: at most one export per this many seconds (0: every update).
        gauge_factory: ``(name, description, tag_keys) -> gauge`` with ``set(value, tags=)``;
            default :class:`ray.util.metrics.Gauge` (tests pass a fake).
    """

    def __init__(self, experiment_name: str, min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
                 gauge_factory: Optional[Callable[..., Any]] = None, clock: Callable[[], float] = time.monotonic):
        if gauge_factory is None:
            from ray.util.metrics import Gauge

            gauge_factory = Gauge
        self.experiment_name = experiment_name
        self._gauges = {name: gauge_factory(name, description, TAG_KEYS) for name, description in GAUGES.items()}
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._last_export = -math.inf

    def update(self, row: dict, force: bool = False) -> bool:
        """Exports the figures of one step row if the rate limit allows; True if it did."""
        now = self._clock()
        if not force and now - self._last_export < self._min_interval_s:
            return False
        self._last_export = now
        tags = {"experiment": self.experiment_name, "rank": str(row.get("rank", "")),
                "node_id": str(row.get("node_id") or "")}
        busy = _number(row.get("busy_time_s"))
        batch = _number(row.get("local_batch_size"))
        values = {
            "hetero_ray_samples_per_s": batch / busy if busy and busy > 0 and batch is not None else None,
            "hetero_ray_busy_time_s": busy,
            "hetero_ray_local_batch_size": batch,
            "hetero_ray_gpu_util": _number(row.get("gpu_util")),
        }
        for name, value in values.items():
            if value is not None:  # no reading → no point, rather than a made-up zero
                self._gauges[name].set(value, tags=tags)
        return True


def _number(value) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
