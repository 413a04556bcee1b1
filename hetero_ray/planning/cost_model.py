"""The per-rank cost model: busy time as a curve in the local batch size, with a floor.

    t_i(b) = max(τ_i, α_i + β_i·b)     τ_i ≥ 0: the floor (s): a GPU's kernel-launch and
                                                 framework time, paid at any batch size
                                       α_i: the line's intercept (s; < 0 allowed above a floor)
                                       β_i ≥ 0: cost per sample (s/sample)

One family for a CPU rank's line and a big GPU's flat curve, fitted by the balancer from its
steps and by the profiler from its probes through the same robust steps, vectorised over
*segments* (one per rank, or one for a single fit): per batch size, outliers rejected and
the mean of what is kept (:func:`group_stats`); then the shape the data support, by weighted
least squares: "line", "floor+line", "flat", else "proportional" (:func:`fit_groups`).
How, and why: docs/profiling-and-planning.md#the-cost-model-a-curve-with-a-floor
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
# A floor (two more parameters: its level and the knee) replaces a plain line only when it
# explains the data clearly better: χ² lower by 9, a 3σ improvement. Without it, noise on a
# line would bend its low end into a floor and stop the balancer from shrinking that rank.
KNEE_MIN_CHI2_GAIN = 9.0
# ... and its line must rise 10 % above the floor by the largest size measured: a rise within
# the noise of a few timings per size is a flat curve (whose prediction is as good there).
KNEE_MIN_RISE = 0.10
# Flat, not proportional, once the fitted slope lies 3 SE below the proportional one: the
# time clearly does not grow with the batch (a big GPU's 8…64). Batch sizes close together
# under noise cannot tell the two apart, and then proportional stays (what a CPU rank is).
PROPORTIONAL_REJECT_SIGMAS = 3.0
# ... and only over sizes a doubling apart: a floor claims that a smaller batch is no faster,
# which two plans' neighbouring sizes (19 and 20) cannot show — a line with a large α (a
# CPU rank's fixed cost) looks flat there, and modelled flat it could never be shrunk.
FLAT_MIN_SIZE_RATIO = 2.0
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

# The shapes a fit can take (SegmentFits.shape codes; CurveFit.shape names).
PROPORTIONAL, LINE, FLOOR_LINE, FLAT = 0, 1, 2, 3
SHAPE_NAMES = ("proportional", "line", "floor+line", "flat")


def curve_busy_time_s(alpha_s, beta_s_per_sample, floor_s, batch_size):
    """``t(b) = max(τ, α + β·b)``, elementwise over arrays or on floats."""
    return np.maximum(floor_s, np.add(alpha_s, np.multiply(beta_s_per_sample, batch_size)))


@dataclass(frozen=True)
class CurveFit:
    """``t(b) = max(floor_s, alpha_s + beta_s_per_sample·b)``.

    Attributes:
        alpha_s: the line's intercept (≥ 0 unless a floor holds below the knee).
        beta_s_per_sample: cost per sample, ≥ 0.
        r2: weighted coefficient of determination over the batch-size groups; NaN when
            fewer than two batch sizes were seen (nothing to explain).
        num_points: timings used (after dropping invalid values and outliers).
        num_batch_sizes: distinct batch sizes among them.
        slope_trusted: True when β was measured (a line, or a floor and a line);
            False for flat and throughput-proportional fits.
        floor_s: τ, the least busy time at any batch size (0: none).
        shape: "proportional", "line", "floor+line" or "flat" (module docstring).
        batch_sizes: the sizes fitted on, ascending.
        measured_s: each size's kept mean busy time ``m_g``.
        rel_errors: ``|t(b_g) − m_g| / m_g`` per size.
    """

    alpha_s: float
    beta_s_per_sample: float
    r2: float
    num_points: int
    num_batch_sizes: int = 1
    slope_trusted: bool = False
    floor_s: float = 0.0
    shape: str = SHAPE_NAMES[PROPORTIONAL]
    batch_sizes: tuple[int, ...] = ()
    measured_s: tuple[float, ...] = ()
    rel_errors: tuple[float, ...] = ()

    @property
    def max_rel_error(self) -> float:
        """The largest relative error at a fitted size (NaN: none recorded)."""
        return max(self.rel_errors) if self.rel_errors else math.nan

    @property
    def knee_batch_size(self) -> float:
        """Where the line rises above the floor, ``(τ − α)/β`` (0: no floor; inf: flat)."""
        if self.floor_s <= 0:
            return 0.0
        if self.beta_s_per_sample <= 0:
            return math.inf
        return max(0.0, (self.floor_s - self.alpha_s) / self.beta_s_per_sample)

    def predict_s(self, batch_size: float) -> float:
        """Predicted busy time for ``batch_size`` samples."""
        return float(curve_busy_time_s(self.alpha_s, self.beta_s_per_sample, self.floor_s, batch_size))

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
    """Fitted curves per segment; arrays over ``num_segments`` (NaN: no groups)."""

    alpha_s: np.ndarray
    beta_s_per_sample: np.ndarray
    floor_s: np.ndarray
    r2: np.ndarray  # NaN where fewer than two batch sizes
    num_points: np.ndarray  # int
    num_batch_sizes: np.ndarray  # int
    slope_trusted: np.ndarray  # bool: β was measured (LINE or FLOOR_LINE)
    shape: np.ndarray  # int: PROPORTIONAL, LINE, FLOOR_LINE or FLAT (-1: no groups)
    max_rel_error: np.ndarray  # max over the segment's groups of |t(b_g) − m_g| / m_g

    @property
    def shape_known(self) -> np.ndarray:
        """The data fixed the curve's shape (anything but proportional)."""
        return self.shape > PROPORTIONAL


