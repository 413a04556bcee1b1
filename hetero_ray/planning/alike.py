"""Ranks that measure alike get one curve: identical devices, equal shares.

The split is solved twice: once with every rank's own curve, giving shares ``b*``; then ranks
whose curves agree at both their shares within the tolerance, or within their own noise,

    d = max over b ∈ {b*_f, b*_j} of |ln(t_j(b)/t_f(b))|
    e^d − 1  ≤  tolerance  (= threshold + noise margin)   or   d  ≤  z·sqrt(se_f² + se_j²)

(``se``: relative standard errors; ``z``: :data:`ALIKE_SIGMAS`) get their group's mean curve
``(ᾱ, β̄, τ̄)`` for the second solve. Groups form from the fastest rank (per sample at its
share) up; a group's first rank ``f`` is the reference of every rank that joins it.
Pure: numbers in, numbers out. Why: docs/profiling-and-planning.md#alike-ranks-share-one-proposal
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from hetero_ray.formatting import format_list
from hetero_ray.planning.cost_model import curve_busy_time_s

# z: busy times this many standard errors of their difference apart are two speeds; closer,
# one speed measured twice (two-sided 95 %). The noise margin alone is no such test: with one
# rank clearly the slowest it is 0, however noisy the others.
ALIKE_SIGMAS = 2.0


def alike_groups(alphas, betas, floors, shares, tolerance: float,
                 rel_se: Optional[Sequence[float]] = None, usable: Optional[Sequence[bool]] = None,
                 sigmas: float = ALIKE_SIGMAS) -> list[list[int]]:
    """The groups (of two ranks or more, each ascending) of usable ranks that measure alike
    (module docstring); ``shares``: each rank's ``b*`` (≥ 1; one number: the same for all).
    A rank whose curve gives no positive time at its share is in none.
    ``rel_se``: each rank's relative standard error (NaN or None: unknown, the tolerance
    alone decides)."""
    a, b, f = (np.asarray(x, dtype=np.float64) for x in (alphas, betas, floors))
    n = a.size
    ok = np.ones(n, dtype=bool) if usable is None else np.asarray(usable, dtype=bool)
    se = np.full(n, np.nan) if rel_se is None else np.asarray(rel_se, dtype=np.float64)
    share = np.broadcast_to(np.asarray(shares, dtype=np.float64), (n,))
    with np.errstate(invalid="ignore"):
        t = curve_busy_time_s(a, b, f, share)
    ok &= np.isfinite(t) & (t > 0) & (share > 0)
    per_sample = np.where(ok, t / np.where(share > 0, share, 1.0), np.inf)
    order = [int(r) for r in np.argsort(per_sample, kind="stable") if ok[r]]

    def apart(i: int, j: int) -> float:  # d: the two curves at both shares
        at = np.array([share[i], share[j]])
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = curve_busy_time_s(a[j], b[j], f[j], at) / curve_busy_time_s(a[i], b[i], f[i], at)
        return float(np.max(np.abs(np.log(ratio))))

    groups: list[list[int]] = []
    while order:
        first, rest = order[0], order[1:]
        group, order = [first], []
        for r in rest:
            d = apart(first, r)
            spread = np.sqrt(se[first] ** 2 + se[r] ** 2)  # NaN: unknown, never ≥ anything
            if np.expm1(d) <= tolerance or d <= sigmas * spread:
                group.append(r)
            else:
                order.append(r)
        if len(group) > 1:
            groups.append(sorted(group))
    return groups


def pool_alike(alphas, betas, floors, shares, tolerance: float,
               rel_se: Optional[Sequence[float]] = None, usable: Optional[Sequence[bool]] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[int]]]:
    """``(α, β, τ)`` with every group of alike ranks given the group's mean curve, and the
    groups; ranks in no group keep their own curve."""
    a, b, f = (np.array(x, dtype=np.float64) for x in (alphas, betas, floors))
    groups = alike_groups(a, b, f, shares, tolerance, rel_se, usable)
    for group in groups:
        for values in (a, b, f):
            values[group] = values[group].mean()
    return a, b, f, groups


def alike_note(groups: list[list[int]], curves, within: str) -> str:
    """A decision reason's words for the groups of alike ranks whose own curves differ (ranks
    with one curve already, as one node's profile gives, need no word)."""
    rows = [np.asarray(c, dtype=np.float64) for c in curves]
    differ = [g for g in groups if any(np.ptp(row[g]) > 0 for row in rows)]
    return "".join(f"; ranks {format_list(int(r) for r in g)} alike (within {within}): one speed" for g in differ)
