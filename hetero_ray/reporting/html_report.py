"""``hetero-ray report``: one HTML file with a run's key figures and tables (or several runs
side by side), viewable without a network, and a plain-text summary.

Frames, figures and the comparison come from this package (:mod:`.run_frames`,
:mod:`.figures`, :mod:`.compare`), the same the app shows; plotly.js is embedded once in
the file. Every string from the run's files is HTML-escaped.
"""

from __future__ import annotations

import html
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import pandas as pd
import plotly.io as pio

from hetero_ray.errors import UserError
from hetero_ray.formatting import format_table
from hetero_ray.metrics.summary import build_summary
from hetero_ray.reporting import figures, frames, run_frames
from hetero_ray.reporting.compare import compare_runs
from hetero_ray.reporting.run_source import OfflineRunSource
from hetero_ray.reporting.summary_text import run_summary_text
from hetero_ray.reporting.verdicts import verdict_frame
from hetero_ray.runs import run_files
from hetero_ray.runs.readers import looks_like_run
from hetero_ray.runs.table_cache import TableCache

REPORT_FILE = "report.html"
COMPARE_REPORT_FILE = "hetero_ray_report.html"


@dataclass
class LoadedRun:
    """What a report shows of one run, loaded once."""
    name: str
    run_dir: str
    config: dict[str, Any]
    summary: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    cluster: Optional[pd.DataFrame] = None
    cluster_plot: Optional[pd.DataFrame] = None
    evals: Optional[pd.DataFrame] = None


def check_run_dir(path: str) -> str:
    """The absolute run directory, or a UserError that says what a run directory is."""
    if not os.path.isdir(path):
        raise UserError(f"{path} is not a folder; pass a run directory such as runs/<experiment-name>")
    if not looks_like_run(path):
        raise UserError(f"{path} is not a run directory (no config.json, summary.json, steps.parquet or parts/); "
                        "pass the folder `hetero-ray train` wrote, STORAGE_PATH/NAME")
    return os.path.abspath(path)


def load_run(run_dir: str) -> LoadedRun:
    run_dir = check_run_dir(run_dir)
    name = os.path.basename(run_dir.rstrip(os.sep))
    source = OfflineRunSource("offline:" + name, name, run_dir, TableCache())
    steps = run_frames.steps(source)
    ranks_plot = run_frames.ranks_plot(source)
    cluster_plot = run_frames.cluster_plot(source)
    evals = run_frames.evals(source)
    changes = run_frames.changes(source)
    decisions = frames.decisions_frame(source.decisions())
    verdicts, why_none = source.bottlenecks()
    nodes = source.nodes()
    run = LoadedRun(name=name, run_dir=run_dir, config=source.config(),
                    summary=source.summary() or _summary_of_unfinished(source, run_dir),
                    cluster=run_frames.cluster(source), cluster_plot=cluster_plot, evals=evals)
    run.figures = {
        "Cluster samples/s": figures.throughput_figure(cluster_plot),
        "Loss": figures.loss_figure(cluster_plot, evals),
        "Eval metric": figures.eval_metric_figure(evals),
        "Local batch size": figures.batch_size_figure(ranks_plot, changes),
        "Per-rank samples/s": figures.rank_throughput_figure(ranks_plot),
        "Step-time breakdown": figures.step_breakdown_figure(frames.step_breakdown(steps)),
        "Busy vs waiting": figures.busy_wait_figure(ranks_plot, run_frames.rank_list(source)[:8]),
        "Balance efficiency": figures.efficiency_figure(cluster_plot, changes),
        "Balancer decisions": figures.decisions_figure(decisions),
        "Predicted vs achieved step time": figures.predicted_vs_achieved_figure(decisions, cluster_plot),
        "GPUs": figures.gpu_figure(frames.downsample(frames.gpu_frame(steps), by="rank")),
    }
    run.tables = {
        "Ranks (recent steps)": frames.rank_table(steps),
        "Plans": frames.plan_table(source.plans()),
        "Balancer decisions": decisions[["global_step", "outcome", "reason", "split", "predicted_gain"]]
        if not decisions.empty else decisions,
        "Bottlenecks": verdict_frame(verdicts),
        "Nodes": frames.nodes_frame(nodes, steps, live=False, now=time.time()).drop(columns=["state", "last_step_age_s"]),
        "Devices": frames.devices_frame(nodes),
    }
    run.empty_notes = {"Bottlenecks": why_none, "Devices": "no device profile in this run (nodes.json)",
                       "Balancer decisions": "no balancer decisions in this run"}
    return run


def _summary_of_unfinished(source, run_dir: str) -> dict[str, Any]:
    """A run still going (or one that died) has no summary.json: build it from the tables."""
    config = source.config()
    steps = source.steps()
    attempts = run_files.read_json(os.path.join(run_dir, run_files.ATTEMPTS_FILE), []) or []
    wall = float(steps["wall_time"].max() - steps["wall_time"].min()) if not steps.empty else 0.0
    return build_summary(steps, source.epochs(), source.plans(), attempts, base={
        "experiment_name": config.get("name", os.path.basename(run_dir)),
        "model": config.get("model", "?"), "dataset": config.get("dataset", "?"),
        "policy": config.get("policy", "?"), "num_workers": config.get("num_workers", "?"),
        "global_batch_size": config.get("global_batch_size", "?"), "emulate_speeds": config.get("emulate_speeds"),
        "wall_time_s": wall, "status": source.status(), "error": None, "run_dir": run_dir,
    })


