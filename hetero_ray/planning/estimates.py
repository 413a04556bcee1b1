"""Per-rank estimates of the cost model from the step records of a running job.

:class:`ClusterEstimates` keeps each rank's last ``window_steps`` valid records and turns
them into an :class:`Estimates` snapshot on demand: the *shape* of ``t(b) = max(τ, α + β·b)``
is the last fit that fixed one (:func:`cost_model.fit_groups`), else the rank's seeded one
(:meth:`ClusterEstimates.seed_shapes`), else proportional; the *level* is the kept mean
``m_L`` at the most recent batch size ``b_L``: ``s = m_L / t_shape(b_L)`` scales τ, α and β.
Each step's shared slowdown is divided out first, and a rank's records from before a speed
change are forgotten (:meth:`ClusterEstimates._times_without_shared_noise`,
:meth:`ClusterEstimates._forget_before_speed_changes`). Runs inside the planner actor;
plain Python, no Ray. Why: docs/profiling-and-planning.md#per-rank-estimates
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

from hetero_ray.planning.cost_model import (
    MEDIAN_VAR_FACTOR,
    DEFAULT_MAX_SLOPE_REL_SE,
    NOISE_FLOOR_REL,
    curve_busy_time_s,
    fit_groups,
    group_stats_rows,
)

DEFAULT_WINDOW_STEPS = 32  # per rank: 1.5 rebalance intervals of 20 steps; enough for a level and a slope
DEFAULT_MIN_POINTS_PER_SIZE = 3  # a median of 3 already ignores one spike
DEFAULT_CHANGE_DETECT_STEPS = 8  # a speed change is seen after ~5 steps, not ~W/2
CHANGE_MIN_REL = 0.10  # smaller speed changes wait for the window's level to move
CHANGE_SIGMAS = 6.0  # noise alone: ~1 false alarm in 10⁵ checks (σ itself is estimated)
MAX_OLD_SIDE_AFTER_CHANGE = 1  # a spike among a changed speed's records; two: no change
# A step's shared factor needs this many of its ranks: with two, a shared slowdown cannot
# be told from one rank's own; from three on, one rank's own moves the median little.
MIN_RANKS_FOR_SHARED_FACTOR = 3
# The most a step's shared factor may be (or the least, inverted) to count as the machine's.
# A machine's slow phase slows every rank by tens of percent; a median that moves further
# at one step is most ranks changing speed at once (two of three ranks left out made fast),
# and divided out it would make the ranks that did not change look that much slower.
MAX_SHARED_FACTOR = 2.0
_MAX_PENDING_PER_RANK = 4  # × window: fold pending records in before the list grows further


@dataclass(frozen=True, slots=True)
class RankEstimate:
    """One rank's current estimate (a row of :class:`Estimates`).

    Attributes:
        rank: the rank.
        alpha_s, beta_s_per_sample: ``t(b) = max(τ, α + β·b)``; NaN when the rank has no estimate.
        samples_per_s: measured throughput at ``local_batch_size``, ``b_L / m_L``.
        num_points: timings behind the estimate (kept, in the window).
        last_step: the latest ``global_step`` seen for the rank (-1: never).
        fresh: the estimate may be acted on (it exists and is recent).
        local_batch_size: ``b_L``, the most recent batch size with enough timings.
        busy_time_s: ``m_L``, the kept mean busy time at ``b_L`` (shared slowdowns divided out).
        busy_time_rel_se: standard error of ``m_L`` relative to it.
        num_batch_sizes: distinct batch sizes in the window with enough timings.
        num_rejected: outliers rejected in the window.
        slope_fitted: True when the curve's shape comes from a multi-size fit, False
            while the rank is modelled as throughput-proportional (α = τ = 0).
        floor_s: τ, the floor of the curve (0: none).
        fit_max_rel_error: the window's fit, its largest ``|t(b) − m_b| / m_b`` over the
            batch sizes in the window (NaN: no estimate).
    """

    rank: int
    alpha_s: float
    beta_s_per_sample: float
    samples_per_s: float
    num_points: int
    last_step: int
    fresh: bool
    local_batch_size: int = 0
    busy_time_s: float = math.nan
    busy_time_rel_se: float = math.nan
    num_batch_sizes: int = 0
    num_rejected: int = 0
    slope_fitted: bool = False
    floor_s: float = 0.0
    fit_max_rel_error: float = math.nan

    def predict_busy_time_s(self, local_batch_size: float) -> float:
        return float(curve_busy_time_s(self.alpha_s, self.beta_s_per_sample, self.floor_s, local_batch_size))


@dataclass(frozen=True)
class Estimates:
    """Estimates for every rank, as arrays indexed by rank (same fields as :class:`RankEstimate`).

    ``estimates[r]`` is rank ``r``'s :class:`RankEstimate`; iterating yields all of them.
    """

    rank: np.ndarray
    alpha_s: np.ndarray
    beta_s_per_sample: np.ndarray
    samples_per_s: np.ndarray
    num_points: np.ndarray
    last_step: np.ndarray
    fresh: np.ndarray
    local_batch_size: np.ndarray
    busy_time_s: np.ndarray
    busy_time_rel_se: np.ndarray
    num_batch_sizes: np.ndarray
    num_rejected: np.ndarray
    slope_fitted: np.ndarray
    floor_s: np.ndarray
    fit_max_rel_error: np.ndarray
    global_step: int = -1  # the reference step freshness was judged against

    def __post_init__(self):
        for f in fields(RankEstimate):
            getattr(self, f.name).setflags(write=False)

    def __len__(self) -> int:
        return int(self.rank.size)

    @property
    def num_workers(self) -> int:
        return len(self)

    def __getitem__(self, rank: int) -> RankEstimate:
        return RankEstimate(**{f.name: getattr(self, f.name)[rank].item() for f in fields(RankEstimate)})

    def __iter__(self):
        return (self[r] for r in range(len(self)))

    @classmethod
    def from_rank_estimates(cls, rows: Sequence[RankEstimate], global_step: int = -1) -> "Estimates":
        """Builds the arrays from per-rank rows (sorted by rank, one per rank 0..n-1)."""
        rows = sorted(rows, key=lambda e: e.rank)
        if [e.rank for e in rows] != list(range(len(rows))):
            raise ValueError(f"need one estimate per rank 0..{len(rows) - 1}, got ranks {[e.rank for e in rows]}")
        arrays = {f.name: np.array([getattr(e, f.name) for e in rows]) for f in fields(RankEstimate)}
        arrays["fresh"] = arrays["fresh"].astype(bool)
        arrays["slope_fitted"] = arrays["slope_fitted"].astype(bool)
        return cls(**arrays, global_step=global_step)

    def to_columns(self) -> dict[str, list]:
        """Plain lists per field, for a record or a JSON reply."""
        return {f.name: getattr(self, f.name).tolist() for f in fields(RankEstimate)}


class ClusterEstimates:
    """Sliding-window estimates for ``num_workers`` ranks, fed with step records.

    Args:
        num_workers: ranks ``0 … num_workers−1``; records of other ranks are ignored (late
            records of a previous, larger worker group).
        window_steps: records kept per rank.
        min_points_per_size: kept timings a batch size needs before it counts.
        stale_after_steps: a rank whose last record is more than this many steps behind
            the reference step is stale; default: ``window_steps``.
        max_slope_rel_se: see :func:`cost_model.fit_curve`.
        remove_shared_noise: divide each step's shared slowdown out of its times (see
            :meth:`_times_without_shared_noise`).
    """

    def __init__(
        self,
        num_workers: int,
        window_steps: int = DEFAULT_WINDOW_STEPS,
        min_points_per_size: int = DEFAULT_MIN_POINTS_PER_SIZE,
        stale_after_steps: Optional[int] = None,
        max_slope_rel_se: float = DEFAULT_MAX_SLOPE_REL_SE,
        change_detect_steps: int = DEFAULT_CHANGE_DETECT_STEPS,
        remove_shared_noise: bool = True,
    ):
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}")
        if not isinstance(window_steps, int) or window_steps < 1:
            raise ValueError(f"window_steps must be a positive integer, got {window_steps!r}")
        if not isinstance(min_points_per_size, int) or not 1 <= min_points_per_size <= window_steps:
            raise ValueError(
                f"min_points_per_size must be an integer in [1, window_steps={window_steps}], "
                f"got {min_points_per_size!r}"
            )
        stale = window_steps if stale_after_steps is None else stale_after_steps
        if not isinstance(stale, int) or stale < 0:
            raise ValueError(f"stale_after_steps must be a non-negative integer, got {stale_after_steps!r}")
        if not isinstance(change_detect_steps, int) or not 0 <= change_detect_steps <= window_steps:
            raise ValueError(
                f"change_detect_steps must be an integer in [0, window_steps={window_steps}] (0: off), "
                f"got {change_detect_steps!r}"
            )
        if not max_slope_rel_se > 0:
            raise ValueError(f"max_slope_rel_se must be > 0, got {max_slope_rel_se!r}")
        self.num_workers = num_workers
        self.window_steps = window_steps
        self.min_points_per_size = min_points_per_size
        self.stale_after_steps = stale
        self.max_slope_rel_se = float(max_slope_rel_se)
        self.change_detect_steps = change_detect_steps
        self.remove_shared_noise = bool(remove_shared_noise)
        n, w = num_workers, window_steps
        self._sizes = np.zeros((n, w), np.int64)
        self._times_s = np.full((n, w), np.nan)
        self._steps = np.full((n, w), -1, np.int64)
        self._valid = np.zeros((n, w), bool)
        self._write_pos = np.zeros(n, np.int64)
        # Shape of the last fit that fixed one, per rank; NaN β: none yet (throughput-proportional).
        self._shape_alpha_s = np.zeros(n)
        self._shape_beta = np.full(n, np.nan)
        self._shape_floor_s = np.zeros(n)
        self._pending: tuple[list, list, list, list] = ([], [], [], [])  # rank, size, time, step
        self.num_records = 0  # accepted into a window
        self.num_dropped = 0  # invalid busy time or batch size
        self.num_ignored = 0  # rank outside 0 … num_workers−1
        self.num_speed_changes = 0  # detected, see _forget_before_speed_changes

    def seed_shapes(self, shapes: Sequence[Optional[tuple[float, float, float]]]) -> None:
        """Each rank's curve shape ``(α, β, τ)`` until its own records fix one (a rank whose
        shape is already fixed keeps it; None, or a curve that is not one, seeds nothing)."""
        if len(shapes) != self.num_workers:
            raise ValueError(f"need one shape per rank: got {len(shapes)} for {self.num_workers} ranks")
        for rank, shape in enumerate(shapes):
            if shape is None or math.isfinite(self._shape_beta[rank]):
                continue
            alpha, beta, floor = (float(x) for x in shape)
            if not (all(math.isfinite(x) for x in shape) and beta >= 0 and floor >= 0
                    and max(floor, alpha + beta) > 0):
                continue
            self._shape_alpha_s[rank], self._shape_beta[rank], self._shape_floor_s[rank] = alpha, beta, floor

    # ------------------------------------------------------------------ feeding
    def add(self, records: Iterable[Mapping]) -> None:
        """Queues step records (dicts with ``rank``, ``global_step``, ``local_batch_size``
        — or ``probe_batch_size`` where that is 0 —, ``busy_time_s``; other keys are
        ignored). O(1) per record.

        A record with a missing, NaN, infinite or non-positive value is dropped (counted
        in ``num_dropped``), never raised on: one bad worker must not stop the balancer.
        """
        ranks, sizes, times_s, steps = self._pending
        for r in records:
            ranks.append(r.get("rank"))
            # A rank left out times a probe of its own (no all-reduce, weight 0): its curve stays known.
            sizes.append(r.get("local_batch_size") or r.get("probe_batch_size"))
            times_s.append(r.get("busy_time_s"))
            steps.append(r.get("global_step"))
        self._fold_if_long()

    def add_arrays(self, ranks, local_batch_sizes, busy_times_s, global_steps) -> None:
        """Like :meth:`add`, from parallel sequences (one entry per record)."""
        lengths = {len(ranks), len(local_batch_sizes), len(busy_times_s), len(global_steps)}
        if len(lengths) != 1:
            raise ValueError(f"add_arrays needs sequences of one length, got lengths {sorted(lengths)}")
        for pending, values in zip(self._pending, (ranks, local_batch_sizes, busy_times_s, global_steps)):
            pending.extend(values.tolist() if isinstance(values, np.ndarray) else values)
        self._fold_if_long()

    def _fold_if_long(self) -> None:
        if len(self._pending[0]) > _MAX_PENDING_PER_RANK * self.window_steps * self.num_workers:
            self._fold_pending()

    def _fold_pending(self) -> None:
        if not self._pending[0]:
            return
        columns, self._pending = self._pending, ([], [], [], [])
        rank, size, time_s, step = (_as_float_array(c) for c in columns)
        # A rank, size or step that is not a number makes the record unusable (dropped);
        # a rank outside the group is a late record of another worker group (ignored).
        numbers = np.isfinite(rank) & np.isfinite(size) & np.isfinite(step)
        rank, size, step = (np.where(numbers, c, 0).astype(np.int64) for c in (rank, size, step))
        in_range = ~numbers | ((rank >= 0) & (rank < self.num_workers))
        valid = numbers & in_range & (size >= 1) & np.isfinite(time_s) & (time_s > 0) & (step >= 0)
        self.num_ignored += int(np.count_nonzero(~in_range))
        self.num_dropped += int(np.count_nonzero(in_range & ~valid))
        rank, size, time_s, step = rank[valid], size[valid], time_s[valid], step[valid]
        if rank.size == 0:
            return
        self.num_records += int(rank.size)
        # k-th record of its rank (arrival order) goes to slot (write_pos + k) mod W; only the
        # last W of a rank survive, so their slots are distinct.
        order = np.argsort(rank, kind="stable")
        rank, size, time_s, step = rank[order], size[order], time_s[order], step[order]
        first = np.searchsorted(rank, rank, side="left")
        k = np.arange(rank.size) - first
        count = np.bincount(rank, minlength=self.num_workers)
        keep = k >= count[rank] - self.window_steps
        rank, size, time_s, step, k = rank[keep], size[keep], time_s[keep], step[keep], k[keep]
        slot = (self._write_pos[rank] + k) % self.window_steps
        self._sizes[rank, slot] = size
        self._times_s[rank, slot] = time_s
        self._steps[rank, slot] = step
        self._valid[rank, slot] = True
        self._write_pos = (self._write_pos + count) % self.window_steps

    # ------------------------------------------------------------------ reading
    def estimates(self, global_step: Optional[int] = None) -> Estimates:
        """The current estimate of every rank.

        Args:
            global_step: the reference step for freshness (the step the decision is made
                at); default: the latest step seen from any rank.
        """
        self._fold_pending()
        n = self.num_workers
        last_step = np.where(self._valid, self._steps, -1).max(axis=1)
        ref_step = int(last_step.max()) if global_step is None else int(global_step)

        times_s = self._times_without_shared_noise()
        window = self._window_stats(times_s)
        if self.change_detect_steps and self._forget_before_speed_changes(window, times_s):
            times_s = self._times_without_shared_noise()
            window = self._window_stats(times_s)
        groups, num_rejected, local_batch_size, busy_time_s, sigma_s, count = window
        with np.errstate(invalid="ignore", divide="ignore"):
            # relative SE of m_L, taken as a median's: sqrt(π/2)·σ/(m·sqrt(n))
            rel_se = np.sqrt(MEDIAN_VAR_FACTOR / count) * sigma_s / busy_time_s

        fits = fit_groups(groups, n, self.max_slope_rel_se)
        known = fits.shape_known
        self._shape_alpha_s[known] = fits.alpha_s[known]
        self._shape_beta[known] = fits.beta_s_per_sample[known]
        self._shape_floor_s[known] = fits.floor_s[known]

        has = local_batch_size > 0
        b_l = np.where(has, local_batch_size, 1).astype(np.float64)
        shape_known = np.isfinite(self._shape_beta)
        with np.errstate(invalid="ignore", divide="ignore"):
            # level from the freshest group: s = m_L / t_shape(b_L)
            scale = busy_time_s / curve_busy_time_s(self._shape_alpha_s, self._shape_beta, self._shape_floor_s, b_l)
            alpha_s = np.where(shape_known, scale * self._shape_alpha_s, 0.0)
            beta = np.where(shape_known, scale * self._shape_beta, busy_time_s / b_l)
            floor_s = np.where(shape_known, scale * self._shape_floor_s, 0.0)
            samples_per_s = b_l / busy_time_s  # b_L / m_L
        alpha_s = np.where(has, alpha_s, np.nan)
        beta = np.where(has, beta, np.nan)
        floor_s = np.where(has, floor_s, np.nan)
        samples_per_s = np.where(has, samples_per_s, np.nan)
        fresh = has & (last_step >= ref_step - self.stale_after_steps)
        return Estimates(
            rank=np.arange(n),
            alpha_s=alpha_s,
            beta_s_per_sample=beta,
            samples_per_s=samples_per_s,
            num_points=np.where(has, fits.num_points, 0),
            last_step=last_step,
            fresh=fresh,
            local_batch_size=local_batch_size,
            busy_time_s=busy_time_s,
            busy_time_rel_se=rel_se,
            num_batch_sizes=fits.num_batch_sizes,
            num_rejected=num_rejected,
            slope_fitted=has & shape_known,
            floor_s=floor_s,
            fit_max_rel_error=np.where(has, fits.max_rel_error, np.nan),
            global_step=ref_step,
        )

    def speed_changes(self) -> int:
        """How many speed changes the records so far show (each rank's change counted once,
        when it is found): a balancer judging a plan against a measurement from before one
        knows that measurement is out of date."""
        self.estimates()
        return self.num_speed_changes

    def _times_without_shared_noise(self) -> np.ndarray:
        """The windows' busy times, each divided by its step's shared slowdown.

        When the machine slows down (a co-tenant, host contention, clock frequency), the
        ranks it hosts slow down at the same steps: on a shared 2-core VM, phases of ~20
        steps at ~1.4× on every rank at once. They do not change which split is best, but
        a window's median lands in the slow or the fast phase depending on how much of it
        the window holds, so for a while ranks look unequal by up to the whole phase and
        a policy would chase that. Each time is divided by

            c_s = median over the ranks that reported step s of  t_i,s / m_i(b_i,s)

        with ``m_i(b)`` the rank's level at that batch size, when at least
        max(:data:`MIN_RANKS_FOR_SHARED_FACTOR`, n/2) ranks reported the step; a step
        fewer have reported yet takes the latest such step's factor (1 before any). A
        rank's own slowdown (or spike) moves the median over ranks little, so it stays in
        that rank's times. A factor beyond :data:`MAX_SHARED_FACTOR` either way is most
        ranks changing speed at once, not the machine: it is 1, and each rank's own speed
        change is found as any other (:meth:`_forget_before_speed_changes`).
        """
        times = self._times_s
        if not self.remove_shared_noise or self.num_workers < MIN_RANKS_FOR_SHARED_FACTOR:
            return times
        valid = self._valid  # a record enters a window only with a usable time and size
        if not valid.any():
            return times
        groups = group_stats_rows(self._sizes, times, self._steps, valid)
        rows, cols = np.nonzero(valid)
        sizes, entry_times, steps = self._sizes[rows, cols], times[rows, cols], self._steps[rows, cols]
        # each entry's group: groups are ordered by (rank, batch size), so by this key
        span = int(sizes.max()) + 1
        group = np.searchsorted(groups.segment * span + groups.batch_size, rows * span + sizes)
        ratio = entry_times / groups.mean_s[group]
        order = np.lexsort((ratio, steps))  # by step, then ratio
        sorted_steps, sorted_ratio = steps[order], ratio[order]
        starts = np.flatnonzero(np.append(True, sorted_steps[1:] != sorted_steps[:-1]))
        count = np.diff(np.append(starts, order.size))
        median = 0.5 * (sorted_ratio[starts + (count - 1) // 2] + sorted_ratio[starts + count // 2])
        # A step not yet reported by enough ranks (records arrive in batches) takes the
        # factor of the latest step that was: slow phases last many steps.
        enough = count >= max(MIN_RANKS_FOR_SHARED_FACTOR, self.num_workers // 2)
        latest_enough = np.maximum.accumulate(np.where(enough, np.arange(count.size), -1))
        factor = np.where(latest_enough >= 0, median[np.maximum(latest_enough, 0)], 1.0)
        factor = np.where((factor > MAX_SHARED_FACTOR) | (factor < 1.0 / MAX_SHARED_FACTOR), 1.0, factor)
        entry_factor = np.empty(order.size)
        entry_factor[order] = np.repeat(factor, count)
        out = times.copy()
        out[rows, cols] = entry_times / entry_factor
        return out

    def _window_stats(self, times_s: np.ndarray):
        """Group statistics of the windows, and per rank the most recent counted batch size
        ``b_L`` (the group with the latest step) with its level, spread and count."""
        n = self.num_workers
        groups = group_stats_rows(self._sizes, times_s, self._steps, self._valid)
        num_rejected = np.bincount(groups.segment, weights=groups.num_rejected, minlength=n).astype(np.int64)
        groups = groups.select(groups.num_kept >= self.min_points_per_size)
        local_batch_size = np.zeros(n, np.int64)
        level_s, sigma_s, count = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, np.int64)
        if groups.segment.size:
            order = np.lexsort((groups.last_key, groups.segment))
            seg_sorted = groups.segment[order]
            latest = order[np.append(seg_sorted[1:] != seg_sorted[:-1], True)]
            r = groups.segment[latest]
            local_batch_size[r] = groups.batch_size[latest]
            level_s[r] = groups.mean_s[latest]
            sigma_s[r] = groups.sigma_s[latest]
            count[r] = groups.num_kept[latest]
        return groups, num_rejected, local_batch_size, level_s, sigma_s, count

    def _forget_before_speed_changes(self, window, times_s: np.ndarray) -> bool:
        """Drops a rank's records from before a speed change; True if any rank changed.

        The median ``m_recent`` of the rank's last ``k = change_detect_steps`` records at
        ``b_L`` is compared with the window's level ``m_L``; with ``k'`` > k/2 such records, a
        change is declared when

            |m_recent − m_L| > max(10 %·m_L, 6·SE),   SE = sqrt(π/2)·σ/sqrt(k')

        (fewer than k/2 spikes among the k cannot move a median that far; σ comes from
        :meth:`_step_noise_s`), and the records from the first recent one that lies nearer
        ``m_recent`` than ``m_L`` all do, but for one spike (a bimodal device is no change).
        The rank then keeps only those records: the window, and any slope fitted from it,
        describe the new speed only, after ~k/2 steps instead of ~W/2.
        """
        _, _, b_l, m_l, sigma_l, _ = window
        k, w = self.change_detect_steps, self.window_steps
        idx = (self._write_pos[:, None] - 1 - np.arange(k)[None, :]) % w  # last k slots, newest first
        take = lambda a: np.take_along_axis(a, idx, axis=1)  # noqa: E731
        recent_times_s, steps = take(times_s), take(self._steps)
        match = take(self._valid) & (take(self._sizes) == b_l[:, None]) & (b_l[:, None] > 0)
        count = match.sum(axis=1)
        rows = np.flatnonzero(count > k // 2)
        if rows.size == 0:
            return False
        recent = np.sort(np.where(match[rows], recent_times_s[rows], np.inf), axis=1)  # matches first
        c, at = count[rows], np.arange(rows.size)
        m_recent = 0.5 * (recent[at, (c - 1) // 2] + recent[at, c // 2])
        big = np.abs(m_recent - m_l[rows]) > CHANGE_MIN_REL * m_l[rows]  # cheap test first
        rows, m_recent, c = rows[big], m_recent[big], c[big]
        if rows.size == 0:
            return False
        se = np.sqrt(MEDIAN_VAR_FACTOR / c) * self._step_noise_s(rows, b_l, m_l, sigma_l, times_s)
        changed = np.abs(m_recent - m_l[rows]) > CHANGE_SIGMAS * se
        if not changed.any():
            return False
        rows, m_recent = rows[changed], m_recent[changed]
        t = recent_times_s[rows]
        new_side = match[rows] & (np.abs(t - m_recent[:, None]) < np.abs(t - m_l[rows, None]))
        since = np.where(new_side, steps[rows], np.iinfo(np.int64).max).min(axis=1)
        # A change stays changed: more than one record after its start on the old side is
        # a device alternating between two speeds (a CPU quota's fast and stalled steps),
        # whose recent median lands in either mode — no change to forget the window for.
        old_side_after = (match[rows] & ~new_side & (steps[rows] >= since[:, None])).sum(axis=1)
        steady = old_side_after <= MAX_OLD_SIDE_AFTER_CHANGE
        if not steady.any():
            return False
        rows, since = rows[steady], since[steady]
        self._valid[rows] &= self._steps[rows] >= since[:, None]
        self.num_speed_changes += int(rows.size)
        return True

    def _step_noise_s(self, rows, b_l, m_l, sigma_l, times_s: np.ndarray) -> np.ndarray:
        """Per-record noise σ at ``b_L`` from successive differences, for ``rows``.

        A window that straddles a speed change has an inflated spread, but only one of its
        successive differences jumps: σ ≈ median|t_{k+1} − t_k| / (0.6745·√2). Falls back
        to the window spread ``σ_L`` with fewer than 4 usable pairs.
        """
        w = self.window_steps
        idx = (self._write_pos[rows, None] + np.arange(w)[None, :]) % w  # oldest first
        take = lambda a: np.take_along_axis(a[rows], idx, axis=1)  # noqa: E731
        ok = take(self._valid) & (take(self._sizes) == b_l[rows, None])
        pairs = ok[:, 1:] & ok[:, :-1]
        diffs = np.where(pairs, np.abs(np.diff(take(times_s), axis=1)), np.nan)
        usable = pairs.sum(axis=1) >= 4
        sigma = sigma_l[rows].copy()
        if usable.any():
            sigma[usable] = np.nanmedian(diffs[usable], axis=1) / (0.6745 * math.sqrt(2))
        return np.maximum(sigma, NOISE_FLOOR_REL * m_l[rows])

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """Plain-Python state (windows and fitted shapes), for the balancer's checkpoint."""
        self._fold_pending()
        # Windows are stored oldest first, so that loading restarts writing at slot len.
        order = (self._write_pos[:, None] + np.arange(self.window_steps)[None, :]) % self.window_steps
        take = lambda a: np.take_along_axis(a, order, axis=1)  # noqa: E731
        valid = take(self._valid)
        windows = [
            [[int(s), int(b), float(t)] for s, b, t, ok in zip(st, sz, ti, va) if ok]
            for st, sz, ti, va in zip(take(self._steps), take(self._sizes), take(self._times_s), valid)
        ]
        return {
            "num_workers": self.num_workers,
            "window_steps": self.window_steps,
            "windows": windows,  # per rank: [global_step, local_batch_size, busy_time_s], oldest first
            "shape_alpha_s": self._shape_alpha_s.tolist(),
            "shape_beta_s_per_sample": [None if math.isnan(x) else x for x in self._shape_beta.tolist()],
            "shape_floor_s": self._shape_floor_s.tolist(),
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restores :meth:`state_dict`; the worker count must match (a resized group starts afresh)."""
        if int(state["num_workers"]) != self.num_workers:
            raise ValueError(
                f"estimator state is for {state['num_workers']} ranks, this one has {self.num_workers}"
            )
        self.__init__(self.num_workers, self.window_steps, self.min_points_per_size,
                      self.stale_after_steps, self.max_slope_rel_se, self.change_detect_steps,
                      self.remove_shared_noise)
        for rank, window in enumerate(state["windows"]):
            for step, size, time_s in window:
                for pending, value in zip(self._pending, (rank, size, time_s, step)):
                    pending.append(value)
        self._fold_pending()
        self._shape_alpha_s = np.array(state["shape_alpha_s"], np.float64)
        self._shape_beta = np.array([math.nan if x is None else x for x in state["shape_beta_s_per_sample"]], np.float64)
        # checkpoints from before the floor have lines only
        self._shape_floor_s = np.array(state.get("shape_floor_s") or [0.0] * self.num_workers, np.float64)


def _as_float_array(values: list) -> np.ndarray:
    try:  # fast path: numbers (None becomes NaN)
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return np.array([_to_float(x) for x in values], dtype=np.float64)


def _to_float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan
