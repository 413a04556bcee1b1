"""Callbacks: thin functions from inputs to outputs, registered on the app.

Each is a plain function (``route``, ``update_runs``, ``update_page``, ``rank_selector``)
that the tests call directly; :func:`register` wires them to component ids.

Sending only what the browser lacks: every page keeps, in its ``<page>-state`` store,
what each of its graphs already shows (a signature of the figure without its data, the
number of points per trace and the last x). On a refresh :func:`deliver` compares the new
figure with that: nothing changed → nothing is sent; only points were added at the end
of an append-only figure → just those points go out through ``extendData``; anything
else (a new run, a plan-change marker, coarser buckets as the run grows) → the figure.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import urllib.parse
from typing import Any, Optional

import numpy as np
import plotly.io as pio
from dash import Input, Output, State, ctx, html, no_update
from plotly.utils import PlotlyJSONEncoder

from hetero_ray.reporting import figures
from hetero_ray_dashboards import layout as ui
from hetero_ray_dashboards.catalog import RunCatalog
from hetero_ray_dashboards.pages import DEFAULT_PAGE, PAGES, ranks as ranks_page
from hetero_ray_dashboards.run_keys import RunNotFound

log = logging.getLogger(__name__)
ARRAY_KEYS = ("x", "y", "customdata", "text")  # per-point arrays that extendData can append to


# ---- navigation and the run list -----------------------------------------------------------

def route(pathname: Optional[str], catalog: RunCatalog):
    """The page for a path; unknown paths get a list of the pages."""
    path = (pathname or "/").rstrip("/") or "/"
    if path == "/":
        return DEFAULT_PAGE.layout(catalog)
    for page in PAGES:
        if page.PATH == path:
            return page.layout(catalog)
    return html.Div([html.H2("Page not found"),
                     html.P(["No page at this address. Pages: ",
                             *[html.A(p.TITLE + " ", href=p.PATH) for p in PAGES]])], className="page-body")


def update_runs(catalog: RunCatalog, n_intervals, search: Optional[str], current: Optional[str],
                current_options: Optional[list]) -> tuple:
    """Run list options, the selected run, the connection line and the global message.

    The URL's ``?run=KEY`` selects a run on load; a live run that ended is replaced by its
    run directory when that lies under the runs folder.
    """
    entries = catalog.entries()
    options = [{"label": e.label, "value": e.key} for e in entries]
    keys = [e.key for e in entries]
    wanted = urllib.parse.parse_qs((search or "").lstrip("?")).get("run", [None])[0]
    if _triggered_id() == "url" and wanted in keys:
        value = wanted
    elif current in keys:
        value = current
    elif current and catalog.successor(current) in keys:
        value = catalog.successor(current)
    elif wanted in keys:
        value = wanted
    else:
        value = keys[0] if keys else None
    connection = catalog.connection()
    state = connection.get("state")
    status = html.Span(connection["message"],
                       className=f"connection-{'ok' if state == 'connected' else 'off' if state == 'off' else 'lost'}")
    if entries:
        message = None
    else:
        message = ui.message(
            f"No runs under {catalog.runs_dir} — start one with `hetero-ray train --storage-path {catalog.runs_dir} "
            f"--name my-run` (or `make demo`)"
            + ("" if catalog.bridge is not None else ", or connect the app to a cluster with --address"), "warn")
    return (options if options != current_options else no_update,
            value if value != current else no_update, status, message)


def _triggered_id() -> Optional[str]:
    try:
        return ctx.triggered_id
    except Exception:  # noqa: BLE001 - called directly (tests), not by Dash
        return None


def rank_selector(catalog: RunCatalog, run_key: Optional[str]) -> tuple:
    """The Ranks page's checklist: the run's ranks, the first few selected."""
    try:
        return ranks_page.rank_options(catalog.source(run_key))
    except RunNotFound:
        return [], []


# ---- pages ----------------------------------------------------------------------------------

def update_page(page, catalog: RunCatalog, run_key: Optional[str], extra: tuple, state: Optional[dict]) -> list:
    """One refresh of ``page``: build its figures and send what the browser lacks.

    Returns the outputs in :func:`page_outputs` order: per graph (figure, extendData), per
    content block children, then the page message, the new state and whether the refresh
    timer stops (it runs only while the run is going).
    """
    state = state or {}
    uses_run = getattr(page, "USES_RUN", True)
    notes: list[str] = []
    try:
        if uses_run:
            source = catalog.source(run_key)
            source.refresh()
            sources = [source]
            built = page.build(source, catalog, *extra)
            notes.append(source.notice() or "")
        else:
            from hetero_ray_dashboards.pages.compare import sources_for

            sources, problems = sources_for(catalog, extra[0] if extra else [])
            notes.extend(problems)
            built = page.build(sources, catalog, *extra)
            for source in sources:
                notes.append(source.notice() or "")
    except RunNotFound as e:
        hint = "choose a run in the list at the top" if catalog.entries() else \
            f"no runs under {catalog.runs_dir} yet — start one with `hetero-ray train --storage-path {catalog.runs_dir}`"
        return _empty_outputs(page, f"{e}: {hint}.")
    except Exception as e:  # noqa: BLE001 - the page says so; the app keeps serving
        log.exception("building page %s failed", page.NAME)
        return _empty_outputs(page, f"Could not show this run: {type(e).__name__}: {e}", kind="error")

    identity = json.dumps([run_key if uses_run else None, list(extra)], default=str)
    previous = state.get("graphs", {}) if state.get("identity") == identity else {}
    outputs: list = []
    graph_states = {}
    active = any(source.active() for source in sources)
    for graph_id in page.GRAPHS:
        figure_out, extend_out, graph_states[graph_id] = deliver(built[graph_id], previous.get(graph_id), active)
        outputs += [figure_out, extend_out]
    content_hashes = {}
    for content_id in page.CONTENT:
        children = built[content_id]
        content_hashes[content_id] = _hash(children)
        same = state.get("identity") == identity and state.get("content", {}).get(content_id) == content_hashes[content_id]
        outputs.append(no_update if same else children)
    text = " ".join(n for n in notes if n)
    stopped = not active
    new_state = {"identity": identity, "graphs": graph_states, "content": content_hashes,
                 "message": text, "stopped": stopped}
    same_run = state.get("identity") == identity
    # Only what changed goes out: on a quiet refresh the response is (nearly) empty.
    outputs.append(no_update if same_run and state.get("message") == text else
                   (ui.message(text, "warn") if text else None))
    outputs.append(no_update if new_state == state else new_state)
    outputs.append(no_update if same_run and state.get("stopped") == stopped else stopped)
    return outputs


def _empty_outputs(page, text: str, kind: str = "warn") -> list:
    outputs: list = []
    for _ in page.GRAPHS:
        outputs += [figures.empty_figure(text), no_update]
    outputs += [None for _ in page.CONTENT]
    return outputs + [ui.message(text, kind), {}, True]


def page_outputs(page) -> list:
    outputs = []
    for graph_id in page.GRAPHS:
        outputs += [Output(graph_id, "figure"), Output(graph_id, "extendData")]
    outputs += [Output(content_id, "children") for content_id in page.CONTENT]
    return outputs + [Output(f"{page.NAME}-message", "children"), Output(f"{page.NAME}-state", "data"),
                      Output(f"{page.NAME}-interval", "disabled")]


# ---- increments -----------------------------------------------------------------------------

def deliver(fig, previous: Optional[dict], extendable: bool = True) -> tuple[Any, Any, dict]:
    """What to send for ``fig`` given what the browser shows (``previous``).

    Args:
        extendable: the figure may get points appended later (a running run). Its arrays
            then go out as plain lists: plotly.js keeps base64 arrays as they came, and
            ``extendTraces`` cannot append to them (it fails silently in dcc.Graph).

    Returns ``(figure or no_update, extendData or no_update, state)``.
    """
    spec = fig.to_plotly_json()
    data = spec.get("data", [])
    layout = spec.get("layout", {})
    signature = _hash([layout, [{k: v for k, v in trace.items() if k not in ARRAY_KEYS} for trace in data]])
    arrays = [{k: _array(trace[k]) for k in ARRAY_KEYS if _is_array(trace.get(k))} for trace in data]
    lengths = [len(a["x"]) if "x" in a else None for a in arrays]
    state = {
        "sig": signature, "n": lengths,
        "first": [_plain(a["x"][0]) if n else None for a, n in zip(arrays, lengths)],
        "last": [_plain(a["x"][-1]) if n else None for a, n in zip(arrays, lengths)],
    }
    append = bool((layout.get("meta") or {}).get("append"))
    # Only a figure the browser holds as plain lists can be extended (see Args).
    appendable = append and previous and previous.get("plain") and previous.get("sig") == signature \
        and len(previous.get("n", [])) == len(lengths)
    if appendable:
        update, indices = _increment(arrays, lengths, previous)
        if update is not None:
            state["plain"] = True
            if not indices:
                state["hash"] = previous.get("hash")  # unchanged: the state stays equal too
                return no_update, no_update, state
            return no_update, [update, indices], state
    state["hash"] = _hash(spec)
    if previous and previous.get("hash") == state["hash"]:
        state["plain"] = previous.get("plain", False)
        return no_update, no_update, state
    state["plain"] = bool(extendable and append)
    if state["plain"]:
        return _with_plain_arrays(spec), no_update, state
    return fig, no_update, state


def _with_plain_arrays(spec: dict) -> dict:
    """The figure as a dict whose per-point arrays are lists (see :func:`deliver`)."""
    data = []
    for trace in spec.get("data", []):
        trace = dict(trace)
        for key in ARRAY_KEYS:
            if isinstance(trace.get(key), dict) and "bdata" in trace[key]:
                trace[key] = _plain_list(_array(trace[key]))
        data.append(trace)
    return {**spec, "data": data}


def _increment(arrays: list[dict], lengths: list, previous: dict) -> tuple[Optional[dict], list[int]]:
    """Points added at the end of each trace, as an extendData update; None if the old
    points changed (then the whole figure goes)."""
    update: dict[str, list] = {}
    indices: list[int] = []
    keys: Optional[set] = None
    for i, (trace, n, n_old) in enumerate(zip(arrays, lengths, previous["n"])):
        if n is None or n_old is None:
            if n != n_old:
                return None, []
            continue
        if n < n_old or (n_old and (_plain(trace["x"][n_old - 1]) != previous["last"][i]
                                   or _plain(trace["x"][0]) != previous["first"][i])):
            return None, []
        if any(len(a) != n for a in trace.values()):
            return None, []
        if n == n_old:
            continue
        if keys is None:
            keys = set(trace)
        elif keys != set(trace):
            return None, []  # extendTraces needs the same arrays for every trace it extends
        indices.append(i)
        for key in trace:
            update.setdefault(key, []).append(_plain_list(trace[key][n_old:]))
    return update, indices


def _is_array(value) -> bool:
    return isinstance(value, (list, tuple, np.ndarray)) or (isinstance(value, dict) and "bdata" in value)


def _array(value) -> np.ndarray:
    """A trace's per-point values; plotly ≥ 6 holds numpy data as base64 typed arrays."""
    if isinstance(value, dict):
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return data.reshape(value["shape"]) if value.get("shape") else data
    return np.asarray(value)


