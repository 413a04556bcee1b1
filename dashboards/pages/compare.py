"""Compare: two or more runs side by side — samples/s, efficiency, time to accuracy."""

from __future__ import annotations

from dash import dcc, html

from hetero_ray.reporting import run_frames
from hetero_ray.reporting.compare import compare_runs
from hetero_ray_dashboards import layout as ui
from hetero_ray_dashboards.run_keys import RunNotFound

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
    return [{"name": s.name, "config": s.config(), "summary": s.summary(), "cluster": run_frames.cluster(s),
             "cluster_plot": run_frames.cluster_plot(s), "evals": run_frames.evals(s)}
            for s in sources]


def build_from_runs(runs: list[dict]) -> dict:
    """The page's figures and table from already-loaded runs (see :func:`runs_of`)."""
    compared = compare_runs(runs)
    note = ([html.P(f"target: eval metric {compared.target:.4f}, the best value every chosen run reached",
                    className="table-note")] if compared.target is not None else [])
    return {
        "compare-table": [ui.table(compared.table, empty="Choose two or more runs above."), *note],
        "compare-throughput": compared.throughput,
        "compare-efficiency": compared.efficiency,
        "compare-accuracy": compared.accuracy,
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
