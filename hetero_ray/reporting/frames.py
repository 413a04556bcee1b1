"""Pure DataFrame transforms behind the pages: the numbers each figure shows.

Everything here takes the run's tables (``steps``, ``plans``, ``epochs``, ``decisions``, the
node list) and returns small DataFrames ready to plot — aggregated per global step, per
rank, per bucket of steps. No I/O, no Ray, no plotly: tested on hand-written frames.

Vocabulary (as in the Parquet files): ``rank``, ``node_id``, ``local_batch_size``,
``busy_time_s`` (data + forward + backward up to the last gradient bucket, emulation pad
included), ``wait_time_s`` (waiting for the others in the all-reduce), ``step_time_s``.

Throughput and balance, per global step ``s`` with ranks ``i``::

    achieved_s   = Σ_i b_i / step_time_s           (cluster samples per second)
    ideal_s      = Σ_i b_i / busy_i                (each rank at its own speed, no waiting)
    efficiency_s = achieved_s / ideal_s ≤ 1        (1: nobody waits, no communication cost)

Plotted values are trailing means over ``SMOOTH_STEPS`` steps (a point depends only on
steps at or before it, so a live page can append points without redrawing old ones).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import pandas as pd

from hetero_ray.formatting import format_shares

SMOOTH_STEPS = 10  # trailing window for rates: one step alone is too noisy to read
MAX_POINTS = 1500  # points per trace sent to the browser; more cannot be seen anyway
BREAKDOWN_WINDOW_STEPS = 50  # recent steps summarised by the step-time breakdown

# The parts of a rank's step, in the order they happen (busy = data..pad; then the rest).
STEP_PARTS = ("data_time_s", "forward_time_s", "backward_time_s", "pad_time_s",
              "optimizer_time_s", "wait_time_s")
GPU_COLUMNS = ("gpu_util", "gpu_mem_used_bytes", "gpu_mem_peak_bytes", "gpu_mem_total_bytes",
               "gpu_temp_c", "gpu_power_w")


# ---- steps -----------------------------------------------------------------------------

def complete_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Drops the trailing global steps that not every rank has reported yet.

    While a run is going, ranks send their rows in batches; a step whose rows are partly
    in would show a dip in throughput that is not real.
    """
    if steps.empty:
        return steps
    last_attempt = steps["attempt"].max()
    current = steps[steps["attempt"] == last_attempt]
    newest_common = current.groupby("rank")["global_step"].max().min()
    keep = (steps["attempt"] != last_attempt) | (steps["global_step"] <= newest_common)
    return steps if bool(keep.all()) else steps[keep]


