"""The split solver: the integer local batch sizes that minimise the step time.

    minimise   max_i t_i(b_i),   t_i(b) = max(τ_i, α_i + β_i·b)   (β_i ≥ 0, τ_i ≥ 0)
    subject to Σ_i b_i = B,   lo_i ≤ b_i ≤ hi_i,   b_i integer

The curve is :mod:`~hetero_ray.planning.cost_model`'s. :func:`continuous_split` solves the
relaxation exactly (water-filling on a common finishing time ``T``); :func:`solve_split`
finds the integer optimum by bisection on the level ``L`` at which the samples finishing by
``L`` first cover ``B``, ties handed out round-robin, so identical ranks get identical
shares. Shares proportional to throughput are the case ``α_i = τ_i = 0``
(:func:`proportional_split`). Why it is exact: docs/profiling-and-planning.md#the-split-solver
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from hetero_ray.planning.cost_model import curve_busy_time_s

_MAX_BISECTIONS = 200  # float64 halves a bracket at most ~1100 times; 200 is ample in practice

SizeBound = Union[int, Sequence[int]]


def predicted_step_time_s(alphas, betas, sizes, floors=None) -> float:
    """``max_i t_i(b_i)``: the step time the cost model predicts for a split (a rank with
    ``b_i = 0`` trains on nothing and adds no busy time)."""
    a = np.asarray(alphas, dtype=np.float64)
    b = np.asarray(betas, dtype=np.float64)
    s = np.asarray(sizes, dtype=np.float64)
    f = np.zeros_like(a) if floors is None else np.asarray(floors, dtype=np.float64)
    if not (a.shape == b.shape == s.shape == f.shape) or a.size == 0:
        raise ValueError(f"need one α, β, floor and size per rank, got {a.size}, {b.size}, {f.size}, {s.size}")
    return float(np.max(np.where(s > 0, curve_busy_time_s(a, b, f, s), 0.0)))


def solve_split(
    alphas: Sequence[float],
    betas: Sequence[float],
    global_batch_size: int,
    min_size: SizeBound = 1,
    caps: Optional[Sequence[Optional[int]]] = None,
    floors: Optional[Sequence[float]] = None,
) -> list[int]:
    """Integer local batch sizes minimising ``max_i max(τ_i, α_i + β_i·b_i)`` with ``Σ b_i = B``.

    Args:
        alphas: per-rank intercept α_i (s), finite.
        betas: per-rank cost per sample β_i (s/sample), finite and ≥ 0 (0: flat).
        global_batch_size: B.
        min_size: lower bound, one for all ranks or one per rank (≥ 1; a rank pinned to
            its current size has ``min_size[i] == caps[i]``).
        caps: per-rank upper bound (memory), ``None`` entries for no cap.
        floors: per-rank floor τ_i (s), finite and ≥ 0; None: no floors (lines).

    Returns:
        ``b_i`` per rank: sum exactly B, within bounds, max finishing time minimal.

    Raises:
        ValueError: bad α/β/τ, or bounds that make ``Σ b_i = B`` impossible.
    """
    a, beta, tau, lo, hi, total = _validated(alphas, betas, global_batch_size, min_size, caps, floors)
    if lo.sum() == total:
        return lo.astype(np.int64).tolist()
    flat = beta == 0
    safe_beta = np.where(flat, 1.0, beta)

    def sizes_at(level: float) -> np.ndarray:
        # b_i(L) = clamp(⌊(L − α_i)/β_i⌋, lo_i, hi_i) once L ≥ τ_i; a flat rank: all or nothing
        with np.errstate(over="ignore"):
            units = np.where(flat, np.where(level >= a, np.inf, -np.inf), np.floor((level - a) / safe_beta))
        return np.clip(np.where(level >= tau, units, -np.inf), lo, hi)

    # Bracket: at L_lo every rank is at lo (sum < B), at L_hi every rank is at hi (sum ≥ B).
    # (just below the earliest finish: units finishing exactly there are ties, not "below")
    level_lo = float(np.nextafter(np.min(curve_busy_time_s(a, beta, tau, lo)), -np.inf))
    level_hi = float(np.max(curve_busy_time_s(a, beta, tau, hi)))
    for _ in range(_MAX_BISECTIONS):
        mid = 0.5 * (level_lo + level_hi)
        if not level_lo < mid < level_hi:
            break
        candidate = sizes_at(mid)
        got = candidate.sum()
        if got == total:
            return candidate.astype(np.int64).tolist()
        if got < total:
            level_lo = mid
        else:
            level_hi = mid
    # The remaining units all finish within (L_lo, L_hi], a float's width: round-robin.
    below, at = sizes_at(level_lo), sizes_at(level_hi)
    step = 4 * np.finfo(np.float64).eps * max(abs(level_hi), 1e-300)
    while at.sum() < total:  # ⌊(L − α)/β⌋ rounded a unit finishing at L down: widen by ulps
        level_hi += step
        step *= 2
        at = sizes_at(level_hi)
    return _round_robin(below, at - below, int(total - below.sum()), a, beta, tau).astype(np.int64).tolist()


def _round_robin(sizes: np.ndarray, tied: np.ndarray, missing: int, a, beta, tau) -> np.ndarray:
    """Hands ``missing`` of the ``tied[i]`` units of each rank out one per rank per round:
    ``k − 1`` full rounds, then the last round to the first ranks in (finishing time of
    their k-th unit, rank) order."""
    if missing <= 0:
        return sizes
    if tied.sum() < missing:  # unreachable: Σ b_i(L_hi) ≥ B
        raise RuntimeError("split solver: no rank can take the remaining samples")
    low, high = 1, int(tied.max())  # the smallest k with Σ min(c_i, k) ≥ missing
    while low < high:
        mid = (low + high) // 2
        if np.minimum(tied, mid).sum() >= missing:
            high = mid
        else:
            low = mid + 1
    k = low
    out = sizes + np.minimum(tied, k - 1)
    left = missing - int(np.minimum(tied, k - 1).sum())
    takers = np.flatnonzero(tied >= k)
    finish = curve_busy_time_s(a[takers], beta[takers], tau[takers], out[takers] + 1)
    # on a common floor the rank whose line is lower (the faster one) goes first
    line = a[takers] + beta[takers] * (out[takers] + 1)
    chosen = takers[np.lexsort((takers, line, finish))[:left]]
    out[chosen] += 1
    return out


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
    floors: Optional[Sequence[float]] = None,
) -> tuple[float, np.ndarray]:
    """The relaxed (real-valued) optimum: the common finishing time ``T`` and ``b_i(T)``.

    ``S(T) = Σ b_i(T)`` is non-decreasing: rank i leaves ``lo_i`` at
    ``s_i = max(τ_i, α_i + β_i·lo_i)``, where it jumps to ``clamp((s_i − α_i)/β_i, lo_i, hi_i)``
    (its floor's free samples; all of ``hi_i`` when flat) and grows with slope ``1/β_i``
    until ``α_i + β_i·hi_i``. Sorting these breakpoints gives ``S`` on either side of each
    by a cumulative sum, and ``T`` by linear interpolation where ``S`` crosses B; where B
    falls inside a jump, ``T`` is that breakpoint and the jumping ranks take the part of
    their jump that makes ``Σ b_i = B``.
    """
    a, beta, tau, lo, hi, total = _validated(alphas, betas, global_batch_size, min_size, caps, floors)
    flat = beta == 0
    safe_beta = np.where(flat, 1.0, beta)
    start = np.maximum(tau, a + beta * lo)
    jump_to = np.where(flat, hi, np.clip((start - a) / safe_beta, lo, hi))
    grows = ~flat & (jump_to < hi)
    points = np.concatenate([start, (a + beta * hi)[grows]])
    jumps = np.concatenate([jump_to - lo, np.zeros(int(grows.sum()))])
    slope_steps = np.concatenate([np.where(grows, 1.0 / safe_beta, 0.0), -1.0 / safe_beta[grows]])
    order = np.argsort(points, kind="stable")
    points, jumps, slope_steps = points[order], jumps[order], slope_steps[order]
    slope_after = np.cumsum(slope_steps)  # dS/dT just after each breakpoint
    # S just before and just after each breakpoint
    after = np.empty(points.size)
    before = np.empty(points.size)
    s = lo.sum()
    for k in range(points.size):
        if k:
            s += slope_after[k - 1] * (points[k] - points[k - 1])
        before[k] = s
        s += jumps[k]
        after[k] = s

    def sizes_at(level: float) -> np.ndarray:
        return np.where(level >= start, np.where(flat, hi, np.clip((level - a) / safe_beta, lo, hi)), lo)

    k = int(np.searchsorted(after, total - 1e-9 * max(total, 1), side="left"))
    k = min(k, points.size - 1)
    if before[k] >= total and k > 0:  # crossed on the slope before breakpoint k
        level = float(points[k - 1] + (total - after[k - 1]) / slope_after[k - 1])
        return level, sizes_at(level)
    level = float(points[k])
    lower = np.where(start < level, sizes_at(level), lo)  # the ranks that jump at T stay at lo
    upper = sizes_at(level)
    gap = upper.sum() - lower.sum()
    frac = 0.0 if gap <= 0 else min(1.0, max(0.0, (total - lower.sum()) / gap))
    return level, lower + frac * (upper - lower)


def _validated(alphas, betas, global_batch_size, min_size, caps, floors=None):
    a = np.asarray(alphas, dtype=np.float64).ravel()
    beta = np.asarray(betas, dtype=np.float64).ravel()
    n = a.size
    if n == 0:
        raise ValueError("no ranks to split over")
    if beta.size != n:
        raise ValueError(f"got {n} alphas but {beta.size} betas; give one of each per rank")
    tau = np.zeros(n) if floors is None else np.asarray(floors, dtype=np.float64).ravel()
    if tau.size != n:
        raise ValueError(f"got {n} alphas but {tau.size} floors; give one of each per rank")
    if isinstance(global_batch_size, bool) or int(global_batch_size) != global_batch_size or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a positive integer, got {global_batch_size!r}")
    total = int(global_batch_size)
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise ValueError(f"alphas must be finite; rank {bad[0]} has {a[bad[0]]}")
    bad = np.flatnonzero(~(np.isfinite(beta) & (beta >= 0)))
    if bad.size:
        raise ValueError(f"betas must be finite and ≥ 0; rank {bad[0]} has {beta[bad[0]]}")
    bad = np.flatnonzero(~(np.isfinite(tau) & (tau >= 0)))
    if bad.size:
        raise ValueError(f"floors must be finite and ≥ 0; rank {bad[0]} has {tau[bad[0]]}")
    bad = np.flatnonzero(~(curve_busy_time_s(a, beta, tau, 1.0) > 0))
    if bad.size:
        raise ValueError(f"rank {bad[0]}'s busy time at one sample is not positive "
                         f"(α={a[bad[0]]}, β={beta[bad[0]]}, floor={tau[bad[0]]}); a cost curve must be > 0")
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
    return a, beta, tau, lo, hi, total


def continuous_step_time_s(alphas, betas, global_batch_size, min_size=1, caps=None, floors=None) -> float:
    """The continuous optimum's step time: a lower bound for every integer split."""
    _, sizes = continuous_split(alphas, betas, global_batch_size, min_size, caps, floors)
    return predicted_step_time_s(alphas, betas, sizes, floors)
