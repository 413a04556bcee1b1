"""The app's shell (header, navigation, run list, messages) and small shared components.

Pages (``dashboards/pages/``) bring their own body; this module knows nothing about runs.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
from dash import dcc, html

from hetero_ray.formatting import format_duration

APP_TITLE = "hetero_ray"
RUNS_REFRESH_MS = 5000  # the run list: new runs appear within this
PAGE_REFRESH_MS = 1500  # a running run's page (the issue asks for 1–2 s)
NO_STEPS = ("This run has no step records yet. Rows are written a few seconds after training "
            "starts; this page refreshes by itself while the run is going.")


def shell(pages: Sequence[Any]) -> html.Div:
    """Header with navigation and the run list; the page body goes into ``page``."""
    nav = [dcc.Link(page.TITLE, href=page.PATH, className="nav-link", id=f"nav-{page.NAME}") for page in pages]
    return html.Div([
        dcc.Location(id="url", refresh="callback-nav"),
        dcc.Interval(id="runs-interval", interval=RUNS_REFRESH_MS),
        html.Header([
            html.Div([html.Span(APP_TITLE, className="brand"), html.Nav(nav, className="nav")], className="header-left"),
            html.Div([
                html.Label("Run", htmlFor="run-select", className="run-label"),
                dcc.Dropdown(id="run-select", options=[], value=None, clearable=False, searchable=True,
                             placeholder="no runs yet", className="run-select"),
            ], className="header-right"),
        ], className="header"),
        html.Div(id="connection-status", className="connection"),
        html.Div(id="global-message", className="message"),
        html.Main(id="page", className="page"),
    ], className="app")


def page_frame(name: str, title: str, body: list, live: bool = True) -> html.Div:
    """A page: title, message line, body; with the page's refresh timer and state store."""
    parts = [
        html.H2(title, className="page-title"),
        html.Div(id=f"{name}-message", className="message"),
        *body,
        dcc.Store(id=f"{name}-state", data={}),
    ]
    if live:
        parts.append(dcc.Interval(id=f"{name}-interval", interval=PAGE_REFRESH_MS, disabled=True))
    return html.Div(parts, id=f"{name}-page", className="page-body")


def graph(id_: str, height: Optional[int] = None) -> dcc.Graph:
    extra = {"style": {"height": f"{height}px"}} if height else {}
    return dcc.Graph(id=id_, figure={"data": [], "layout": {}}, config={"displaylogo": False},
                     className="graph", **extra)


def message(text: Optional[str], kind: str = "info") -> Optional[html.Div]:
    """A line that says what is going on and what to do; None for nothing to say."""
    if not text:
        return None
    return html.Div(text, className=f"notice notice-{kind}")


def kpis(items: list[tuple[str, str]]) -> html.Div:
    return html.Div([html.Div([html.Div(value, className="kpi-value"), html.Div(label, className="kpi-label")],
                              className="kpi") for label, value in items], className="kpis")


def progress_bar(fraction: Optional[float], text: str) -> html.Div:
    width = 0 if fraction is None else max(0.0, min(1.0, fraction)) * 100
    return html.Div([html.Div(className="progress-fill", style={"width": f"{width:.1f}%"}),
                     html.Span(text, className="progress-text")], className="progress")


def table(df: pd.DataFrame, id_: Optional[str] = None, max_rows: int = 200, empty: str = "nothing to show") -> html.Div:
    """A plain HTML table (text is escaped by React; nothing read is rendered as markup)."""
    named = {"id": id_} if id_ else {}
    if df is None or df.empty:
        return html.Div(html.P(empty, className="empty"), className="table-wrap", **named)
    shown = df.tail(max_rows) if len(df) > max_rows else df
    head = html.Thead(html.Tr([html.Th(str(c)) for c in shown.columns]))
    body = html.Tbody([html.Tr([html.Td(fmt(v)) for v in row]) for row in shown.itertuples(index=False)])
    note = [html.P(f"last {max_rows} of {len(df)} rows", className="table-note")] if len(df) > max_rows else []
    return html.Div([html.Table([head, body], className="table"), *note], className="table-wrap", **named)


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, np.generic):
        value = value.item()
        return fmt(value)
    if isinstance(value, (list, tuple, np.ndarray)):
        return "/".join(fmt(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}={fmt(v)}" for k, v in value.items())
    return str(value)


def duration(seconds: Optional[float]) -> str:
    return format_duration(seconds, compact=False)


def number(value: Optional[float], digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def block(id_: str, class_name: str = "block") -> html.Div:
    """An empty container a callback fills."""
    return html.Div(id=id_, className=class_name)


def row(children: list) -> html.Div:
    """Side by side on wide screens, stacked on narrow ones."""
    return html.Div(children, className="row")