def cluster_steps(steps: pd.DataFrame, smooth_steps: int = SMOOTH_STEPS) -> pd.DataFrame:
    """One row per global step: samples, times, achieved/ideal samples/s, efficiency, loss.

    Columns: global_step, epoch, attempt, plan_version, num_ranks, samples, step_time_s,
    end_wall_time, elapsed_s, loss, samples_per_s, ideal_samples_per_s, efficiency.
    """
    columns = ["global_step", "epoch", "attempt", "plan_version", "num_ranks", "samples",
               "step_time_s", "end_wall_time", "elapsed_s", "loss", "samples_per_s",
               "ideal_samples_per_s", "efficiency"]
    if steps.empty:
        return pd.DataFrame(columns=columns)
    # Grouping with numpy (sort once, reduce over runs of equal steps): several times
    # faster than a DataFrame groupby on a million rows.
    global_step = steps["global_step"].to_numpy()
    order = np.argsort(global_step, kind="stable")
    if not np.all(order[:-1] < order[1:]):
        steps = steps.iloc[order]
        global_step = global_step[order]
    starts = np.flatnonzero(np.r_[True, global_step[1:] != global_step[:-1]])

    def col(name: str) -> np.ndarray:
        return steps[name].to_numpy(dtype=float)

    busy, batch, loss = col("busy_time_s"), col("local_batch_size"), col("loss")
    own_rate = np.divide(batch, busy, out=np.zeros_like(batch), where=busy > 0)
    has_loss = ~np.isnan(loss)
    out = pd.DataFrame({
        "global_step": global_step[starts],
        "epoch": np.maximum.reduceat(steps["epoch"].to_numpy(), starts),
        "attempt": np.maximum.reduceat(steps["attempt"].to_numpy(), starts),
        "plan_version": np.maximum.reduceat(steps["plan_version"].to_numpy(), starts),
        "num_ranks": np.diff(np.r_[starts, len(global_step)]),
        "samples": np.add.reduceat(batch, starts),
        "step_time_s": np.maximum.reduceat(col("step_time_s"), starts),
        "end_wall_time": np.maximum.reduceat(col("wall_time"), starts),
        "ideal_samples_per_s": np.add.reduceat(own_rate, starts),
        "loss_x_batch": np.add.reduceat(np.where(has_loss, loss * batch, 0.0), starts),
        "loss_batch": np.add.reduceat(np.where(has_loss, batch, 0.0), starts),
    })
    out["loss"] = np.where(out["loss_batch"] > 0, out["loss_x_batch"] / out["loss_batch"].where(out["loss_batch"] > 0, 1), np.nan)
    out["elapsed_s"] = out["end_wall_time"] - out["end_wall_time"].min() + out["step_time_s"].iloc[0]
    # Wall-clock rate over a trailing window, within one attempt (a restart is a gap, not
    # a slow step): samples of steps p-k+1..p over the time from the end of step p-k to the
    # end of step p; before k steps exist, from the attempt's first step.
    rate = np.full(len(out), np.nan)
    for _, index in out.groupby("attempt", sort=True).indices.items():
        t = out["end_wall_time"].to_numpy()[index]
        cumulative = np.cumsum(out["samples"].to_numpy()[index])
        p = np.arange(len(index))
        j = np.maximum(p - smooth_steps, 0)
        span = t[p] - t[j]
        part = np.divide(cumulative[p] - cumulative[j], span, out=np.full(len(index), np.nan), where=span > 0)
        first_time = out["step_time_s"].to_numpy()[index[0]]
        part[0] = cumulative[0] / first_time if first_time > 0 else np.nan
        rate[index] = part
    out["samples_per_s"] = rate
    achieved = out["samples"] / out["step_time_s"].where(out["step_time_s"] > 0)
    efficiency = (achieved / out["ideal_samples_per_s"].where(out["ideal_samples_per_s"] > 0)).clip(upper=1.0)
    out["efficiency"] = efficiency.rolling(smooth_steps, min_periods=1).mean()
    out["ideal_samples_per_s"] = out["ideal_samples_per_s"].rolling(smooth_steps, min_periods=1).mean()
    return out[columns]


def rank_steps(steps: pd.DataFrame, smooth_steps: int = SMOOTH_STEPS) -> pd.DataFrame:
    """One row per rank and global step, with the rank's own samples/s (trailing mean)."""
    columns = ["rank", "global_step", "node_id", "local_batch_size", "busy_time_s", "wait_time_s",
               "step_time_s", "samples_per_s", *STEP_PARTS[:-1]]
    if steps.empty:
        return pd.DataFrame(columns=columns)
    out = steps[[c for c in columns if c in steps.columns and c != "samples_per_s"]]
    global_step = out["global_step"].to_numpy()
    if not np.all(global_step[1:] >= global_step[:-1]):  # merged files are in step order already
        out = out.sort_values(["global_step", "rank"], kind="stable")
    busy = out["busy_time_s"].to_numpy(dtype=float)
    batch = out["local_batch_size"].to_numpy(dtype=float)
    own = pd.Series(np.divide(batch, busy, out=np.full_like(batch, np.nan), where=busy > 0), index=out.index)
    out = out.assign(samples_per_s=own.groupby(out["rank"]).transform(
        lambda s: s.rolling(smooth_steps, min_periods=1).mean()))
    return out[columns].reset_index(drop=True)


