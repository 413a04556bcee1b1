"""How many samples a rank left out may run each step (its probe) without holding the ranks in back.

A rank left out still runs every step, in step with the others, on a probe that keeps its
cost curve known (:mod:`hetero_ray.training.data.loader`). It is in step with them at every
plan agreement, so a probe slower than the step of the ranks in makes them wait there:
a GPU's step stays flat as its share grows, so the probe of a CPU rank beside it, at half
its last share, can take longer than the GPU's whole step once that rank is out.

So a plan that leaves ranks out also says, from their fitted curves, the most samples each
may probe: the largest ``b`` with ``t_i(b) ≤ PROBE_BUDGET · P``, ``P`` the plan's predicted
step time. The rest of a step (the optimiser, loading, the step's bookkeeping) also runs on
the rank left out, hence the budget of half a step. One sample is the least a step can run;
a rank whose curve is unknown (stale) runs that.
"""

from __future__ import annotations

import math
from typing import Sequence

from hetero_ray.planning.cost_model import curve_busy_time_s

PROBE_BUDGET = 0.5  # of the plan's predicted step time


def probe_sizes(local_batch_sizes: Sequence[int], alphas: Sequence[float], betas: Sequence[float],
                floors: Sequence[float], step_time_s: float, budget: float = PROBE_BUDGET) -> tuple[int, ...]:
    """Per rank: the most samples its probe may hold (0 for the ranks in).

    ``alphas``, ``betas``, ``floors``: each rank's fitted ``t(b) = max(τ, α + β·b)`` (NaN
    where unknown); ``step_time_s``: the plan's predicted step time. No probe holds more
    than an equal share ``⌈B/n⌉``."""
    n = len(local_batch_sizes)
    equal = -(-sum(local_batch_sizes) // n)
    limit_s = budget * step_time_s
    sizes = []
    for b, alpha, beta, floor in zip(local_batch_sizes, alphas, betas, floors):
        if b > 0:
            sizes.append(0)
        elif not all(math.isfinite(v) for v in (alpha, beta, floor, limit_s)) or beta < 0:
            sizes.append(1)  # unknown curve: the least a step can run
        else:
            sizes.append(_largest_within(alpha, beta, floor, limit_s, equal))
    return tuple(sizes)


def _largest_within(alpha: float, beta: float, floor: float, limit_s: float, most: int) -> int:
    """The largest ``b`` in ``[1, most]`` with ``max(τ, α + β·b) ≤ limit_s`` (1 if none)."""
    if float(curve_busy_time_s(alpha, beta, floor, 1)) > limit_s:
        return 1
    if beta == 0:
        return most
    return max(1, min(most, int((limit_s - alpha) / beta)))
