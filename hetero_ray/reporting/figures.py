"""Figures: pure functions from DataFrames (see :mod:`hetero_ray.reporting.frames`) to plotly figures.

No I/O and no Dash here, so the app, the HTML report and the tests share them. Each
function draws an explained empty state when its frame is empty.

Time series set ``layout.meta["append"]``: their points only ever get added at the end
(trailing windows, full buckets), which lets a live page send just the new points.
Text that comes from run files (reasons, names) is escaped: plotly renders a little HTML
in hover text and legends, and nothing read from disk should become markup.
"""

from __future__ import annotations

import html
from typing import Optional, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

PALETTE = qualitative.Plotly + qualitative.D3
PART_LABELS = {"data_time_s": "data", "forward_time_s": "forward", "backward_time_s": "backward",
               "pad_time_s": "emulation pad", "optimizer_time_s": "optimizer", "wait_time_s": "waiting"}
PART_COLORS = {"data_time_s": "#8c564b", "forward_time_s": "#1f77b4", "backward_time_s": "#2ca02c",
               "pad_time_s": "#bcbd22", "optimizer_time_s": "#9467bd", "wait_time_s": "#d62728"}
HEIGHT = 320
_GRID = dict(gridcolor="#ebf0f8", linecolor="#ebf0f8", zerolinecolor="#ebf0f8", automargin=True)
# A small white template: plotly's "plotly_white" is ~6 kB of JSON in every figure and
# costs a deep copy each time it is applied.
TEMPLATE = go.layout.Template(layout=dict(
    paper_bgcolor="white", plot_bgcolor="white", colorway=PALETTE[:10], font=dict(color="#2a3f5f"),
    xaxis=_GRID, yaxis=_GRID, hoverlabel=dict(align="left"),
))


def rank_color(rank: int) -> str:
    return PALETTE[int(rank) % len(PALETTE)]


def safe(text) -> str:
    """Text from a run file, made inert for plotly's HTML-ish labels."""
    return html.escape("" if text is None else str(text), quote=False)


def empty_figure(message: str, title: str = "", height: int = HEIGHT) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        title=title, height=height, template=TEMPLATE, margin=dict(l=50, r=20, t=50, b=40),
        xaxis=dict(visible=False), yaxis=dict(visible=False),
        annotations=[dict(text=safe(message), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                          font=dict(size=14, color="#666"))],
        meta={"empty": True},
    )
    return fig


def _layout(fig: go.Figure, title: str, x: str, y: str, *, append: bool = False, bucket_steps: int = 1,
            height: int = HEIGHT, legend: bool = True) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0.01), height=height, template=TEMPLATE,
        margin=dict(l=60, r=20, t=50, b=45), hovermode="x unified", showlegend=legend,
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1),
        meta={"append": append, "bucket_steps": int(bucket_steps)},
        uirevision="keep",  # zoom and legend clicks survive refreshes
    )
    fig.update_xaxes(title_text=x)
    fig.update_yaxes(title_text=y)
    return fig


def _bucket_note(df: pd.DataFrame) -> str:
    width = df.attrs.get("bucket_steps", 1)
    return f" (mean of every {width} steps)" if width > 1 else ""


def _mark_plan_changes(fig: go.Figure, changes: pd.DataFrame, rows: Optional[int] = None) -> None:
    for change in changes.itertuples():
        fig.add_vline(x=change.first_global_step, line=dict(color="#999", dash="dot", width=1),
                      annotation_text=f"v{change.plan_version}", annotation_position="top",
                      annotation_font=dict(size=10, color="#666"))


# ---- Run page ---------------------------------------------------------------------------

def throughput_figure(cluster: pd.DataFrame) -> go.Figure:
    """Cluster samples/s over elapsed time, and the ideal if nobody waited."""
    title = "Cluster samples/s"
    if cluster.empty:
        return empty_figure("No steps recorded yet: samples/s appear after the first steps.", title)
    fig = go.Figure([
        go.Scatter(x=cluster["elapsed_s"].to_numpy(), y=cluster["samples_per_s"].to_numpy(), name="achieved",
                   mode="lines", line=dict(color="#1f77b4", width=2)),
        go.Scatter(x=cluster["elapsed_s"].to_numpy(), y=cluster["ideal_samples_per_s"].to_numpy(),
                   name="ideal (no waiting)", mode="lines", line=dict(color="#aaa", dash="dash", width=1)),
    ])
    return _layout(fig, title + _bucket_note(cluster), "elapsed s", "samples/s", append=True,
                   bucket_steps=cluster.attrs.get("bucket_steps", 1))


