"""The per-rank cost model: busy time as a line in the local batch size.

    t_i(b) = α_i + β_i·b          α_i ≥ 0: fixed overhead per step (s)
                                  β_i > 0: cost per sample (s/sample)

Fitted from timings at several batch sizes: by the balancer from the steps run under
successive plans, by the profiler from probe timings. Both go through the same robust
steps, written here once and vectorised over *segments* (one segment per rank, or one for
a single fit):

1. group the timings by batch size; per group take the median and a robust spread
   ``σ_g = IQR_g / 1.349`` (the IQR of a normal distribution is 1.349 σ);
2. reject outliers: keep ``t`` with ``max(med/3, med − 5σ_g) ≤ t ≤ min(3·med, med + 5σ_g)``
   (the band is never narrower than ±10 % of the median, so quiet data keeps its points);
   the group's value ``m_g`` is the **mean** of what is kept (:data:`MIN_POINTS_FOR_MEAN`
   or more; the median of fewer);
3. weighted least squares over the groups, weights ``w_g = 1/Var(m_g)`` with
   ``Var(m_g) ≈ (π/2)·σ_g²/n_g`` (a sample median's variance: at least a kept mean's);
4. trust the slope only when it is positive and well determined,
   ``SE(β) = 1/sqrt(Σ w_g (b_g − b̄)²) ≤ max_slope_rel_se·β`` (default 30 %: batch sizes
   close together under noise cannot resolve a slope); a line that would have
   ``α < 0`` is refitted through the origin (the least-squares optimum under ``α ≥ 0``).

With one batch size (or an untrusted slope) the line is not identifiable: the fit falls
back to throughput-proportional, ``α = 0, β = Σ w b t / Σ w b²`` (= ``m/b`` for one size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

OUTLIER_SIGMAS = 5.0  # reject beyond m ± 5σ: ~1 in 10⁶ for Gaussian noise
OUTLIER_RATIO = 3.0  # ... and beyond ×3 or ÷3 of the median, whatever the spread
MIN_REL_BAND = 0.10  # never reject within ±10 % of the median (very quiet data)
NOISE_FLOOR_REL = 0.005  # spread floor: timer jitter; keeps weights finite on exact data
# Trust a slope known to ±30 % (1 SE): anchored at the latest level, its extrapolation
# error δβ·Δb is still smaller than the proportional fallback's (α/b)·Δb unless α ≈ 0.
DEFAULT_MAX_SLOPE_REL_SE = 0.30
_IQR_TO_SIGMA = 1.349
MEDIAN_VAR_FACTOR = math.pi / 2  # Var(median) ≈ (π/2)·σ²/n for normal noise
# A group's value is the mean of its kept timings, not their median: throughput follows the
# mean. Under a CPU quota a device's step is bimodal (it fits in the period's quota, or
# stalls into the next period: 34 against 66–87 ms on the cgroup testbed), and a median
# lands in whichever mode holds the majority, so a plan that stalls on 4 steps in 9
# looked as fast as one that never does. Spikes are still rejected by the band first:
# an isolated spike inflates no quartile, so it falls outside; a recurring slow mode (from
# about a quarter of the timings on) widens the quartiles and is kept. With fewer timings
# than this the quartiles are the extremes and nothing is rejected: the median is used.
MIN_POINTS_FOR_MEAN = 5


@dataclass(frozen=True)
class LinearFit:
    """``t(b) = alpha_s + beta_s_per_sample·b``.

    Attributes:
        alpha_s: fixed cost per step, ≥ 0.
        beta_s_per_sample: cost per sample, > 0.
        r2: weighted coefficient of determination over the batch-size groups; NaN when
            fewer than two batch sizes were seen (nothing to explain).
        num_points: timings used (after dropping invalid values and outliers).
        num_batch_sizes: distinct batch sizes among them.
        slope_trusted: True when α and β come from a line through several batch sizes;
            False for the throughput-proportional fallback (α = 0).
    """

    alpha_s: float
    beta_s_per_sample: float
    r2: float
    num_points: int
    num_batch_sizes: int = 1
    slope_trusted: bool = False

    def predict_s(self, batch_size: float) -> float:
        """Predicted busy time for ``batch_size`` samples."""
        return self.alpha_s + self.beta_s_per_sample * batch_size

    def samples_per_s(self, batch_size: float) -> float:
        """Throughput at ``batch_size``: ``b / t(b)``."""
        return batch_size / self.predict_s(batch_size)


@dataclass(frozen=True)
class GroupStats:
    """Robust statistics per (segment, batch size) group; every field is an array over groups.

    Groups are ordered by segment, then batch size.
    """

    segment: np.ndarray  # int: the segment (rank) the group belongs to
    batch_size: np.ndarray  # int
    mean_s: np.ndarray  # mean of the kept timings (their median below MIN_POINTS_FOR_MEAN)
    sigma_s: np.ndarray  # robust spread of the kept timings, floored at NOISE_FLOOR_REL·mean
    num_kept: np.ndarray  # int
    num_rejected: np.ndarray  # int
    last_key: np.ndarray  # int: largest order key in the group (e.g. the latest global step)

    @property
    def mean_var_s2(self) -> np.ndarray:
        """``Var(m_g) ≈ (π/2)·σ_g²/n_g``."""
        return MEDIAN_VAR_FACTOR * self.sigma_s**2 / np.maximum(self.num_kept, 1)

    def select(self, mask: np.ndarray) -> "GroupStats":
        return GroupStats(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))


def group_stats(
    segments: np.ndarray,
    batch_sizes: np.ndarray,
    times_s: np.ndarray,
    keys: np.ndarray | None = None,
) -> GroupStats:
    """Kept mean, spread and outlier rejection per (segment, batch size); vectorised.

    Args:
        segments, batch_sizes, times_s: one entry per timing. Entries with a non-finite or
            non-positive time, or a batch size < 1, are ignored.
        keys: an integer per timing (e.g. its global step); the group reports its maximum.
    """
    seg = np.asarray(segments, dtype=np.int64).ravel()
    b = np.asarray(batch_sizes, dtype=np.int64).ravel()
    t = np.asarray(times_s, dtype=np.float64).ravel()
    k = np.zeros_like(seg) if keys is None else np.asarray(keys, dtype=np.int64).ravel()
    ok = np.isfinite(t) & (t > 0) & (b >= 1)
    order = np.lexsort((t[ok], b[ok], seg[ok]))  # by segment, then batch size, then time
    return _group_stats_sorted(seg[ok][order], b[ok][order], t[ok][order], k[ok][order])


def group_stats_rows(batch_sizes: np.ndarray, times_s: np.ndarray, keys: np.ndarray,
                     valid: np.ndarray) -> GroupStats:
    """:func:`group_stats` for timings held as ``(num_segments, window)`` arrays, row = segment.

    Sorting row by row is ~5× faster than one sort over all timings (1,024 × 32: 0.4 ms).
    """
    valid = valid & np.isfinite(times_s) & (times_s > 0) & (batch_sizes >= 1)
    big = np.iinfo(np.int16).max
    sizes = np.where(valid, batch_sizes, big)
    # Stable sort by size after a sort by time orders each row by (size, time); 16-bit
    # keys get numpy's radix sort.
    by_time = np.argsort(np.where(valid, times_s, np.inf), axis=1)
    sizes_by_time = np.take_along_axis(sizes, by_time, axis=1)
    if sizes_by_time.max(initial=0) <= big:
        sizes_by_time = sizes_by_time.astype(np.int16)
    order = np.take_along_axis(by_time, np.argsort(sizes_by_time, axis=1, kind="stable"), axis=1)
    rows = np.broadcast_to(np.arange(valid.shape[0])[:, None], valid.shape)
    keep = np.take_along_axis(valid, order, axis=1)
    return _group_stats_sorted(
        rows[keep],
        np.take_along_axis(batch_sizes, order, axis=1)[keep].astype(np.int64),
        np.take_along_axis(times_s, order, axis=1)[keep].astype(np.float64),
        np.take_along_axis(keys, order, axis=1)[keep].astype(np.int64),
    )


def _group_stats_sorted(seg: np.ndarray, b: np.ndarray, t: np.ndarray, k: np.ndarray) -> GroupStats:
    """The statistics for valid timings already ordered by (segment, batch size, time)."""
    if t.size == 0:
        e_i, e_f = np.zeros(0, np.int64), np.zeros(0, np.float64)
        return GroupStats(e_i, e_i, e_f, e_f, e_i, e_i, e_i)
    n = t.size
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = (seg[1:] != seg[:-1]) | (b[1:] != b[:-1])
    starts = np.flatnonzero(new_group)
    gid = np.cumsum(new_group) - 1
    count = np.diff(np.append(starts, n))

    median = _sorted_median(t, starts, count)
    sigma = np.maximum(_sorted_sigma(t, starts, count), NOISE_FLOOR_REL * median)
    # keep max(m/3, m − 5σ) ≤ t ≤ min(3m, m + 5σ), band at least ±10 % of m
    band = np.maximum(OUTLIER_SIGMAS * sigma, MIN_REL_BAND * median)
    low = np.maximum(median / OUTLIER_RATIO, median - band)
    high = np.minimum(median * OUTLIER_RATIO, median + band)
    num_low = np.bincount(gid, weights=t < low[gid], minlength=starts.size).astype(np.int64)
    num_high = np.bincount(gid, weights=t > high[gid], minlength=starts.size).astype(np.int64)
    kept = count - num_low - num_high
    # The kept timings of a group are contiguous in sorted order (an interval of values)
    # and never empty (the median lies inside the band), so their sum is a difference of
    # cumulative sums and their median an index look-up.
    kept_starts = starts + num_low
    cumulative = np.append(0.0, np.cumsum(t))
    kept_mean = (cumulative[kept_starts + kept] - cumulative[kept_starts]) / kept
    kept_mean = np.where(kept >= MIN_POINTS_FOR_MEAN, kept_mean, _sorted_median(t, kept_starts, kept))
    kept_sigma = np.maximum(_sorted_sigma(t, kept_starts, kept), NOISE_FLOOR_REL * kept_mean)
    return GroupStats(
        segment=seg[starts],
        batch_size=b[starts],
        mean_s=kept_mean,
        sigma_s=kept_sigma,
        num_kept=kept,
        num_rejected=num_low + num_high,
        last_key=np.maximum.reduceat(k, starts),
    )


def _sorted_median(t: np.ndarray, starts: np.ndarray, count: np.ndarray) -> np.ndarray:
    return 0.5 * (t[starts + (count - 1) // 2] + t[starts + count // 2])


def _sorted_sigma(t: np.ndarray, starts: np.ndarray, count: np.ndarray) -> np.ndarray:
    # σ ≈ IQR/1.349 from the order statistics at ⌊(n−1)/4⌋ and ⌈3(n−1)/4⌉
    q1 = t[starts + (count - 1) // 4]
    q3 = t[starts + (3 * (count - 1) + 3) // 4]
    return (q3 - q1) / _IQR_TO_SIGMA


@dataclass(frozen=True)
class SegmentFits:
    """Weighted least-squares lines per segment; arrays over ``num_segments``."""

    alpha_s: np.ndarray
    beta_s_per_sample: np.ndarray
    r2: np.ndarray  # NaN where fewer than two batch sizes
    num_points: np.ndarray  # int
    num_batch_sizes: np.ndarray  # int
    slope_trusted: np.ndarray  # bool


def fit_groups(
    groups: GroupStats,
    num_segments: int,
    max_slope_rel_se: float = DEFAULT_MAX_SLOPE_REL_SE,
) -> SegmentFits:
    """Fits ``t = α + β·b`` per segment over its groups (see the module docstring).

    Segments without groups get NaN α and β.
    """
    s, x, y = groups.segment, groups.batch_size.astype(np.float64), groups.mean_s
    w = 1.0 / groups.mean_var_s2  # w_g = 1/Var(m_g)

    def per_segment(values):
        return np.bincount(s, weights=values, minlength=num_segments)

    sum_w = per_segment(w)
    num_points = np.bincount(s, weights=groups.num_kept, minlength=num_segments).astype(np.int64)
    num_sizes = np.bincount(s, minlength=num_segments).astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_mean = per_segment(w * x) / sum_w  # b̄ = Σ w b / Σ w
        y_mean = per_segment(w * y) / sum_w
        dx, dy = x - x_mean[s], y - y_mean[s]
        sxx = per_segment(w * dx * dx)  # Σ w (b − b̄)²
        sxy = per_segment(w * dx * dy)
        syy = per_segment(w * dy * dy)
        beta = sxy / sxx  # β = Σ w (b − b̄)(t − t̄) / Σ w (b − b̄)²
        alpha = y_mean - beta * x_mean  # α = t̄ − β b̄
        slope_se = 1.0 / np.sqrt(sxx)  # SE(β) = 1/sqrt(Σ w (b − b̄)²)
        trusted = (num_sizes >= 2) & (sxx > 0) & (beta > 0) & (slope_se <= max_slope_rel_se * beta)
        # through the origin: β₀ = Σ w b t / Σ w b² (α = 0)
        beta_origin = per_segment(w * x * y) / per_segment(w * x * x)
        use_origin = ~trusted | (alpha < 0)
        alpha = np.where(use_origin, 0.0, alpha)
        beta = np.where(use_origin, beta_origin, beta)
        # r² = 1 − Σ w (t − α − βb)² / Σ w (t − t̄)²
        resid = y - alpha[s] - beta[s] * x
        r2 = 1.0 - per_segment(w * resid * resid) / syy
    r2 = np.where((num_sizes >= 2) & (syy > 0), r2, np.nan)
    empty = num_sizes == 0
    alpha[empty] = np.nan
    beta[empty] = np.nan
    return SegmentFits(alpha, beta, r2, num_points, num_sizes, trusted)


def fit_linear(
    batch_sizes: Sequence[float],
    times_s: Sequence[float],
    max_slope_rel_se: float = DEFAULT_MAX_SLOPE_REL_SE,
) -> LinearFit:
    """Robust fit of ``t(b) = α + β·b`` to timings at one or more batch sizes.

    Args:
        batch_sizes: the batch size of each timing (positive integers).
        times_s: the matching busy times; NaN, inf and values ≤ 0 are dropped, outliers
            per batch size rejected (a single 100× spike moves nothing).
        max_slope_rel_se: trust the slope only when its standard error is at most this
            fraction of it; otherwise fall back to throughput-proportional (α = 0).

    Returns:
        The fit; with a single batch size ``α = 0`` and ``β = m/b`` (``m`` the group's value) (``slope_trusted``
        False, ``r2`` NaN).

    Raises:
        ValueError: if the inputs differ in length or no valid timing is left.
    """
    b = np.asarray(batch_sizes, dtype=np.float64).ravel()
    t = np.asarray(times_s, dtype=np.float64).ravel()
    if b.size != t.size:
        raise ValueError(f"got {b.size} batch sizes but {t.size} times")
    if np.any(~np.isfinite(b) | (b != np.round(b))):
        raise ValueError("batch sizes must be whole numbers")
    groups = group_stats(np.zeros(b.size, np.int64), b.astype(np.int64), t)
    if groups.segment.size == 0:
        raise ValueError(
            "no valid timing to fit: every time was NaN, infinite or ≤ 0, or every batch size < 1"
        )
    fits = fit_groups(groups, 1, max_slope_rel_se)
    return LinearFit(
        alpha_s=float(fits.alpha_s[0]),
        beta_s_per_sample=float(fits.beta_s_per_sample[0]),
        r2=float(fits.r2[0]),
        num_points=int(fits.num_points[0]),
        num_batch_sizes=int(fits.num_batch_sizes[0]),
        slope_trusted=bool(fits.slope_trusted[0]),
    )


def kept_mean_s(times_s: Sequence[float]) -> float:
    """The mean of ``times_s`` after the outlier band of :func:`group_stats` (their median
    when fewer than :data:`MIN_POINTS_FOR_MEAN`); NaN when none is valid. What a plan's step
    time is judged by (see hetero_ray/planning/balancer.py)."""
    t = np.asarray(times_s, dtype=np.float64).ravel()
    groups = group_stats(np.zeros(t.size, np.int64), np.ones(t.size, np.int64), t)
    return float(groups.mean_s[0]) if groups.mean_s.size else math.nan
