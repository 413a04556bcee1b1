"""Bottlenecks: one verdict per rank (what limits it) and what to do about it."""

from __future__ import annotations

from hetero_ray.reporting.verdicts import verdict_frame
from hetero_ray_dashboards import layout as ui

NAME, PATH, TITLE = "bottlenecks", "/bottlenecks", "Bottlenecks"
GRAPHS = ()
CONTENT = ("bottlenecks-table",)
INPUTS = ()


def layout(catalog=None):
    return ui.page_frame(NAME, TITLE, [ui.block("bottlenecks-table")])


def build(source, catalog=None) -> dict:
    verdicts, why_empty = source.bottlenecks()
    df = verdict_frame(verdicts)
    return {"bottlenecks-table": ui.table(df, empty=f"No verdicts: {why_empty or 'nothing found'}.")}