def loss_figure(cluster: pd.DataFrame, evals: pd.DataFrame) -> go.Figure:
    """Training loss per step (batch-weighted over ranks) and eval loss per epoch."""
    title = "Loss"
    if cluster.empty:
        return empty_figure("No steps recorded yet: the loss appears after the first steps.", title)
    traces = [go.Scatter(x=cluster["global_step"].to_numpy(), y=cluster["loss"].to_numpy(), name="train loss",
                         mode="lines", line=dict(color="#ff7f0e"))]
    if not evals.empty and evals["eval_loss"].notna().any():
        traces.append(go.Scatter(x=evals["global_step"].to_numpy(), y=evals["eval_loss"].to_numpy(),
                                 name="eval loss", mode="lines+markers", line=dict(color="#2ca02c")))
    return _layout(go.Figure(traces), title + _bucket_note(cluster), "global step", "loss", append=True,
                   bucket_steps=cluster.attrs.get("bucket_steps", 1))


def eval_metric_figure(evals: pd.DataFrame) -> go.Figure:
    """The eval metric at each epoch end."""
    if evals.empty or not evals["eval_metric"].notna().any():
        return empty_figure("No evaluation yet: the metric is measured at the end of each epoch.", "Eval metric")
    name = safe(evals["eval_metric_name"].dropna().iloc[-1] if evals["eval_metric_name"].notna().any() else "metric")
    fig = go.Figure(go.Scatter(x=evals["epoch"].to_numpy() + 1, y=evals["eval_metric"].to_numpy(), name=name,
                               mode="lines+markers", line=dict(color="#9467bd"),
                               customdata=evals["elapsed_s"].to_numpy(),
                               hovertemplate="epoch %{x}: %{y:.4f} at %{customdata:.0f} s<extra></extra>"))
    fig.update_xaxes(dtick=1)
    return _layout(fig, f"Eval {name} at each epoch end", "epoch", name, append=True)


# ---- Ranks page -------------------------------------------------------------------------

def _selected(df: pd.DataFrame, ranks: Optional[Sequence[int]]) -> list[int]:
    present = sorted(int(r) for r in df["rank"].unique())
    if ranks is None:
        return present
    wanted = {int(r) for r in ranks}
    return [r for r in present if r in wanted]


def busy_wait_figure(ranks_df: pd.DataFrame, ranks: Optional[Sequence[int]] = None) -> go.Figure:
    """Per selected rank, busy and waiting time per step, stacked (one row per rank)."""
    title = "Busy vs waiting per step"
    if ranks_df.empty:
        return empty_figure("No steps recorded yet.", title)
    selected = _selected(ranks_df, ranks)
    if not selected:
        return empty_figure("No rank selected: pick ranks above.", title)
    fig = make_subplots(rows=len(selected), cols=1, shared_xaxes=True, vertical_spacing=min(0.08, 0.3 / len(selected)),
                        subplot_titles=[f"rank {r}" for r in selected])
    for row, rank in enumerate(selected, start=1):
        part = ranks_df[ranks_df["rank"] == rank]
        x = part["global_step"].to_numpy()
        fig.add_trace(go.Scatter(x=x, y=part["busy_time_s"].to_numpy() * 1000, name="busy", legendgroup="busy",
                                 showlegend=row == 1, stackgroup=f"r{rank}", mode="lines",
                                 line=dict(width=0.5, color="#1f77b4")), row=row, col=1)
        fig.add_trace(go.Scatter(x=x, y=part["wait_time_s"].to_numpy() * 1000, name="waiting", legendgroup="wait",
                                 showlegend=row == 1, stackgroup=f"r{rank}", mode="lines",
                                 line=dict(width=0.5, color="#d62728")), row=row, col=1)
        fig.update_yaxes(title_text="ms", row=row, col=1)
    _layout(fig, title + _bucket_note(ranks_df), "", "", append=True,
            bucket_steps=ranks_df.attrs.get("bucket_steps", 1), height=max(HEIGHT, 150 * len(selected) + 80))
    fig.update_xaxes(title_text="global step", row=len(selected), col=1)
    return fig


