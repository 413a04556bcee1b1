"""The run's effective trajectory across restarts.

Each worker-group start is an *attempt* that resumes at the global step of the last
checkpoint. Steps an attempt ran past that point are redone by the next attempt, so the
rows that describe what the run effectively did are, for attempt ``a``,

    keep row  ⇔  row.global_step < min{ start(a') : a' > a }

(an attempt with no successor keeps all its rows). Stray rows of a dead attempt that
arrive late are dropped by the same rule.
"""

from __future__ import annotations

import pandas as pd


def effective_rows(df: pd.DataFrame, attempt_starts: dict[int, int],
                   step_column: str = "global_step") -> pd.DataFrame:
    """Rows of ``df`` (with ``attempt`` and ``step_column`` columns) on the effective path.

    Args:
        attempt_starts: attempt id → global step it resumed at.
        step_column: the column holding each row's global step.
    """
    if df.empty or not attempt_starts:
        return df
    attempts = sorted(attempt_starts)
    # For each attempt, the first global step it no longer owns.
    limit: dict[int, float] = {}
    following = float("inf")
    for attempt in reversed(attempts):
        limit[attempt] = following
        following = min(following, attempt_starts[attempt])
    row_limit = df["attempt"].map(lambda a: limit.get(int(a), float("inf")))
    return df[df[step_column] < row_limit].reset_index(drop=True)


def effective_plans(plans: list[dict], attempt_starts: dict[int, int]) -> list[dict]:
    """Plan rows on the effective path (the same rule, on ``first_global_step``), in the
    order they took effect: by first global step, then plan version."""
    kept = []
    for plan in plans:
        later = [s for a, s in attempt_starts.items() if a > plan.get("attempt", 0)]
        if not later or plan["first_global_step"] < min(later):
            kept.append(plan)
    return sorted(kept, key=lambda p: (p["first_global_step"], p["plan_version"]))
