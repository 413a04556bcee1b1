"""Which ranks to train on: the split that minimises compute plus communication.

    minimise over groups G ⊆ ranks and splits b:
        T(G, b) = max_{i∈G} t_i(b_i) + c(G),     Σ_{i∈G} b_i = B,   b_i = 0 for i ∉ G

``t_i`` is the cost curve (:mod:`~hetero_ray.planning.cost_model`), ``c(G)`` the step's
communication for the ranks in G, given by the caller; a rank outside G trains on nothing and
takes no part in the all-reduce. For a fixed G the split is :func:`solver.solve_split`'s;
every group is tried up to :data:`EXHAUSTIVE_MAX_RANKS` ranks (the exact optimum), beyond that
the fastest prefixes and greedy drops. Ties go to the larger group, then the lower ranks.
Pure: no Ray, nothing applied here.
Why: docs/profiling-and-planning.md#communication-and-ranks-left-out
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from hetero_ray.planning.solver import SizeBound, predicted_step_time_s, solve_split

EXHAUSTIVE_MAX_RANKS = 8  # 255 groups, one split each: ~0.1 s; beyond, the heuristic

CommCost = Callable[[frozenset], float]


@dataclass(frozen=True)
class SubsetSplit:
    """The best group and split found.

    Attributes:
        local_batch_sizes: per rank; 0 for a rank left out.
        group: the ranks that train (ascending).
        predicted_step_time_s: ``max_{i∈G} t_i(b_i) + c(G)``.
        compute_time_s: ``max_{i∈G} t_i(b_i)``.
        comm_time_s: ``c(G)``.
        all_ranks_step_time_s: T of the best split over every rank (NaN: not feasible).
        exhaustive: every group was tried (the optimum), not the heuristic's candidates.
    """

    local_batch_sizes: tuple[int, ...]
    group: tuple[int, ...]
    predicted_step_time_s: float
    compute_time_s: float
    comm_time_s: float
    all_ranks_step_time_s: float
    exhaustive: bool

    @property
    def left_out(self) -> tuple[int, ...]:
        return tuple(r for r, b in enumerate(self.local_batch_sizes) if b == 0)


def solve_subset_split(
    alphas: Sequence[float],
    betas: Sequence[float],
    global_batch_size: int,
    comm_cost_s: CommCost,
    min_size: SizeBound = 1,
    caps: Optional[Sequence[Optional[int]]] = None,
    floors: Optional[Sequence[float]] = None,
    must_include: Sequence[int] = (),
) -> SubsetSplit:
    """The group of ranks and their split minimising ``max_{i∈G} t_i(b_i) + c(G)``.

    Args:
        alphas, betas, floors: the ranks' curves ``t_i(b) = max(τ_i, α_i + β_i·b)``, as for
            :func:`solver.solve_split`.
        global_batch_size: B, trained in full by the group.
        comm_cost_s: ``c(G)`` in seconds for a group (a frozenset of ranks), finite and ≥ 0.
        min_size: the smallest share of a rank that trains (one, or one per rank).
        caps: per-rank largest share (None entries: no cap).
        must_include: ranks every group holds (the runtime keeps rank 0 in: it holds the
            run's state, see :mod:`hetero_ray.training.rank.replica_state`).

    Raises:
        ValueError: bad curves or bounds (as :func:`solver.solve_split`), a communication
            cost that is not a finite number ≥ 0, or no group that can hold B.
    """
    groups = _GroupSplits(alphas, betas, floors, global_batch_size, comm_cost_s, min_size, caps)
    n = groups.n
    everyone = tuple(range(n))
    exhaustive = n <= EXHAUSTIVE_MAX_RANKS
    required = {int(r) for r in must_include}
    if not required <= set(everyone):
        raise ValueError(f"must_include names ranks {sorted(required - set(everyone))} of {n}")
    if exhaustive:
        candidates = [g for k in range(1, n + 1) for g in itertools.combinations(everyone, k)]
    else:
        candidates = _heuristic_groups(everyone, groups.evaluate, groups.a, groups.beta, groups.tau)
    best = None
    for group in (g for g in candidates if required <= set(g)):
        result = groups.evaluate(group)
        if result is None:
            continue
        key = (result[0], -len(group), group)
        if best is None or key < best[0]:
            best = (key, group, result)
    if best is None:
        raise ValueError(f"no group of ranks can hold the global batch {global_batch_size} within its caps; "
                         "raise the caps, add workers or lower the global batch")
    _, group, (total, compute, comm, sizes) = best
    local = [0] * n
    for i, b in zip(group, sizes):
        local[i] = int(b)
    all_ranks = groups.evaluate(everyone)
    return SubsetSplit(tuple(local), group, total, compute, comm,
                       math.nan if all_ranks is None else all_ranks[0], exhaustive)


class _GroupSplits:
    """The best split over a group of ranks and its predicted step, once per group."""

    def __init__(self, alphas, betas, floors, global_batch_size: int, comm_cost_s: CommCost, min_size: SizeBound,
                 caps):
        self.a = np.asarray(alphas, dtype=np.float64).ravel()
        self.beta = np.asarray(betas, dtype=np.float64).ravel()
        self.n = n = self.a.size
        if n == 0:
            raise ValueError("no ranks to split over")
        self.tau = np.zeros(n) if floors is None else np.asarray(floors, dtype=np.float64).ravel()
        self.lo = np.broadcast_to(np.asarray(min_size, dtype=np.int64), (n,))
        self.cap = [None] * n if caps is None else list(caps)
        if len(self.cap) != n or self.beta.size != n or self.tau.size != n:
            raise ValueError(f"need one α, β, floor and cap per rank: got {n}, {self.beta.size}, {self.tau.size}, "
                             f"{len(self.cap)}")
        self.global_batch_size = global_batch_size
        self.comm_cost_s = comm_cost_s
        self._evaluated: dict[tuple[int, ...], Optional[tuple[float, float, float, list[int]]]] = {}

    def evaluate(self, group: tuple[int, ...]):
        """(T, compute, comm, sizes) of the best split over ``group``; None if it cannot hold B."""
        if group not in self._evaluated:
            self._evaluated[group] = self._split(group)
        return self._evaluated[group]

    def _split(self, group: tuple[int, ...]):
        idx, cap, B = list(group), self.cap, self.global_batch_size
        room = sum(B if cap[i] is None else cap[i] for i in idx)
        if int(self.lo[idx].sum()) > B or room < B:
            return None
        sizes = solve_split(self.a[idx], self.beta[idx], B, self.lo[idx], [cap[i] for i in idx], self.tau[idx])
        compute = predicted_step_time_s(self.a[idx], self.beta[idx], sizes, self.tau[idx])
        comm = self.comm_cost_s(frozenset(group))
        if not (isinstance(comm, (int, float)) and math.isfinite(comm) and comm >= 0):
            raise ValueError(f"communication cost for ranks {list(group)} must be a finite number ≥ 0, got {comm!r}")
        return compute + float(comm), compute, float(comm), sizes


def _heuristic_groups(everyone: tuple[int, ...], evaluate, a, beta, tau) -> list[tuple[int, ...]]:
    """Prefixes of the ranks by speed, and backward elimination from all ranks."""
    full = evaluate(everyone)
    if full is not None:
        sizes = np.asarray(full[3], dtype=np.float64)
        busy = np.maximum(tau, a + beta * sizes)
        speed = sizes / busy  # samples/s at its share of the all-rank optimum
    else:  # all ranks cannot hold B (a min_size too large): rank by speed at one sample
        speed = 1.0 / np.maximum(tau, a + beta)
    order = [int(r) for r in np.lexsort((np.arange(len(everyone)), -speed))]
    groups = [tuple(sorted(order[:k])) for k in range(1, len(order) + 1)]
    current = everyone
    while len(current) > 1:
        options = [tuple(r for r in current if r != out) for out in current]
        scored = [(evaluate(g)[0], g) for g in options if evaluate(g) is not None]
        now = evaluate(current)
        if not scored or (now is not None and min(scored)[0] >= now[0]):
            break
        current = min(scored)[1]
        groups.append(current)
    return groups
