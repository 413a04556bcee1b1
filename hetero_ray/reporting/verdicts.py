"""Bottleneck verdicts as the report and the app show them.

For a run whose summary holds none (a running or unfinished run), the verdicts come from
the one rule the driver and the metrics store use too:
:func:`hetero_ray.bottlenecks.judge.judge_run`, with the run's node profiles; this module adds why there are none, and the table the verdicts are shown as.
"""

from __future__ import annotations

import math
from typing import Optional

import pandas as pd

from hetero_ray.bottlenecks.judge import judge_run

COLUMNS = ("rank", "node_id", "verdict", "evidence", "recommendation")  # of verdict_frame


def classify_recent(steps: pd.DataFrame, nodes: list[dict]) -> tuple[list[dict], Optional[str]]:
    """Verdicts over the run's last steps and, when there are none, why."""
    if steps.empty:
        return [], "no steps recorded yet"
    try:
        verdicts = judge_run(steps, nodes)
    except Exception as e:  # noqa: BLE001 - shown on the page; the app keeps working
        return [], f"the bottleneck classifier failed on this run: {type(e).__name__}: {e}"
    return verdicts, None if verdicts else "the classifier found no bottleneck in the last steps"


def verdict_frame(verdicts: list[dict]) -> pd.DataFrame:
    """Verdict dicts (``Verdict.to_dict()``) as a table with readable evidence."""
    rows = [{c: v.get(c) for c in COLUMNS} for v in verdicts if isinstance(v, dict)]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    if not df.empty:
        df["node_id"] = df["node_id"].astype(str).str.slice(0, 8)
        df["evidence"] = df["evidence"].map(evidence_text)
    return df


def evidence_text(evidence) -> str:
    """``{"busy_ratio": 1.4824, "gpu_util": None, "also": []}`` → ``busy_ratio=1.48``."""
    if not isinstance(evidence, dict):
        return "" if evidence is None else str(evidence)
    parts = []
    for key, value in evidence.items():
        if value is None or value == [] or (isinstance(value, float) and math.isnan(value)):
            continue
        if isinstance(value, float):
            value = f"{value:.3g}"
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        parts.append(f"{key}={value}")
    return "; ".join(parts)