def _plain(value):
    """A JSON-safe scalar that compares equal across refreshes."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return round(value, 9)
    return value if isinstance(value, (int, str, bool)) or value is None else str(value)


def _plain_list(values: np.ndarray) -> list:
    """Plain lists: extendTraces cannot append the base64 arrays plotly sends figures as."""
    return [None if isinstance(v, float) and np.isnan(v) else v for v in values.tolist()]


def _hash(value) -> str:
    if hasattr(value, "to_plotly_json") and not isinstance(value, dict):
        value = value.to_plotly_json()
    text = json.dumps(value, cls=PlotlyJSONEncoder, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def payload_bytes(outputs: list) -> int:
    """Bytes of the JSON a callback response carries for ``outputs`` (no_update is left out)."""
    sent = [o for o in outputs if o is not no_update]
    return len(pio.json.to_json_plotly(sent).encode())


# ---- wiring ---------------------------------------------------------------------------------

def register(app, catalog: RunCatalog) -> None:
    app.callback(Output("page", "children"), Input("url", "pathname"))(lambda pathname: route(pathname, catalog))
    app.callback(
        Output("run-select", "options"), Output("run-select", "value"),
        Output("connection-status", "children"), Output("global-message", "children"),
        Input("runs-interval", "n_intervals"), Input("url", "search"),
        State("run-select", "value"), State("run-select", "options"),
    )(lambda n, search, current, options: update_runs(catalog, n, search, current, options))
    app.callback(Output("ranks-select", "options"), Output("ranks-select", "value"),
                 Input("run-select", "value"))(lambda run_key: rank_selector(catalog, run_key))
    for page in PAGES:
        _register_page(app, catalog, page)


def _register_page(app, catalog: RunCatalog, page) -> None:
    uses_run = getattr(page, "USES_RUN", True)
    inputs = ([Input("run-select", "value")] if uses_run else []) + [Input(f"{page.NAME}-interval", "n_intervals")]
    inputs += [Input(component, prop) for component, prop in page.INPUTS]

    def callback(*args):
        state = args[-1]
        run_key = args[0] if uses_run else None
        extra = tuple(args[(2 if uses_run else 1):-1])
        return update_page(page, catalog, run_key, extra, state)

    app.callback(*page_outputs(page), *inputs, State(f"{page.NAME}-state", "data"))(callback)