def summary_text(run: LoadedRun) -> str:
    try:
        return run_summary_text(run.summary)
    except (KeyError, TypeError):  # a summary from an older version: say what we can
        return f"== {run.name} ==\n" + "\n".join(f"{k}: {v}" for k, v in sorted(run.summary.items()) if k != "ranks")


def compare_text(runs: list[LoadedRun]) -> str:
    table = _compare_table(runs)
    return format_table(list(table.columns), [["" if pd.isna(v) else v for v in row] for row in table.itertuples(index=False)])


def build_html(runs: list[LoadedRun]) -> str:
    """The whole report as one HTML document (plotly.js embedded once)."""
    parts: list[str] = []
    first_figure = [True]

    def figure_html(fig) -> str:
        embedded = pio.to_html(fig, full_html=False, include_plotlyjs=first_figure[0],
                               config={"displaylogo": False, "responsive": True})
        first_figure[0] = False
        return f'<div class="figure">{embedded}</div>'

    title = "hetero_ray report: " + ", ".join(r.name for r in runs)
    if len(runs) > 1:
        compared = compare_runs([{"name": r.name, "config": r.config, "summary": r.summary, "cluster": r.cluster,
                                  "cluster_plot": r.cluster_plot, "evals": r.evals} for r in runs])
        parts.append("<h2>Comparison</h2>")
        parts.append(_table_html(_compare_table(runs)))
        for figure in (compared.throughput, compared.efficiency, compared.accuracy):
            parts.append(figure_html(figure))
    for run in runs:
        parts.append(f'<h2 id="{html.escape(run.name)}">{html.escape(run.name)}</h2>')
        parts.append(f"<pre class=\"summary\">{html.escape(summary_text(run))}</pre>")
        for name, table in run.tables.items():
            parts.append(f"<h3>{html.escape(name)}</h3>")
            parts.append(_table_html(table, run.empty_notes.get(name)))
        for name, fig in run.figures.items():
            if fig.layout.meta and fig.layout.meta.get("empty") and name in ("GPUs", "Balancer decisions"):
                parts.append(f"<h3>{html.escape(name)}</h3><p class=\"empty\">"
                             f"{html.escape(fig.layout.annotations[0].text)}</p>")
                continue
            parts.append(figure_html(fig))
    body = "\n".join(parts)
    generated = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1200px; color: #222; padding: 0 16px; }}
h1 {{ font-size: 22px; }} h2 {{ font-size: 19px; border-bottom: 2px solid #e5e7eb; padding-bottom: 4px; margin-top: 32px; }}
h3 {{ font-size: 15px; margin: 16px 0 4px; }}
table {{ border-collapse: collapse; font-size: 13px; }} th, td {{ padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left; }}
th {{ border-bottom: 2px solid #ddd; }} pre.summary {{ background: #f6f7f9; padding: 10px; overflow-x: auto; font-size: 12px; }}
.figure {{ border: 1px solid #e5e7eb; border-radius: 6px; margin: 10px 0; }} .empty {{ color: #666; font-size: 13px; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="empty">Generated {generated} by <code>hetero-ray report</code>. Self-contained: open it anywhere, no network needed.</p>
{body}
</body></html>
"""


def _compare_table(runs: list[LoadedRun]) -> pd.DataFrame:
    return frames.compare_table([{"name": r.name, "config": r.config, "cluster": r.cluster, "evals": r.evals} for r in runs])


def _table_html(df: pd.DataFrame, empty: Optional[str] = None) -> str:
    if df is None or df.empty:
        return f'<p class="empty">{html.escape(empty or "nothing recorded")}</p>'
    shown = df.copy()
    for column in shown.columns:  # lists and dicts as readable text
        if shown[column].dtype == object:
            shown[column] = shown[column].map(_cell)
    return shown.to_html(index=False, escape=True, na_rep="", float_format=lambda v: f"{v:,.4g}", border=0)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return "; ".join(f"{k}={v}" for k, v in value.items())
    if hasattr(value, "__len__") and not isinstance(value, str):
        return "/".join(str(v) for v in value)
    return str(value)


def write_report(run_dirs: list[str], out: Optional[str] = None) -> tuple[str, list[LoadedRun]]:
    """Loads the runs, writes the HTML (atomically) and returns its path and the runs."""
    runs = [load_run(d) for d in run_dirs]
    if out is None:
        out = os.path.join(runs[0].run_dir, REPORT_FILE) if len(runs) == 1 else COMPARE_REPORT_FILE
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise UserError(f"--out {out}: folder {directory} does not exist")
    run_files.atomic_write_bytes(os.path.abspath(out), build_html(runs).encode())
    return os.path.abspath(out), runs
