"""Several runs side by side: the table and figures the app's Compare page and the HTML
report both show."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pandas as pd
import plotly.graph_objects as go

from hetero_ray.reporting import figures, frames


@dataclass(frozen=True)
class Comparison:
    table: pd.DataFrame  # one row per run, with its time to the common target
    target: Optional[float]  # the eval metric every run reached (None: no evaluations)
    throughput: go.Figure
    efficiency: go.Figure
    accuracy: go.Figure


def compare_runs(runs: list[dict[str, Any]]) -> Comparison:
    """``runs``: per run its ``name``, ``config``, ``cluster`` and ``cluster_plot`` (see
    :mod:`~hetero_ray.reporting.run_frames`) and ``evals``."""
    evals = {r["name"]: r["evals"] for r in runs}
    target, times = frames.time_to_metric(evals)
    table = frames.compare_table(runs)
    if not table.empty:
        table["time to target s"] = [None if times.get(r["name"]) is None else round(times[r["name"]], 1) for r in runs]
    series = {r["name"]: r["cluster_plot"] for r in runs}
    return Comparison(
        table=table, target=target,
        throughput=figures.compare_series_figure(series, "samples_per_s", "Cluster samples/s", "samples/s"),
        efficiency=figures.compare_series_figure(series, "efficiency", "Balance efficiency", "efficiency",
                                                 percent=True),
        accuracy=figures.time_to_accuracy_figure(evals, target),
    )