def fit_groups(
    groups: GroupStats,
    num_segments: int,
    max_slope_rel_se: float = DEFAULT_MAX_SLOPE_REL_SE,
) -> SegmentFits:
    """Fits ``t = max(τ, α + β·b)`` per segment over its groups (see the module docstring).

    Vectorised over segments; one pass per knee position (at most the number of distinct
    batch sizes of a segment).
    """
    fit = _SegmentFitter(groups, num_segments, max_slope_rel_se)
    with np.errstate(divide="ignore", invalid="ignore"):
        line = fit.line()
        knee = fit.best_knee()
        return fit.choose(line, knee)


class _SegmentFitter:
    """The weighted fits of :func:`fit_groups`, vectorised over segments: every array is over
    groups (ordered by segment, then size) or over segments."""

    def __init__(self, groups: GroupStats, num_segments: int, max_slope_rel_se: float):
        self.s, self.x, self.y = groups.segment, groups.batch_size.astype(np.float64), groups.mean_s
        self.w = 1.0 / groups.mean_var_s2  # w_g = 1/Var(m_g)
        self.n = n = num_segments
        self.max_slope_rel_se = max_slope_rel_se
        self.num_points = np.bincount(self.s, weights=groups.num_kept, minlength=n).astype(np.int64)
        self.num_sizes = np.bincount(self.s, minlength=n).astype(np.int64)
        self.starts = np.searchsorted(self.s, np.arange(n))
        self.pos = np.arange(self.s.size) - self.starts[self.s]  # a group's place among its segment's sizes
        self.x_max = np.where(self.num_sizes > 0, _segment_max(self.x, self.s, n), np.nan)
        self.x_min = np.where(self.num_sizes > 0, -_segment_max(-self.x, self.s, n), np.nan)

    def per_segment(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.s, weights=values, minlength=self.n)

    def wls(self, mask: np.ndarray, h: np.ndarray):
        """``y = c + β·h`` per segment over the groups in ``mask``: (c, β, SE(β), slope counts)."""
        s, w, y = self.s, self.w, self.y
        wm = np.where(mask, w, 0.0)
        h = np.where(mask, h, 0.0)
        sum_w = self.per_segment(wm)
        h_mean = self.per_segment(wm * h) / sum_w
        y_mean = self.per_segment(wm * y) / sum_w
        dh = h - h_mean[s]
        shh = self.per_segment(wm * dh * dh)  # Σ w (h − h̄)²
        beta = self.per_segment(wm * dh * (y - y_mean[s])) / shh
        slope_se = 1.0 / np.sqrt(shh)  # SE(β) = 1/sqrt(Σ w (h − h̄)²)
        counts = (shh > 0) & (beta > 0) & (slope_se <= self.max_slope_rel_se * beta)
        return y_mean - beta * h_mean, beta, slope_se, counts

    def chi2(self, alpha: np.ndarray, beta: np.ndarray, floor: np.ndarray) -> np.ndarray:
        s = self.s
        resid = self.y - curve_busy_time_s(alpha[s], beta[s], floor[s], self.x)
        return self.per_segment(self.w * resid * resid)  # χ² = Σ w (m − t(b))²

    def line(self) -> dict:
        """The line ``α + β·b`` (through the origin, ``β₀ = Σ w b t / Σ w b²``, where α < 0),
        with what choosing among the shapes needs."""
        x, y, w = self.x, self.y, self.w
        sum_w = self.per_segment(w)
        alpha_line, beta_line, se_line, counts = self.wls(np.ones(self.s.size, dtype=bool), x)
        beta_origin = self.per_segment(w * x * y) / self.per_segment(w * x * x)
        origin = alpha_line < 0
        alpha = np.where(origin, 0.0, alpha_line)
        beta = np.where(origin, beta_origin, beta_line)
        return dict(alpha=alpha, beta=beta, chi2=self.chi2(alpha, beta, np.zeros(self.n)), counts=counts,
                    beta_fitted=beta_line, se=se_line, beta_origin=beta_origin,
                    x_mean=self.per_segment(w * x) / sum_w, y_mean=self.per_segment(w * y) / sum_w)

    def best_knee(self) -> dict:
        """The floor-then-line curve of least χ² over every knee position, both kinds: a knee
        at a probed size, and one between two sizes (τ the mean of the sizes below)."""
        n, x, s = self.n, self.x, self.s
        best = dict(chi2=np.full(n, np.inf), alpha=np.full(n, np.nan), beta=np.full(n, np.nan),
                    floor=np.full(n, np.nan))

        def keep_better(ok, alpha, beta, floor):
            ok = ok & (alpha + beta * self.x_max >= (1 + KNEE_MIN_RISE) * floor)
            better = ok & ((c2 := self.chi2(alpha, beta, floor)) < best["chi2"])
            for key, value in (("chi2", c2), ("alpha", alpha), ("beta", beta), ("floor", floor)):
                best[key][better] = value[better]

        for j in range(1, max(int(self.num_sizes.max(initial=0)) - 2, 1)):
            # knee at the j-th size: t = τ + β·max(0, b − b_j), linear in (τ, β); sizes
            # 0 … j on the floor, two or more beyond it
            valid = self.num_sizes > j + 2
            knee = np.where(valid, x[np.minimum(self.starts + j, s.size - 1)], np.nan)
            tau, beta, _, counts = self.wls(valid[s], np.maximum(0.0, x - knee[s]))
            keep_better(valid & counts & (tau > 0), tau - beta * knee, beta, tau)
        for j in range(1, max(int(self.num_sizes.max(initial=0)) - 2, 1)):
            # knee between the j-th and (j+1)-th sizes: τ = mean of sizes ≤ b_j, line through the rest
            valid = self.num_sizes > j + 2
            left, right = valid[s] & (self.pos <= j), valid[s] & (self.pos > j)
            tau = self.per_segment(np.where(left, self.w * self.y, 0.0)) / self.per_segment(np.where(left, self.w, 0.0))
            alpha, beta, _, counts = self.wls(right, x)
            knee = (tau - alpha) / beta
            x_j = x[np.minimum(self.starts + j, s.size - 1)]
            x_next = x[np.minimum(self.starts + j + 1, s.size - 1)]
            keep_better(valid & counts & (tau > 0) & (knee >= x_j) & (knee <= x_next), alpha, beta, tau)
        return best

    def choose(self, line: dict, knee: dict) -> SegmentFits:
        """Floor-then-line where it beats the line by enough, else the line where its slope
        counts, else flat where the proportional slope lies well above the fitted one, else
        proportional; with each segment's r² and largest relative error."""
        s, x, y, w, n = self.s, self.x, self.y, self.w, self.n
        use_knee = knee["chi2"] < np.where(line["counts"], line["chi2"] - KNEE_MIN_CHI2_GAIN, np.inf)
        use_line = line["counts"] & ~use_knee
        trusted = use_line | use_knee
        # No slope that counts: flat where the proportional slope t̄/b̄ lies well above β̂.
        y_mean = line["y_mean"]
        flat = ~trusted & (self.num_sizes >= 2) & (self.x_max >= FLAT_MIN_SIZE_RATIO * self.x_min) & (
            y_mean / line["x_mean"] - line["beta_fitted"] > PROPORTIONAL_REJECT_SIGMAS * line["se"])
        shape = np.select([use_knee, use_line, flat], [FLOOR_LINE, LINE, FLAT], PROPORTIONAL)
        alpha = np.select([use_knee, use_line], [knee["alpha"], line["alpha"]], 0.0)
        # flat: τ = t̄ up to b_max, then no faster than the throughput measured there
        beta = np.select([use_knee, use_line, flat], [knee["beta"], line["beta"], y_mean / self.x_max],
                         line["beta_origin"])
        floor = np.select([use_knee, flat], [knee["floor"], y_mean], 0.0)

        resid = y - curve_busy_time_s(alpha[s], beta[s], floor[s], x)
        syy = self.per_segment(w * (y - y_mean[s]) ** 2)
        r2 = 1.0 - self.per_segment(w * resid * resid) / syy  # r² = 1 − χ²/Σ w (t − t̄)²
        r2 = np.where((self.num_sizes >= 2) & (syy > 0), r2, np.nan)
        max_rel_error = _segment_max(np.abs(resid) / y, s, n)
        empty = self.num_sizes == 0
        for values in (alpha, beta, floor, max_rel_error):
            values[empty] = np.nan
        shape = np.where(empty, -1, shape)
        return SegmentFits(alpha, beta, floor, r2, self.num_points, self.num_sizes, trusted & ~empty, shape,
                           max_rel_error)


