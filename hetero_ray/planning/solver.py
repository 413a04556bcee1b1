"""The split solver: the integer local batch sizes that minimise the step time.

    minimise   max_i t_i(b_i),   t_i(b) = α_i + β_i·b
    subject to Σ_i b_i = B,   lo_i ≤ b_i ≤ hi_i,   b_i integer

Continuous relaxation (water-filling): every rank that is not at a bound finishes at a
common time ``T``; ``b_i(T) = clamp((T − α_i)/β_i, lo_i, hi_i)`` and ``T`` solves
``Σ b_i(T) = B`` (:func:`continuous_split`, exact, by sorting the breakpoints).

Integer problem: think of rank i's k-th sample beyond ``lo_i`` as a unit finishing at
``α_i + β_i·(lo_i + k)``. Giving each unit in turn to the rank that would finish it
first (greedy) is optimal for a separable convex minimax, and it takes exactly the
``B − Σ lo_i`` units that finish earliest. So with

    b_i(L) = clamp(⌊(L − α_i)/β_i⌋, lo_i, hi_i)       (units finishing by time L)

the answer is ``b(L*)`` at the smallest level ``L*`` with ``Σ b_i(L*) ≥ B``, less the
surplus among the units finishing exactly at ``L*``. ``L*`` is found by bisection on
``L`` (each probe is one vectorised pass); when a probe hits ``Σ b_i(L) = B`` exactly,
that is the answer. Ties go to the unit that finishes first, then to the lower rank, so
the result is deterministic and a faster rank (smaller β, equal α) never gets less.
The integer optimum is at most ``max_i β_i`` above the continuous one.

Shares proportional to throughput are the special case ``α_i = 0``
(:func:`proportional_split`).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

_MAX_BISECTIONS = 200  # float64 halves a bracket at most ~1100 times; 200 is ample in practice

SizeBound = Union[int, Sequence[int]]


def predicted_step_time_s(alphas, betas, sizes) -> float:
    """``max_i (α_i + β_i·b_i)``: the step time the cost model predicts for a split."""
    a = np.asarray(alphas, dtype=np.float64)
    b = np.asarray(betas, dtype=np.float64)
    s = np.asarray(sizes, dtype=np.float64)
    if not (a.shape == b.shape == s.shape) or a.size == 0:
        raise ValueError(f"need one α, β and size per rank, got {a.size}, {b.size}, {s.size}")
    return float(np.max(a + b * s))


def solve_split(
    alphas: Sequence[float],
    betas: Sequence[float],
    global_batch_size: int,
    min_size: SizeBound = 1,
    caps: Optional[Sequence[Optional[int]]] = None,
) -> list[int]:
    """Integer local batch sizes minimising ``max_i α_i + β_i·b_i`` with ``Σ b_i = B``.

    Args:
        alphas: per-rank fixed cost α_i (s), finite.
        betas: per-rank cost per sample β_i (s/sample), finite and > 0.
        global_batch_size: B.
        min_size: lower bound, one for all ranks or one per rank (≥ 1; a rank pinned to
            its current size has ``min_size[i] == caps[i]``).
        caps: per-rank upper bound (memory), ``None`` entries for no cap.

    Returns:
        ``b_i`` per rank: sum exactly B, within bounds, max finishing time minimal.

    Raises:
        ValueError: bad α/β, or bounds that make ``Σ b_i = B`` impossible.
    """
    a, beta, lo, hi, total = _validated(alphas, betas, global_batch_size, min_size, caps)
    if lo.sum() == total:
        return lo.astype(np.int64).tolist()

    def sizes_at(level: float) -> np.ndarray:
        # b_i(L) = clamp(⌊(L − α_i)/β_i⌋, lo_i, hi_i)
        return np.clip(np.floor((level - a) / beta), lo, hi)

    # Bracket: at L_lo every rank is at lo (sum < B), at L_hi every rank is at hi (sum ≥ B).
    level_lo = float(np.min(a + beta * lo))
    level_hi = float(np.max(a + beta * hi))
    sizes = None
    for _ in range(_MAX_BISECTIONS):
        mid = 0.5 * (level_lo + level_hi)
        if not level_lo < mid < level_hi:
            break
        candidate = sizes_at(mid)
        got = candidate.sum()
        if got == total:
            sizes = candidate
            break
        if got < total:
            level_lo = mid
        else:
            level_hi = mid
    if sizes is None:
        # The remaining units all finish within (L_lo, L_hi], a float's width: give them,
        # one rank at a time, to the earliest next finishing time, ties to the lower rank.
        sizes = sizes_at(level_lo)
        while (missing := int(total - sizes.sum())) > 0:
            next_finish = np.where(sizes < hi, a + beta * (sizes + 1), np.inf)
            order = np.lexsort((np.arange(a.size), next_finish))[:missing]
            order = order[np.isfinite(next_finish[order])]
            if order.size == 0:  # unreachable: Σ hi ≥ B was checked
                raise RuntimeError("split solver: no rank can take the remaining samples")
            sizes[order] += 1
    return sizes.astype(np.int64).tolist()


def proportional_split(
    global_batch_size: int,
    weights: Sequence[float],
    min_size: SizeBound = 1,
    caps: Optional[Sequence[Optional[int]]] = None,
) -> list[int]:
    """Shares proportional to ``weights`` (throughputs, samples/s): :func:`solve_split` at
    ``α_i = 0``, ``β_i = 1/w_i``, where every rank finishes its share ``b_i`` at the common
    time ``b_i / w_i``.

    A rank of weight 0 gets more than ``min_size`` only once every other rank is at its
    cap; when all weights are 0, the shares are equal.

    Raises:
        ValueError: a weight that is negative or not finite, or bounds that make
            ``Σ b_i = B`` impossible.
    """
    w = np.asarray(weights, dtype=np.float64).ravel()
    if w.size == 0:
        raise ValueError("no ranks to split over")
    if not (np.isfinite(w).all() and (w >= 0).all()):
        raise ValueError(f"weights must be finite and ≥ 0, got {list(weights)}")
    if not (w > 0).any():
        w = np.ones(w.size)
    positive = w > 0
    betas = np.ones(w.size)
    betas[positive] = 1.0 / w[positive]
    # No throughput: its first sample beyond min_size finishes after any other rank's last (≤ B).
    betas[~positive] = float(np.max(betas[positive])) * (global_batch_size + 1)
    return solve_split(np.zeros(w.size), betas, global_batch_size, min_size, caps)


def continuous_split(
    alphas: Sequence[float],
    betas: Sequence[float],
    global_batch_size: int,
    min_size: SizeBound = 1,
    caps: Optional[Sequence[Optional[int]]] = None,
) -> tuple[float, np.ndarray]:
    """The relaxed (real-valued) optimum: the common finishing time ``T`` and ``b_i(T)``.

    ``S(T) = Σ clamp((T − α_i)/β_i, lo_i, hi_i)`` is piecewise linear and increasing;
    rank i starts growing at ``α_i + β_i·lo_i`` (slope += 1/β_i) and stops at
    ``α_i + β_i·hi_i`` (slope −= 1/β_i). Sorting these breakpoints gives ``S`` at each of
    them by a cumulative sum, and ``T`` by linear interpolation where ``S`` crosses B.
    """
    a, beta, lo, hi, total = _validated(alphas, betas, global_batch_size, min_size, caps)
    points = np.concatenate([a + beta * lo, a + beta * hi])
    slope_steps = np.concatenate([1.0 / beta, -1.0 / beta])
    order = np.argsort(points, kind="stable")
    points, slope_steps = points[order], slope_steps[order]
    slope_after = np.cumsum(slope_steps)  # dS/dT just after each breakpoint
    # S(p_k) = Σ lo + Σ_{j<k} slope_after_j·(p_{j+1} − p_j)
    s_at = lo.sum() + np.concatenate([[0.0], np.cumsum(slope_after[:-1] * np.diff(points))])
    k = int(np.searchsorted(s_at, total, side="left"))
    if k == 0:
        level = float(points[0])
    elif k >= points.size:
        level = float(points[-1])
    else:
        level = float(points[k - 1] + (total - s_at[k - 1]) / slope_after[k - 1])
    return level, np.clip((level - a) / beta, lo, hi)


def _validated(alphas, betas, global_batch_size, min_size, caps):
    a = np.asarray(alphas, dtype=np.float64).ravel()
    beta = np.asarray(betas, dtype=np.float64).ravel()
    n = a.size
    if n == 0:
        raise ValueError("no ranks to split over")
    if beta.size != n:
        raise ValueError(f"got {n} alphas but {beta.size} betas; give one of each per rank")
    if isinstance(global_batch_size, bool) or int(global_batch_size) != global_batch_size or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a positive integer, got {global_batch_size!r}")
    total = int(global_batch_size)
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise ValueError(f"alphas must be finite; rank {bad[0]} has {a[bad[0]]}")
    bad = np.flatnonzero(~(np.isfinite(beta) & (beta > 0)))
    if bad.size:
        raise ValueError(f"betas must be finite and > 0; rank {bad[0]} has {beta[bad[0]]}")
    lo = np.broadcast_to(np.asarray(min_size, dtype=np.int64), (n,)).astype(np.float64)
    if np.any(lo < 1):
        raise ValueError(f"min_size must be ≥ 1 for every rank (every rank needs a sample), got {min_size}")
    if caps is None:
        hi = np.full(n, float(total))
    else:
        if len(caps) != n:
            raise ValueError(f"got {len(caps)} caps for {n} ranks; give one per rank (None: no cap)")
        hi = np.array([total if c is None else c for c in caps], dtype=np.float64)
    below = np.flatnonzero(hi < lo)
    if below.size:
        r = below[0]
        raise ValueError(f"rank {r}: cap {int(hi[r])} is below its minimum size {int(lo[r])}")
    if lo.sum() > total:
        raise ValueError(
            f"infeasible split: the minimum sizes sum to {int(lo.sum())} > global batch {total}; "
            "lower min_size or raise the global batch"
        )
    if hi.sum() < total:
        raise ValueError(
            f"infeasible split: the caps sum to {int(hi.sum())} < global batch {total}; "
            "raise the caps, add workers or lower the global batch"
        )
    # A rank can never hold more than B minus the others' minimums.
    hi = np.minimum(hi, total - (lo.sum() - lo))
    return a, beta, lo, hi, total


def continuous_step_time_s(alphas, betas, global_batch_size, min_size=1, caps=None) -> float:
    """The continuous optimum's step time: a lower bound for every integer split."""
    _, sizes = continuous_split(alphas, betas, global_batch_size, min_size, caps)
    return predicted_step_time_s(alphas, betas, sizes)
