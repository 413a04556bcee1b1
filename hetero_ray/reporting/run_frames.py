"""A run's frames that every page and the report share, memoised per run source and data version.

A running run's page adds only finished buckets of steps (``drop_partial``), so that
points already in the browser never change (see :mod:`~hetero_ray.reporting.figures` on
``meta.append``).
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from hetero_ray.reporting import frames
from hetero_ray.reporting.run_source import RunSource


def steps(source: RunSource) -> pd.DataFrame:
    return source.derived("complete_steps", lambda: frames.complete_steps(source.steps()))


def cluster(source: RunSource) -> pd.DataFrame:
    return source.derived("cluster", lambda: frames.cluster_steps(steps(source)))


def cluster_plot(source: RunSource) -> pd.DataFrame:
    return source.derived("cluster_plot", lambda: frames.downsample(cluster(source), drop_partial=source.active()))


def ranks(source: RunSource) -> pd.DataFrame:
    return source.derived("ranks", lambda: frames.rank_steps(steps(source)))


def ranks_plot(source: RunSource) -> pd.DataFrame:
    return source.derived("ranks_plot", lambda: frames.downsample(ranks(source), by="rank", drop_partial=source.active()))


def start_wall_time(source: RunSource) -> Optional[float]:
    table = cluster(source)
    if table.empty:
        return None
    return float(table["end_wall_time"].iloc[0] - table["elapsed_s"].iloc[0])


def evals(source: RunSource) -> pd.DataFrame:
    return source.derived("evals", lambda: frames.eval_points(source.epochs(), start_wall_time(source)))


def changes(source: RunSource) -> pd.DataFrame:
    return source.derived("changes", lambda: frames.plan_changes(source.plans()))


def rank_list(source: RunSource) -> list[int]:
    return source.derived("rank_list", lambda: sorted(int(r) for r in source.steps()["rank"].unique()))
