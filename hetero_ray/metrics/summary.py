"""The run's summary, computed from its tables (pure: DataFrames in, dict out)."""

from __future__ import annotations

import math
from typing import Any, Optional

import pandas as pd


def per_step(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per global step: samples of the whole cluster and when the step ended."""
    if steps.empty:
        return pd.DataFrame(columns=["global_step", "samples", "end_wall_time", "step_time_s", "num_ranks"])
    grouped = steps.groupby("global_step", sort=True)
    return pd.DataFrame({
        "samples": grouped["local_batch_size"].sum(),
        "end_wall_time": grouped["wall_time"].max(),
        "step_time_s": grouped["step_time_s"].max(),
        "num_ranks": grouped["rank"].nunique(),
    }).reset_index()


def steady_samples_per_s(steps: pd.DataFrame) -> Optional[float]:
    """Cluster samples per second over the second half of the steps (wall clock)."""
    table = per_step(steps)
    if len(table) < 4:
        return None
    mid = len(table) // 2
    span = table["end_wall_time"].iloc[-1] - table["end_wall_time"].iloc[mid - 1]
    samples = table["samples"].iloc[mid:].sum()
    return float(samples / span) if span > 0 else None


def rank_summaries(steps: pd.DataFrame, last_steps: int = 50) -> list[dict[str, Any]]:
    """Per rank over the last ``last_steps`` global steps: share, busy time, own throughput."""
    if steps.empty:
        return []
    recent = steps[steps["global_step"] > steps["global_step"].max() - last_steps]
    out = []
    for rank, rows in recent.groupby("rank", sort=True):
        busy = rows["busy_time_s"].median()
        batch = rows["local_batch_size"].median()
        out.append({
            "rank": int(rank),
            "node_id": str(rows["node_id"].iloc[-1]),
            "local_batch_size": int(rows["local_batch_size"].iloc[-1]),
            "busy_time_s": _f(busy),
            "step_time_s": _f(rows["step_time_s"].median()),
            "wait_time_s": _f(rows["wait_time_s"].median()),
            "samples_per_s": _f(batch / busy) if busy and busy > 0 else None,
        })
    return out


def build_summary(steps: pd.DataFrame, epochs: pd.DataFrame, plans: pd.DataFrame,
                  attempts: list[dict], base: dict[str, Any]) -> dict[str, Any]:
    table = per_step(steps)
    shares = [] if plans.empty else [[int(b) for b in sizes] for sizes in
                                     plans.sort_values("first_global_step")["local_batch_sizes"]]
    summary = dict(base)
    summary.update({
        "global_steps": int(len(table)),
        "samples": int(table["samples"].sum()) if len(table) else 0,
        "steady_samples_per_s": steady_samples_per_s(steps),
        "mean_step_time_s": _f(table["step_time_s"].mean()) if len(table) else None,
        "attempts": len(attempts),
        "restarts": max(0, len(attempts) - 1),
        "plan_changes": max(0, int(plans["plan_version"].nunique()) - 1) if not plans.empty else 0,
        "first_plan": shares[0] if shares else None,
        "final_plan": shares[-1] if shares else None,
        # ranks the final plan leaves out (b_i = 0): they train nothing and skip the all-reduce
        "left_out_ranks": [r for r, b in enumerate(shares[-1]) if b == 0] if shares else [],
        "ranks": rank_summaries(steps),
    })
    if not epochs.empty:
        last = epochs.sort_values(["epoch", "global_step"]).iloc[-1]
        summary.update({
            "epochs_completed": int(epochs["epoch"].nunique()),
            "final_train_loss": _f(last["train_loss"]),
            "final_eval_loss": _f(last["eval_loss"]),
            "final_eval_metric": _f(last["eval_metric"]),
            "eval_metric_name": last["eval_metric_name"],
        })
    return summary


def _f(value) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value