def batch_size_figure(ranks_df: pd.DataFrame, changes: pd.DataFrame,
                      ranks: Optional[Sequence[int]] = None) -> go.Figure:
    """Each rank's local batch size over the steps, plan changes marked."""
    title = "Local batch size"
    if ranks_df.empty:
        return empty_figure("No steps recorded yet.", title)
    fig = go.Figure([
        go.Scatter(x=part["global_step"].to_numpy(), y=part["local_batch_size"].to_numpy(), name=f"rank {rank}",
                   mode="lines", line=dict(shape="hv", color=rank_color(rank)))
        for rank in _selected(ranks_df, ranks) for part in [ranks_df[ranks_df["rank"] == rank]]
    ])
    _mark_plan_changes(fig, changes)
    return _layout(fig, title + (" (dotted: plan changes)" if not changes.empty else ""), "global step",
                   "samples per step", append=True, bucket_steps=ranks_df.attrs.get("bucket_steps", 1))


def rank_throughput_figure(ranks_df: pd.DataFrame, ranks: Optional[Sequence[int]] = None) -> go.Figure:
    """Each rank's own samples/s (local batch / busy time)."""
    title = "Per-rank samples/s (own speed)"
    if ranks_df.empty:
        return empty_figure("No steps recorded yet.", title)
    fig = go.Figure([
        go.Scatter(x=part["global_step"].to_numpy(), y=part["samples_per_s"].to_numpy(), name=f"rank {rank}",
                   mode="lines", line=dict(color=rank_color(rank)))
        for rank in _selected(ranks_df, ranks) for part in [ranks_df[ranks_df["rank"] == rank]]
    ])
    return _layout(fig, title + _bucket_note(ranks_df), "global step", "samples/s", append=True,
                   bucket_steps=ranks_df.attrs.get("bucket_steps", 1))


def step_breakdown_figure(breakdown: pd.DataFrame, ranks: Optional[Sequence[int]] = None) -> go.Figure:
    """Median time of each part of a step, per rank, stacked (ms)."""
    title = "Step-time breakdown (median of recent steps)"
    if breakdown.empty:
        return empty_figure("No steps recorded yet.", title)
    shown = breakdown[breakdown["rank"].isin(_selected(breakdown, ranks))]
    labels = [f"rank {int(r)} (b={int(b)})" for r, b in zip(shown["rank"], shown["local_batch_size"])]
    fig = go.Figure([
        go.Bar(y=labels, x=shown[part].to_numpy() * 1000, name=label, orientation="h",
               marker_color=PART_COLORS[part], hovertemplate="%{x:.1f} ms<extra>" + label + "</extra>")
        for part, label in PART_LABELS.items()
    ])
    fig.update_layout(barmode="stack", legend=dict(traceorder="normal"))
    fig.update_yaxes(autorange="reversed")
    _layout(fig, title, "ms per step", "", height=max(220, 60 * len(shown) + 120))
    fig.update_layout(hovermode="closest")
    return fig


# ---- Balancer page ----------------------------------------------------------------------

def decisions_figure(decisions: pd.DataFrame) -> go.Figure:
    """Every balancer decision on the step axis: adopted or kept, with its reason."""
    title = "Balancer decisions"
    if decisions.empty:
        return empty_figure("No balancer decisions in this run: they are recorded when a rebalancing "
                            "policy runs (e.g. --policy optimal).", title)
    fig = go.Figure()
    for outcome, color, symbol in (("adopted", "#2ca02c", "circle"), ("kept current plan", "#999", "x")):
        part = decisions[decisions["outcome"] == outcome]
        if part.empty:
            continue
        text = [f"{safe(reason)}<br>split {safe(split)}" + (f"<br>predicted gain {gain:.1%}" if pd.notna(gain) else "")
                for reason, split, gain in zip(part["reason"], part["split"], part["predicted_gain"])]
        fig.add_trace(go.Scatter(x=part["global_step"].to_numpy(), y=[outcome] * len(part), name=outcome,
                                 mode="markers", marker=dict(color=color, symbol=symbol, size=10),
                                 text=text, hovertemplate="step %{x}<br>%{text}<extra></extra>"))
    _layout(fig, title, "global step", "", height=220)
    fig.update_layout(hovermode="closest")
    return fig


