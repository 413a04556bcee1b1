"""The one entry point to the bottleneck classifier: which steps and caps a run is judged on.

The run summary (driver), the metrics store's live query and the app all call
:func:`judge_run`, so a run gets the same verdicts wherever it is looked at. The rule:

1. the window is the latest attempt's last ``thresholds.window_steps`` global steps;
2. if the plan in force at the last step ran at least :data:`MIN_PLAN_STEPS` of them, only
   its steps are judged (a verdict is about that plan, not a mix with the one before);
3. each rank's memory cap, when the nodes were profiled, is its node's cap divided among
   the ranks on that node at the last step: ``cap_i = cap(node_i) // ranks(node_i)``.

Callers pass whatever step rows they hold (a whole run, or a recent window of at least
``window_steps`` global steps): the verdicts are the same. Pure, like the classifier.
"""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd

from hetero_ray.profiling.bottlenecks import BottleneckThresholds, classify, latest_window

MIN_PLAN_STEPS = 10  # fewer steps under the last plan: too few to judge it alone; judge the window


def judge_run(steps: pd.DataFrame, node_caps: Optional[dict[str, int]] = None,
              thresholds: BottleneckThresholds = BottleneckThresholds()) -> list[dict[str, Any]]:
    """Per-rank verdicts (as :meth:`Verdict.to_dict`) over the run's last steps.

    Args:
        steps: step rows (columns of :data:`hetero_ray.metrics.records.STEPS`), at least
            the last ``thresholds.window_steps`` global steps of the run.
        node_caps: node id → largest local batch that fits on the node (profiled), if known;
            see :func:`node_caps_from_profiles`.

    Returns:
        Verdicts ordered by rank; empty when there are no step rows.
    """
    window = latest_window(steps, thresholds.window_steps)
    if window.empty:
        return []
    last_version = window["plan_version"].iloc[window["global_step"].to_numpy().argmax()]
    under_last = window[window["plan_version"] == last_version]
    if under_last["global_step"].nunique() >= MIN_PLAN_STEPS:
        window = under_last
    return [v.to_dict() for v in classify(window, _rank_caps(window, node_caps), thresholds)]


def node_caps_from_profiles(nodes: Optional[list[dict]]) -> dict[str, int]:
    """Node id → the profiled CPU device's largest batch, from ``nodes.json``'s node dicts.

    Nodes that failed profiling, or have no cap, are left out (no cap is known for them).
    """
    caps = {}
    for node in nodes or ():
        if not isinstance(node, dict) or node.get("status", "ok") != "ok":
            continue
        cpus = sorted((d for d in node.get("devices") or () if isinstance(d, dict) and d.get("kind") == "cpu"),
                      key=lambda d: d.get("index") or 0)
        cap = cpus[0].get("max_batch_size") if cpus else None
        if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
            caps[str(node.get("node_id"))] = cap
    return caps


def _rank_caps(window: pd.DataFrame, node_caps: Optional[dict[str, int]]) -> Optional[dict[int, int]]:
    """``cap_i = cap(node_i) // ranks(node_i)``: ranks sharing a node share its memory."""
    if not node_caps:
        return None
    last = window[window["global_step"] == window["global_step"].max()]
    per_node = last.groupby("node_id")["rank"].nunique()
    return {int(r.rank): node_caps[r.node_id] // int(per_node[r.node_id])
            for r in last.itertuples() if node_caps.get(r.node_id)}
