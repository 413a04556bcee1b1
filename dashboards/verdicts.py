"""Bottleneck verdicts for a run whose summary holds none (a running or unfinished run).

The verdicts come from the one rule the driver and the metrics store use too:
:func:`hetero_ray.profiling.run_bottlenecks.judge_run`, with the node caps of the run's
profiles; this module only adds why the page is empty when there are none.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from hetero_ray.profiling.run_bottlenecks import judge_run, node_caps_from_profiles


def classify_recent(steps: pd.DataFrame, nodes: list[dict]) -> tuple[list[dict], Optional[str]]:
    """Verdicts over the run's last steps and, when there are none, why."""
    if steps.empty:
        return [], "no steps recorded yet"
    try:
        verdicts = judge_run(steps, node_caps_from_profiles(nodes))
    except Exception as e:  # noqa: BLE001 - shown on the page; the app keeps working
        return [], f"the bottleneck classifier failed on this run: {type(e).__name__}: {e}"
    return verdicts, None if verdicts else "the classifier found no bottleneck in the last steps"