def _segment_max(values: np.ndarray, segments: np.ndarray, num_segments: int) -> np.ndarray:
    out = np.full(num_segments, -np.inf)
    np.maximum.at(out, segments, values)
    return np.where(np.isfinite(out), out, np.nan)


def fit_curve(
    batch_sizes: Sequence[float],
    times_s: Sequence[float],
    max_slope_rel_se: float = DEFAULT_MAX_SLOPE_REL_SE,
) -> CurveFit:
    """Robust fit of ``t(b) = max(τ, α + β·b)`` to timings at one or more batch sizes.

    Args:
        batch_sizes: the batch size of each timing (positive integers).
        times_s: the matching busy times; NaN, inf and values ≤ 0 are dropped, outliers
            per batch size rejected (a single 100× spike moves nothing).
        max_slope_rel_se: a slope counts only when its standard error is at most this
            fraction of it.

    Returns:
        The fit with its relative error at every size; with a single batch size
        ``α = 0`` and ``β = m/b`` (shape "proportional", ``r2`` NaN).

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
    alpha, beta, floor = float(fits.alpha_s[0]), float(fits.beta_s_per_sample[0]), float(fits.floor_s[0])
    predicted = curve_busy_time_s(alpha, beta, floor, groups.batch_size.astype(np.float64))
    return CurveFit(
        alpha_s=alpha,
        beta_s_per_sample=beta,
        r2=float(fits.r2[0]),
        num_points=int(fits.num_points[0]),
        num_batch_sizes=int(fits.num_batch_sizes[0]),
        slope_trusted=bool(fits.slope_trusted[0]),
        floor_s=floor,
        shape=SHAPE_NAMES[int(fits.shape[0])],
        batch_sizes=tuple(int(v) for v in groups.batch_size),
        measured_s=tuple(float(v) for v in groups.mean_s),
        rel_errors=tuple(float(v) for v in np.abs(predicted - groups.mean_s) / groups.mean_s),
    )


def kept_mean_s(times_s: Sequence[float]) -> float:
    """The mean of ``times_s`` after the outlier band of :func:`group_stats` (their median
    when fewer than :data:`MIN_POINTS_FOR_MEAN`); NaN when none is valid. What a plan's step
    time is judged by (see hetero_ray/planning/balancer.py)."""
    t = np.asarray(times_s, dtype=np.float64).ravel()
    groups = group_stats(np.zeros(t.size, np.int64), np.ones(t.size, np.int64), t)
    return float(groups.mean_s[0]) if groups.mean_s.size else math.nan