def predicted_vs_achieved_figure(decisions: pd.DataFrame, cluster: pd.DataFrame) -> go.Figure:
    """Step time the balancer predicted (new and current plan) vs what was achieved."""
    title = "Predicted vs achieved step time"
    if decisions.empty and cluster.empty:
        return empty_figure("No steps and no decisions yet.", title)
    traces = []
    if not cluster.empty:
        traces.append(go.Scatter(x=cluster["global_step"].to_numpy(), y=cluster["step_time_s"].to_numpy() * 1000,
                                 name="measured step time", mode="lines", line=dict(color="#ccc", width=1)))
    if not decisions.empty:
        for column, name, style in (
            ("predicted_step_time_s", "predicted (proposed plan)", dict(color="#2ca02c", dash="dash")),
            ("current_predicted_step_time_s", "predicted (current plan)", dict(color="#ff7f0e", dash="dot")),
            ("achieved_step_time_s", "achieved", dict(color="#1f77b4")),
        ):
            if decisions[column].notna().any():
                traces.append(go.Scatter(x=decisions["global_step"].to_numpy(), y=decisions[column].to_numpy() * 1000,
                                         name=name, mode="lines+markers", line=style, connectgaps=True))
    return _layout(go.Figure(traces), title + _bucket_note(cluster), "global step", "ms", append=True,
                   bucket_steps=cluster.attrs.get("bucket_steps", 1))


def efficiency_figure(cluster: pd.DataFrame, changes: pd.DataFrame) -> go.Figure:
    """Balance efficiency: achieved samples/s ÷ the sum of every rank's own samples/s."""
    title = "Balance efficiency (achieved ÷ ideal samples/s)"
    if cluster.empty:
        return empty_figure("No steps recorded yet.", title)
    fig = go.Figure(go.Scatter(x=cluster["global_step"].to_numpy(), y=cluster["efficiency"].to_numpy(),
                               name="efficiency", mode="lines", line=dict(color="#17becf", width=2)))
    _mark_plan_changes(fig, changes)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    return _layout(fig, title + _bucket_note(cluster), "global step", "efficiency", append=True,
                   bucket_steps=cluster.attrs.get("bucket_steps", 1))


# ---- GPU page ---------------------------------------------------------------------------

GPU_PANELS = (("gpu_util", "utilisation %", 1.0), ("gpu_mem_used_bytes", "memory used GB", 1e-9),
              ("gpu_temp_c", "temperature °C", 1.0), ("gpu_power_w", "power W", 1.0))


def gpu_figure(gpu: pd.DataFrame) -> go.Figure:
    """Utilisation, memory, temperature and power per device (rank) over the steps."""
    if gpu.empty:
        return empty_figure("No GPU metrics in this run: its workers ran on CPUs, so the GPU columns "
                            "are empty. Train on GPU nodes (--use-gpu auto) to see them here.", "GPUs", height=260)
    fig = make_subplots(rows=2, cols=2, shared_xaxes=True, subplot_titles=[label for _, label, _ in GPU_PANELS],
                        vertical_spacing=0.12)
    for index, (column, label, scale) in enumerate(GPU_PANELS):
        row, col = divmod(index, 2)
        for rank, part in gpu.groupby("rank", sort=True):
            fig.add_trace(go.Scatter(x=part["global_step"].to_numpy(), y=part[column].to_numpy() * scale,
                                     name=f"rank {rank}", legendgroup=f"rank {rank}", showlegend=index == 0,
                                     mode="lines", line=dict(color=rank_color(rank))), row=row + 1, col=col + 1)
            if column == "gpu_mem_used_bytes" and part["gpu_mem_total_bytes"].notna().any():
                fig.add_trace(go.Scatter(x=part["global_step"].to_numpy(), y=part["gpu_mem_total_bytes"].to_numpy() * scale,
                                         name=f"rank {rank} total", legendgroup=f"rank {rank}", showlegend=False,
                                         mode="lines", line=dict(color=rank_color(rank), dash="dot", width=1)),
                              row=row + 1, col=col + 1)
    return _layout(fig, "GPUs" + _bucket_note(gpu), "", "", append=True,
                   bucket_steps=gpu.attrs.get("bucket_steps", 1), height=560)


