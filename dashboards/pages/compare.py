"""Compare: two or more runs side by side — samples/s, efficiency, time to accuracy."""

from __future__ import annotations

from dash import dcc, html

from dashboards import figures, frames
from dashboards import layout as ui
from dashboards.run_keys import RunNotFound
from dashboards.pages import common

NAME, PATH, TITLE = "compare", "/compare", "Compare"
GRAPHS = ("compare-throughput", "compare-efficiency", "compare-accuracy")
CONTENT = ("compare-table",)
INPUTS = (("compare-select", "value"),)
USES_RUN = False  # reads its own multi-run selection, not the header's run


def layout(catalog=None):
    entries = catalog.entries() if catalog is not None else []
    finished = [e.key for e in entries if e.status == "finished"]
    return ui.page_frame(NAME, TITLE, [
        html.Div([html.Span("Runs to compare:", className="select-label"),
                  dcc.Dropdown(id="compare-select", options=[{"label": e.label, "value": e.key} for e in entries],
                               value=(finished or [e.key for e in entries])[:2], multi=True,
                               placeholder="choose two or more runs", className="compare-select")],
                 className="selector"),
        ui.block("compare-table"),
        ui.graph("compare-throughput"),
        ui.row([ui.graph("compare-efficiency"), ui.graph("compare-accuracy")]),
    ])


def runs_of(sources) -> list[dict]:
    return [{"name": s.name, "config": s.config(), "summary": s.summary(),
             "cluster": common.cluster(s), "cluster_plot": common.cluster_plot(s), "evals": common.evals(s)}
            for s in sources]


def build_from_runs(runs: list[dict]) -> dict:
    """The page's figures and table from already-loaded runs (shared with the HTML report)."""
    target, times = frames.time_to_metric({r["name"]: r["evals"] for r in runs})
    table = frames.compare_table(runs)
    if not table.empty:
        table["time to target s"] = [None if times.get(r["name"]) is None else round(times[r["name"]], 1) for r in runs]
    series = {r["name"]: r["cluster_plot"] for r in runs}
    return {
        "compare-table": [ui.table(table, empty="Choose two or more runs above."),
                          *([html.P(f"target: eval metric {target:.4f}, the best value every chosen run reached",
                                    className="table-note")] if target is not None else [])],
        "compare-throughput": figures.compare_series_figure(series, "samples_per_s", "Cluster samples/s", "samples/s"),
        "compare-efficiency": figures.compare_series_figure(series, "efficiency", "Balance efficiency", "efficiency",
                                                            percent=True),
        "compare-accuracy": figures.time_to_accuracy_figure({r["name"]: r["evals"] for r in runs}, target),
    }


def build(sources, catalog=None, selected=None) -> dict:
    return build_from_runs(runs_of(sources))


def sources_for(catalog, keys) -> tuple[list, list[str]]:
    """The chosen runs' sources, and messages for keys that cannot be opened."""
    sources, problems = [], []
    for key in keys or []:
        try:
            source = catalog.source(key)
            source.refresh()
            sources.append(source)
        except RunNotFound as e:
            problems.append(str(e))
    return sources, problems
