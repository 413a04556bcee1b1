"""Ranks: busy vs waiting per step, local batch sizes with plan changes, own samples/s,
and where each rank's step time goes (data / forward / backward / pad / optimizer / wait)."""

from __future__ import annotations

from dash import dcc, html

from hetero_ray.reporting import figures, frames, run_frames
from hetero_ray_dashboards import layout as ui

NAME, PATH, TITLE = "ranks", "/ranks", "Ranks"
GRAPHS = ("ranks-busy-wait", "ranks-batch", "ranks-throughput", "ranks-breakdown")
CONTENT = ("ranks-table",)
INPUTS = (("ranks-select", "value"),)
MAX_DEFAULT_RANKS = 8  # busy/wait draws one row per rank; more than this is a wall


def layout(catalog=None):
    return ui.page_frame(NAME, TITLE, [
        html.Div([html.Span("Ranks shown:", className="select-label"),
                  dcc.Checklist(id="ranks-select", options=[], value=[], inline=True, className="rank-select")],
                 className="selector"),
        ui.block("ranks-table"),
        ui.row([ui.graph("ranks-batch"), ui.graph("ranks-throughput")]),
        ui.graph("ranks-breakdown"),
        ui.graph("ranks-busy-wait"),
    ])


def rank_options(source) -> tuple[list[dict], list[int]]:
    """The run's ranks as checklist options, and the default selection."""
    ranks = run_frames.rank_list(source)
    return [{"label": f"rank {r}", "value": r} for r in ranks], ranks[:MAX_DEFAULT_RANKS]


def build(source, catalog=None, selected=None) -> dict:
    ranks_plot = run_frames.ranks_plot(source)
    steps = run_frames.steps(source)
    selected = None if selected is None else [int(r) for r in selected]
    table = source.derived("rank_table", lambda: frames.rank_table(steps))
    if selected is not None:
        table = table[table["rank"].isin(selected)]
    breakdown = source.derived("breakdown", lambda: frames.step_breakdown(steps))
    return {
        "ranks-table": ui.table(table, empty=ui.NO_STEPS),
        "ranks-busy-wait": figures.busy_wait_figure(ranks_plot, selected),
        "ranks-batch": figures.batch_size_figure(ranks_plot, run_frames.changes(source), selected),
        "ranks-throughput": figures.rank_throughput_figure(ranks_plot, selected),
        "ranks-breakdown": figures.step_breakdown_figure(breakdown, selected),
    }
