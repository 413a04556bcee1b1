"""The one entry point to the bottleneck classifier: which steps and caps a run is judged on.

The run summary (driver), the metrics store's live query and the app all call
:func:`judge_run`, so a run gets the same verdicts wherever it is looked at. The rule:

1. the window is the latest attempt's last ``thresholds.window_steps`` global steps;
2. of those, only the steps of the plan in force at the last step are judged: a verdict is
   advice about the shares in force, and a window mixing older plans showed the old shares
   and advised moving samples the balancer had already moved. A plan in force too new to
   have ``thresholds.min_steps`` steps gets "too few to judge", not the older plans' verdict;
3. each rank's memory cap, when the nodes were profiled, is the planner's: the one rule of
   :func:`hetero_ray.planning.capacity.rank_memory_caps` (the CPU ranks of a node share its
   RAM, ``cap_i = cap(node_i) // cpu_ranks(node_i)``; a GPU rank has its own device's), over
   the ranks of the last step.

Callers pass whatever step rows they hold (a whole run, or a recent window of at least
``window_steps`` global steps): the verdicts are the same. Pure, like the classifier.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import pandas as pd

from hetero_ray.bottlenecks.classify import BottleneckThresholds, classify, latest_window
from hetero_ray.planning.capacity import rank_memory_caps

def judge_run(steps: pd.DataFrame, nodes: Optional[Sequence[dict]] = None,
              thresholds: BottleneckThresholds = BottleneckThresholds()) -> list[dict[str, Any]]:
    """Per-rank verdicts (as :meth:`Verdict.to_dict`) over the run's last steps.

    Args:
        steps: step rows (columns of :data:`hetero_ray.runs.records.STEPS`), at least
            the last ``thresholds.window_steps`` global steps of the run.
        nodes: the run's node profiles (the node dicts of ``nodes.json``), if known.

    Returns:
        Verdicts ordered by rank; empty when there are no step rows.
    """
    window = latest_window(steps, thresholds.window_steps)
    if window.empty:
        return []
    in_force = window["plan_version"].iloc[window["global_step"].to_numpy().argmax()]
    window = window[window["plan_version"] == in_force]
    return [v.to_dict() for v in classify(window, _rank_caps(window, nodes), thresholds)]


def _rank_caps(window: pd.DataFrame, nodes: Optional[Sequence[dict]]) -> Optional[dict[int, int]]:
    """Each rank's memory cap at the window's last step (ranks without one left out)."""
    if not nodes:
        return None
    last = window[window["global_step"] == window["global_step"].max()].sort_values("rank")
    ranks = [int(r) for r in last["rank"]]
    caps = rank_memory_caps(nodes, [str(n) for n in last["node_id"]])
    return {rank: cap for rank, cap in zip(ranks, caps) if cap}
