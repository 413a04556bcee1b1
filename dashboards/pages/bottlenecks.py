"""Bottlenecks: one verdict per rank (what limits it) and what to do about it."""

from __future__ import annotations

import math

import pandas as pd

from dashboards import layout as ui

NAME, PATH, TITLE = "bottlenecks", "/bottlenecks", "Bottlenecks"
GRAPHS = ()
CONTENT = ("bottlenecks-table",)
INPUTS = ()
COLUMNS = ("rank", "node_id", "verdict", "evidence", "recommendation")


def layout(catalog=None):
    return ui.page_frame(NAME, TITLE, [ui.block("bottlenecks-table")])


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


def build(source, catalog=None) -> dict:
    verdicts, why_empty = source.bottlenecks()
    df = verdict_frame(verdicts)
    return {"bottlenecks-table": ui.table(df, empty=f"No verdicts: {why_empty or 'nothing found'}.")}
