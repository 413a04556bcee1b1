"""The plan: each rank's share of the global batch.

A :class:`Plan` is the unit that every other part agrees on: the planner publishes it,
rank 0 broadcasts it, the sampler cuts windows with it, the gradient hook weights by it,
and the metrics store records it. It is immutable; a change is a new plan with a higher
``version``.

The integer splits here keep ``Σ local_batch_sizes == global_batch_size`` exactly; the
splits that follow speeds are the solver's (:mod:`hetero_ray.planning.solver`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class Plan:
    """Per-rank local batch sizes for one global batch.

    Attributes:
        version: increases by one with every adopted change; 0 is the initial plan.
        local_batch_sizes: ``b_i`` for rank ``i``; ``b_i = 0`` leaves rank ``i`` out (it
            trains on nothing and does not take part in the gradient all-reduce: see
            :mod:`hetero_ray.planning.subset`); at least one rank is in.
        reason: why this plan exists (policy name, decision), for the plan history.
        probe_sizes: per rank, the most samples it runs as its probe while left out (0 for
            the ranks in; :mod:`hetero_ray.planning.probes`); empty where the plan's maker
            knew no curves (the loader then probes half the rank's last share).
        check_after_steps: a trial's (:mod:`hetero_ray.planning.moves`): the ranks ask the
            planner again this many steps (plus their lookahead) after the plan came into
            force, so that a trial that made the step worse is undone then rather than at the
            next rebalance point (:func:`next_point`); 0: at the next rebalance point.
    """

    version: int
    local_batch_sizes: tuple[int, ...]
    reason: str = field(default="", compare=False)
    probe_sizes: tuple[int, ...] = field(default=(), compare=False)
    check_after_steps: int = field(default=0, compare=False)

    def __post_init__(self):
        sizes = tuple(int(b) for b in self.local_batch_sizes)
        object.__setattr__(self, "local_batch_sizes", sizes)
        if not sizes:
            raise ValueError("a plan needs at least one rank")
        if any(b < 0 for b in sizes) or not any(sizes):
            raise ValueError(f"local batch sizes must be ≥ 0 with at least one rank in, got {list(sizes)}")
        if self.version < 0:
            raise ValueError(f"plan version must be ≥ 0, got {self.version}")
        if self.check_after_steps < 0:
            raise ValueError(f"check_after_steps must be ≥ 0, got {self.check_after_steps}")
        probes = tuple(int(p) for p in self.probe_sizes)
        object.__setattr__(self, "probe_sizes", probes)
        if probes and (len(probes) != len(sizes) or any(p < 0 or (p > 0) != (b == 0) for p, b in zip(probes, sizes))):
            raise ValueError(f"probe sizes must be > 0 for the ranks left out and 0 for the ranks in, "
                             f"got {list(probes)} for shares {list(sizes)}")

    @property
    def num_workers(self) -> int:
        return len(self.local_batch_sizes)

    @property
    def in_ranks(self) -> tuple[int, ...]:
        """The ranks that train (``b_i > 0``), ascending: the group of the gradient all-reduce."""
        return tuple(r for r, b in enumerate(self.local_batch_sizes) if b > 0)

    @property
    def left_out(self) -> tuple[int, ...]:
        """The ranks the plan leaves out (``b_i = 0``)."""
        return tuple(r for r, b in enumerate(self.local_batch_sizes) if b == 0)

    @property
    def global_batch_size(self) -> int:
        return sum(self.local_batch_sizes)

    def shares(self) -> list[float]:
        """Each rank's fraction of the global batch, ``b_i / B``."""
        total = self.global_batch_size
        return [b / total for b in self.local_batch_sizes]

    def cut(self, window_size: int) -> list[int]:
        """Per-rank piece sizes for a window of ``window_size`` samples.

        A full window (``window_size == B``) is cut exactly by the plan. The last, shorter
        window of an epoch is cut by the same rule, scaled: pieces proportional to
        ``b_i`` by largest remainder, so they still sum to the window; a rank may get 0.
        """
        if window_size == self.global_batch_size:
            return list(self.local_batch_sizes)
        if not 0 <= window_size <= self.global_batch_size:
            raise ValueError(
                f"window of {window_size} samples does not fit a global batch of "
                f"{self.global_batch_size}"
            )
        return largest_remainder(self.local_batch_sizes, window_size)

    def with_sizes(self, local_batch_sizes: Sequence[int], reason: str,
                   probe_sizes: Sequence[int] = ()) -> "Plan":
        """The next version of this plan with new sizes (same global batch)."""
        plan = Plan(self.version + 1, tuple(local_batch_sizes), reason, tuple(probe_sizes))
        if plan.global_batch_size != self.global_batch_size:
            raise ValueError(
                f"new plan sums to {plan.global_batch_size}, expected {self.global_batch_size}"
            )
        return plan

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "local_batch_sizes": list(self.local_batch_sizes),
            "reason": self.reason,
            **({"probe_sizes": list(self.probe_sizes)} if self.probe_sizes else {}),
            **({"check_after_steps": self.check_after_steps} if self.check_after_steps else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        return cls(int(d["version"]), tuple(d["local_batch_sizes"]), d.get("reason", ""),
                   tuple(d.get("probe_sizes") or ()), int(d.get("check_after_steps", 0)))

    def __str__(self) -> str:
        return f"v{self.version} " + "/".join(str(b) for b in self.local_batch_sizes)


def next_point(point: int, plan: Plan, changed: bool, interval: int, lookahead_steps: int) -> int:
    """The rebalance point after ``point``, where the ranks agreed on ``plan`` (``changed``:
    it replaced another): the next multiple of ``interval``, or a changed trial's check
    point if that comes sooner. The check point lies ``lookahead_steps`` further on than
    the check itself, since the ranks agree on a point that many steps before it."""
    following = (point // interval + 1) * interval
    if changed and plan.check_after_steps:
        return min(following, point + plan.check_after_steps + lookahead_steps)
    return following


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Integers proportional to ``weights`` that sum to exactly ``total``.

    Hamilton's method: floor every quota ``total·w_i/Σw``, then give the leftover units to
    the largest fractional parts (ties to the lower rank, so the result is deterministic).
    """
    weight_sum = float(sum(weights))
    if total < 0 or weight_sum <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"cannot split {total} by weights {list(weights)}")
    quotas = [total * w / weight_sum for w in weights]
    sizes = [math.floor(q) for q in quotas]
    leftover = total - sum(sizes)
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - sizes[i]), i))
    for i in order[:leftover]:
        sizes[i] += 1
    return sizes


def equal_split(global_batch_size: int, num_workers: int) -> list[int]:
    """Equal shares; the first ``B mod n`` ranks get one sample more."""
    base, extra = divmod(global_batch_size, num_workers)
    return [base + (1 if rank < extra else 0) for rank in range(num_workers)]