# ---- Cluster page -----------------------------------------------------------------------

def capabilities_figure(devices: pd.DataFrame) -> go.Figure:
    """Measured matmul throughput per device (fp32 and bf16, where profiled)."""
    title = "Measured device throughput"
    if devices.empty or not devices[["matmul_tflops_fp32", "matmul_tflops_bf16"]].notna().any().any():
        return empty_figure("No device profile in this run (nodes.json): node profiling writes one before "
                            "training starts.", title, height=260)
    labels = [f"{safe(h or n[:8])} {safe(k)}{'' if pd.isna(i) else int(i)}: {safe(name)}"
              for h, n, k, i, name in zip(devices["host"], devices["node_id"], devices["kind"], devices["index"], devices["name"])]
    fig = go.Figure([
        go.Bar(x=labels, y=devices[column].to_numpy(dtype=float), name=name)
        for column, name in (("matmul_tflops_fp32", "fp32 TFLOP/s"), ("matmul_tflops_bf16", "bf16 TFLOP/s"))
        if devices[column].notna().any()
    ])
    _layout(fig, title, "", "TFLOP/s")
    fig.update_layout(hovermode="closest", barmode="group")
    return fig


def rank_speed_figure(table: pd.DataFrame) -> go.Figure:
    """Each rank's own samples/s over the recent steps, one bar per rank."""
    title = "Measured samples/s per rank (recent steps)"
    if table.empty:
        return empty_figure("No steps recorded yet.", title, height=260)
    fig = go.Figure(go.Bar(x=[f"rank {r}" for r in table["rank"]], y=table["samples/s (own)"].to_numpy(dtype=float),
                           marker_color=[rank_color(r) for r in table["rank"]],
                           text=[safe(n) for n in table["node"]], hovertemplate="%{x} on %{text}: %{y:.0f} samples/s<extra></extra>"))
    _layout(fig, title, "", "samples/s", legend=False, height=260)
    fig.update_layout(hovermode="closest")
    return fig


# ---- Compare page -----------------------------------------------------------------------

def compare_series_figure(series: dict[str, pd.DataFrame], column: str, title: str, y: str,
                          percent: bool = False) -> go.Figure:
    """One line per run of ``column`` (from cluster frames) over elapsed time."""
    shown = {name: df for name, df in series.items() if not df.empty}
    if not shown:
        return empty_figure("Choose two or more runs with steps to compare.", title)
    fig = go.Figure([
        go.Scatter(x=df["elapsed_s"].to_numpy(), y=df[column].to_numpy(), name=safe(name), mode="lines",
                   line=dict(color=PALETTE[i % len(PALETTE)]))
        for i, (name, df) in enumerate(shown.items())
    ])
    if percent:
        fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    return _layout(fig, title, "elapsed s", y)


def time_to_accuracy_figure(evals_by_run: dict[str, pd.DataFrame], target: Optional[float] = None) -> go.Figure:
    """Eval metric against elapsed time per run; the dotted line is the common target."""
    title = "Time to accuracy"
    shown = {name: df for name, df in evals_by_run.items() if not df.empty and df["eval_metric"].notna().any()}
    if not shown:
        return empty_figure("No evaluations in these runs yet (measured at each epoch end).", title)
    fig = go.Figure([
        go.Scatter(x=df["elapsed_s"].to_numpy(), y=df["eval_metric"].to_numpy(), name=safe(name), mode="lines+markers",
                   line=dict(color=PALETTE[i % len(PALETTE)]))
        for i, (name, df) in enumerate(shown.items())
    ])
    if target is not None:
        fig.add_hline(y=target, line=dict(color="#999", dash="dot"), annotation_text=f"target {target:.3f}")
    metric = next(iter(shown.values()))["eval_metric_name"].dropna()
    return _layout(fig, title, "elapsed s", safe(metric.iloc[-1]) if len(metric) else "eval metric")