def bucket_width(num_steps: int, max_points: int = MAX_POINTS) -> int:
    """Steps per plotted point: a power of two, so buckets stay put while a run grows."""
    if num_steps <= max_points:
        return 1
    return 1 << math.ceil(math.log2(num_steps / max_points))


def downsample(df: pd.DataFrame, max_points: int = MAX_POINTS, by: Optional[str] = None,
               x: str = "global_step", drop_partial: bool = False,
               width: Optional[int] = None) -> pd.DataFrame:
    """Means over buckets of ``width`` consecutive steps (per ``by`` group, e.g. rank).

    Each bucket is labelled by its first step, so a bucket's point never moves. With
    ``drop_partial`` the newest bucket is left out until it is full (a live page appends
    finished points only). Non-numeric columns keep their last value.
    """
    if df.empty:
        out = df.copy()
        out.attrs["bucket_steps"] = 1
        return out
    if width is None:
        steps_per_group = df.groupby(by)[x].nunique().max() if by else df[x].nunique()
        width = bucket_width(int(steps_per_group), max_points)
    if width == 1:
        out = df.reset_index(drop=True)
        out.attrs["bucket_steps"] = 1
        return out
    keys = ([by] if by else []) + ["_bucket"]
    work = df.assign(_bucket=(df[x] // width) * width)
    numeric = [c for c in work.columns if c not in keys and c != x and pd.api.types.is_numeric_dtype(work[c])
               and not pd.api.types.is_bool_dtype(work[c])]
    other = [c for c in work.columns if c not in keys and c != x and c not in numeric]
    g = work.groupby(keys, sort=True)
    out = g[numeric].mean()
    if other:
        out = out.join(g[other].last())
    out["_count"] = g[x].nunique()
    out = out.reset_index().rename(columns={"_bucket": x})
    if drop_partial:
        newest = out.groupby(by)[x].transform("max") if by else out[x].max()
        out = out[~((out[x] == newest) & (out["_count"] < width))]
    out = out.drop(columns="_count").reset_index(drop=True)
    out.attrs["bucket_steps"] = width
    return out


def step_breakdown(steps: pd.DataFrame, window_steps: int = BREAKDOWN_WINDOW_STEPS) -> pd.DataFrame:
    """Per rank, the median of each part of its step over the last ``window_steps`` steps."""
    if steps.empty:
        return pd.DataFrame(columns=["rank", "node_id", "local_batch_size", *STEP_PARTS])
    recent = steps[steps["global_step"] > steps["global_step"].max() - window_steps]
    g = recent.groupby("rank", sort=True)
    out = g[list(STEP_PARTS)].median()
    out["local_batch_size"] = g["local_batch_size"].last()
    out["node_id"] = g["node_id"].last()
    return out.reset_index()[["rank", "node_id", "local_batch_size", *STEP_PARTS]]


def rank_table(steps: pd.DataFrame, window_steps: int = BREAKDOWN_WINDOW_STEPS) -> pd.DataFrame:
    """Per rank over the recent window: share, busy/wait ms, own samples/s (a table)."""
    if steps.empty:
        return pd.DataFrame(columns=["rank", "node", "local batch", "busy ms", "wait ms", "samples/s (own)"])
    recent = steps[steps["global_step"] > steps["global_step"].max() - window_steps]
    g = recent.groupby("rank", sort=True)
    busy = g["busy_time_s"].median()
    batch = g["local_batch_size"].median()
    return pd.DataFrame({
        "rank": busy.index,
        "node": g["node_id"].last().str.slice(0, 8).to_numpy(),
        "local batch": g["local_batch_size"].last().to_numpy(),
        "busy ms": (busy * 1000).round(1).to_numpy(),
        "wait ms": (g["wait_time_s"].median() * 1000).round(1).to_numpy(),
        "samples/s (own)": (batch / busy.where(busy > 0)).round(0).to_numpy(),
    })


# ---- plans, epochs, decisions ----------------------------------------------------------

PLAN_COLUMNS = ["plan_version", "first_global_step", "attempt", "local_batch_sizes", "reason", "check_after_steps"]


def plan_table(plans: pd.DataFrame) -> pd.DataFrame:
    """Every plan in the order it came into force; a trial's ``check_after_steps`` (blank
    for the others, and in a run recorded before the column)."""
    if plans.empty:
        return pd.DataFrame(columns=PLAN_COLUMNS)
    table = plans.reindex(columns=PLAN_COLUMNS).sort_values(["first_global_step", "plan_version"], kind="stable")
    return table.assign(check_after_steps=table["check_after_steps"].map(lambda n: "" if pd.isna(n) else int(n)))


def plan_changes(plans: pd.DataFrame) -> pd.DataFrame:
    """Plans after the first (each marks a change), with a readable split."""
    columns = ["first_global_step", "plan_version", "split", "reason"]
    if plans.empty:
        return pd.DataFrame(columns=columns)
    ordered = plans.sort_values(["first_global_step", "plan_version"]).drop_duplicates("plan_version")
    ordered = ordered.assign(split=ordered["local_batch_sizes"].map(format_shares))
    changed = ordered["split"] != ordered["split"].shift()
    return ordered[changed].iloc[1:][columns].reset_index(drop=True)


def epoch_progress(steps: pd.DataFrame, epochs: pd.DataFrame, config: dict[str, Any],
                   now: Optional[float] = None) -> dict[str, Any]:
    """Where the run stands: epoch, step, totals and an ETA from the recent rate.

    The total number of steps comes from the configuration (synthetic datasets) or from a
    finished epoch's length (file datasets, whose size the config does not state).
    """
    if steps.empty:
        return {"global_step": None}
    last = steps.loc[steps["global_step"].idxmax()]
    total_epochs = int(config.get("epochs") or 0) or None
    per_epoch = _steps_per_epoch(steps, config)
    total = per_epoch * total_epochs if per_epoch and total_epochs else None
    if total and config.get("max_steps"):
        total = min(total, int(config["max_steps"]))
    done = int(last["global_step"]) + 1
    table = cluster_steps(steps.tail(4 * SMOOTH_STEPS * max(1, steps["rank"].nunique())))
    rate = table["samples_per_s"].iloc[-1] if not table.empty else None
    batch = table["samples"].iloc[-1] if not table.empty else None
    eta_s = None
    if total and rate and rate > 0 and done < total:
        eta_s = float((total - done) * batch / rate)
    return {
        "global_step": done, "total_steps": total, "epoch": int(last["epoch"]),
        "total_epochs": total_epochs, "epochs_done": int(epochs["epoch"].nunique()) if not epochs.empty else 0,
        "fraction": min(1.0, done / total) if total else None, "samples_per_s": _num(rate), "eta_s": eta_s,
    }


def _steps_per_epoch(steps: pd.DataFrame, config: dict[str, Any]) -> Optional[int]:
    batch = config.get("global_batch_size")
    if config.get("dataset", "").startswith("synthetic") and config.get("num_samples") and batch:
        n = int(config["num_samples"])
        return n // batch if config.get("drop_last") else math.ceil(n / batch)
    finished = steps[steps["epoch"] < steps["epoch"].max()]
    if finished.empty:
        return None
    return int(finished.groupby("epoch")["step"].max().max()) + 1


def eval_points(epochs: pd.DataFrame, start_wall_time: Optional[float]) -> pd.DataFrame:
    """Eval metric and losses per epoch, with the elapsed time at which each was reached."""
    columns = ["epoch", "global_step", "train_loss", "eval_loss", "eval_metric", "eval_metric_name", "elapsed_s"]
    if epochs.empty:
        return pd.DataFrame(columns=columns)
    out = epochs.sort_values(["epoch", "global_step"]).drop_duplicates("epoch", keep="last").copy()
    start = start_wall_time if start_wall_time is not None else out["wall_time"].min()
    out["elapsed_s"] = out["wall_time"] - start
    return out[columns].reset_index(drop=True)


def decisions_frame(decisions: pd.DataFrame) -> pd.DataFrame:
    """Balancer decisions in step order, with a readable split and outcome."""
    columns = ["global_step", "policy", "adopted", "outcome", "reason", "plan_version", "split", "left_out",
               "predicted_step_time_s", "current_predicted_step_time_s", "predicted_gain",
               "achieved_step_time_s", "wall_time"]
    if decisions.empty:
        return pd.DataFrame(columns=columns)
    out = decisions.sort_values("global_step", kind="stable").copy()
    out["adopted"] = out["adopted"].fillna(False).astype(bool)
    out["outcome"] = np.where(out["adopted"], "adopted", "kept current plan")
    out["split"] = out["local_batch_sizes"].map(
        lambda sizes: format_shares(sizes) if sizes is not None and len(sizes) else "")
    # the ranks the proposal leaves out (b_i = 0), e.g. "1, 2"; tables from before the column: none
    left_out = out["left_out_ranks"] if "left_out_ranks" in out else pd.Series([None] * len(out), index=out.index)
    out["left_out"] = left_out.map(lambda ranks: ", ".join(str(int(r)) for r in ranks)
                                   if ranks is not None and len(ranks) else "")
    return out[columns].reset_index(drop=True)


# ---- nodes, devices, GPUs --------------------------------------------------------------

def nodes_frame(nodes: list[dict], steps: pd.DataFrame, live: bool, now: float,
                idle_after_s: float = 10.0) -> pd.DataFrame:
    """One row per node: profile status, CPU, devices, ranks on it, live/idle.

    A node is ``live`` when one of its ranks reported a step in the last ``idle_after_s``
    seconds of a running run; nodes that trained earlier are ``idle``.
    """
    columns = ["node_id", "host", "platform", "status", "cpu", "devices", "ranks", "state", "last_step_age_s"]
    by_node: dict[str, dict] = {}
    for node in nodes or []:
        cpu = node.get("cpu") or {}
        devices = node.get("devices") or []
        by_node[str(node.get("node_id"))] = {
            "node_id": str(node.get("node_id")),
            "host": node.get("hostname") or node.get("ip") or "",
            "platform": node.get("platform") or "",  # wsl2: a Windows machine through WSL2
            "status": node.get("status") or "ok",
            "cpu": _cpu_text(cpu),
            "devices": ", ".join(sorted({str(d.get("name") or d.get("kind")) for d in devices})),
        }
    if not steps.empty:
        g = steps.groupby("node_id")
        last_seen = g["wall_time"].max()
        ranks = g["rank"].unique()
        for node_id in last_seen.index:
            row = by_node.setdefault(str(node_id), {"node_id": str(node_id), "host": "", "status": "not profiled",
                                                    "cpu": "", "devices": ""})
            row["ranks"] = ", ".join(str(r) for r in sorted(ranks[node_id]))
            age = now - float(last_seen[node_id])
            row["last_step_age_s"] = age
            row["state"] = "live" if live and age <= idle_after_s else "idle"
    rows = [{c: row.get(c, "" if c != "last_step_age_s" else None) for c in columns} for row in by_node.values()]
    for row in rows:
        row["state"] = row["state"] or "idle"
    return pd.DataFrame(rows, columns=columns)


def devices_frame(nodes: list[dict]) -> pd.DataFrame:
    """One row per profiled device with its measured capabilities."""
    columns = ["node_id", "host", "kind", "index", "name", "matmul_tflops_fp32", "matmul_tflops_bf16",
               "memory_bandwidth_gbps", "h2d_gbps", "memory_total_gb", "alpha_s", "beta_s_per_sample",
               "fit_r2", "max_batch_size"]
    rows = []
    for node in nodes or []:
        for device in node.get("devices") or []:
            total = device.get("memory_total_bytes")
            rows.append({
                "node_id": str(node.get("node_id")), "host": node.get("hostname") or node.get("ip") or "",
                **{c: device.get(c) for c in columns if c not in ("node_id", "host", "memory_total_gb")},
                "memory_total_gb": total / 1e9 if isinstance(total, (int, float)) else None,
            })
    return pd.DataFrame(rows, columns=columns)


def gpu_frame(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step, the GPU columns that were measured (empty on CPU runs)."""
    present = [c for c in GPU_COLUMNS if c in steps.columns]
    if steps.empty or not present or steps[present].isna().all().all():
        return pd.DataFrame(columns=["rank", "global_step", "node_id", *GPU_COLUMNS])
    out = steps[["rank", "global_step", "node_id", *present]].dropna(subset=present, how="all")
    return out.sort_values(["rank", "global_step"]).reset_index(drop=True)


# ---- several runs ----------------------------------------------------------------------

def compare_table(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run: ``runs`` holds ``name``, ``config``, ``cluster`` (from
    :func:`cluster_steps`), ``evals`` (from :func:`eval_points`), ``summary``."""
    rows = []
    baseline = None
    for run in runs:
        cluster = run["cluster"]
        config = run.get("config") or {}
        steady = steady_samples_per_s(cluster)
        if baseline is None and steady:
            baseline = steady
        evals = run["evals"]
        rows.append({
            "run": run["name"], "policy": config.get("policy", ""), "workers": config.get("num_workers"),
            "global batch": config.get("global_batch_size"), "steps": int(len(cluster)),
            "steady samples/s": round(steady) if steady else None,
            "vs first": round(steady / baseline, 2) if steady and baseline else None,
            "mean efficiency": round(float(cluster["efficiency"].tail(max(1, len(cluster) // 2)).mean()), 3)
            if not cluster.empty else None,
            "final eval": _num(evals["eval_metric"].iloc[-1]) if not evals.empty else None,
            "wall s": round(float(cluster["elapsed_s"].iloc[-1]), 1) if not cluster.empty else None,
        })
    return pd.DataFrame(rows, columns=["run", "policy", "workers", "global batch", "steps", "steady samples/s",
                                       "vs first", "mean efficiency", "final eval", "wall s"])


def time_to_metric(evals_by_run: dict[str, pd.DataFrame], target: Optional[float] = None,
                   higher_is_better: bool = True) -> tuple[Optional[float], dict[str, Optional[float]]]:
    """Seconds each run took to first reach ``target`` (default: the best value every run
    reached, so each has an answer)."""
    finals = {name: df for name, df in evals_by_run.items() if not df.empty and df["eval_metric"].notna().any()}
    if not finals:
        return None, {name: None for name in evals_by_run}
    if target is None:
        bests = [df["eval_metric"].max() if higher_is_better else df["eval_metric"].min() for df in finals.values()]
        target = float(min(bests) if higher_is_better else max(bests))
    out: dict[str, Optional[float]] = {}
    for name, df in evals_by_run.items():
        if name not in finals:
            out[name] = None
            continue
        hit = df[df["eval_metric"] >= target] if higher_is_better else df[df["eval_metric"] <= target]
        out[name] = float(hit["elapsed_s"].iloc[0]) if not hit.empty else None
    return target, out


def steady_samples_per_s(cluster: pd.DataFrame) -> Optional[float]:
    """Samples/s over the second half of the steps (the figure summary.json reports)."""
    if len(cluster) < 4:
        return None
    mid = len(cluster) // 2
    span = cluster["end_wall_time"].iloc[-1] - cluster["end_wall_time"].iloc[mid - 1]
    return float(cluster["samples"].iloc[mid:].sum() / span) if span > 0 else None


def _cpu_text(cpu: dict) -> str:
    if not cpu:
        return ""
    parts = [str(cpu.get("model") or "CPU")]
    if cpu.get("physical_cores"):
        parts.append(f"{cpu['physical_cores']} cores")
    if cpu.get("ram_bytes"):
        parts.append(f"{cpu['ram_bytes'] / 2**30:.0f} GiB")
    return ", ".join(parts)


def _num(value) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value
