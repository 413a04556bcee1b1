"""Balancer: its decisions with reasons, predicted vs achieved step time, balance efficiency."""

from __future__ import annotations

import pandas as pd
from dash import html

from hetero_ray.reporting import figures, frames, run_frames
from hetero_ray_dashboards import layout as ui

NAME, PATH, TITLE = "balancer", "/balancer", "Balancer"
GRAPHS = ("balancer-decisions", "balancer-predicted", "balancer-efficiency")
CONTENT = ("balancer-plans", "balancer-table")
INPUTS = ()
DECISIONS_SHOWN = 50


def layout(catalog=None):
    return ui.page_frame(NAME, TITLE, [
        ui.graph("balancer-efficiency"),
        ui.graph("balancer-decisions"),
        ui.graph("balancer-predicted"),
        ui.row([ui.block("balancer-plans"), ui.block("balancer-table")]),
    ])


def build(source, catalog=None) -> dict:
    decisions = source.derived("decisions", lambda: frames.decisions_frame(source.decisions()))
    decision_table = decisions[["global_step", "outcome", "reason", "split", "left_out", "predicted_gain"]].tail(DECISIONS_SHOWN) \
        if not decisions.empty else decisions
    if not decision_table.empty:
        decision_table = decision_table.assign(predicted_gain=decision_table["predicted_gain"].map(
            lambda g: "" if pd.isna(g) else f"{g:+.1%}"))
    return {
        "balancer-efficiency": figures.efficiency_figure(run_frames.cluster_plot(source), run_frames.changes(source)),
        "balancer-decisions": figures.decisions_figure(decisions),
        "balancer-predicted": figures.predicted_vs_achieved_figure(decisions, run_frames.cluster_plot(source)),
        "balancer-plans": [html.H3("Plans"),
                           ui.table(frames.plan_table(source.plans()), empty="No plan recorded yet.")],
        "balancer-table": [html.H3("Recent decisions"), ui.table(
            decision_table, empty="No balancer decisions in this run: a rebalancing policy (e.g. --policy optimal) "
                                  "records one every --rebalance-interval steps.")],
    }
