"""Why a run is as fast as it is: one verdict per rank over a window of step records.

Pure: a DataFrame of step rows (columns of :data:`hetero_ray.runs.records.STEPS`) in,
:class:`Verdict` objects out; no Ray, no torch. Every verdict carries the numbers behind
it and a recommendation a person can act on. Per rank ``i``, over the window (medians):
``b_i`` local batch, ``busy_i`` busy time, ``c_i = busy_i / b_i``, ``data_i`` data wait,
``wait_i = step − busy − optimiser``, and per step ``comm = min_i wait_i`` (the slowest
rank waits for nobody, so what it still waits is communication). The first verdict that
matches wins, in the order of :data:`PRIORITY`, else ``balanced``; the others it matched
are in ``evidence["also"]``. A straggler's recommended share is the equal-finish one,
``b_i* = B · (1/c_i) / Σ_j (1/c_j)``. Thresholds: :class:`BottleneckThresholds`.
Each verdict's rule and why: docs/dashboard.md#the-bottleneck-verdicts
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pandas as pd

from hetero_ray.runs.records import DATA_LOADER_SOURCE, RAY_DATA_SOURCE_PREFIX

INPUT_BOUND = "input-bound"
STRAGGLER = "straggler"
COMMUNICATION_BOUND = "communication-bound"
MEMORY_BOUND = "memory-bound"
UNDER_UTILISED_GPU = "under-utilised-gpu"
BALANCED = "balanced"
LEFT_OUT = "left-out"
VERDICTS = (LEFT_OUT, INPUT_BOUND, STRAGGLER, COMMUNICATION_BOUND, MEMORY_BOUND, UNDER_UTILISED_GPU, BALANCED)
PRIORITY = (LEFT_OUT, INPUT_BOUND, STRAGGLER, MEMORY_BOUND, COMMUNICATION_BOUND, UNDER_UTILISED_GPU)


@dataclass(frozen=True)
class BottleneckThresholds:
    """When a verdict triggers; defaults carry their reason."""

    window_steps: int = 50  # the last 50 global steps: recent enough to follow a plan change
    min_steps: int = 5  # fewer steps per rank: medians mean little, no verdict but "balanced"
    input_share: float = 0.30  # data wait ≥ 30 % of busy time: the input pipeline limits the rank
    straggler_ratio: float = 1.15  # busy ≥ 1.15× the others' median: beyond step-to-step noise
    wait_share: float = 0.10  # … and the others wait ≥ 10 % of their step for it
    comm_share: float = 0.30  # ≥ 30 % of the step spent communicating after the slowest rank
    memory_fraction: float = 0.90  # ≥ 90 % of device memory (or of the measured cap)
    low_gpu_util: float = 50.0  # percent: the GPU idles half of the time

    def __post_init__(self):
        for name in ("window_steps", "min_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"bottlenecks.{name} must be a positive integer, got {value!r}")
        for name in ("input_share", "wait_share", "comm_share", "memory_fraction"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < 1):
                raise ValueError(f"bottlenecks.{name} must be in (0, 1), got {value!r}")
        if not (isinstance(self.straggler_ratio, (int, float)) and self.straggler_ratio > 1):
            raise ValueError(f"bottlenecks.straggler_ratio must be > 1, got {self.straggler_ratio!r}")
        if not (isinstance(self.low_gpu_util, (int, float)) and 0 < self.low_gpu_util <= 100):
            raise ValueError(f"bottlenecks.low_gpu_util must be in (0, 100] (percent), got {self.low_gpu_util!r}")


@dataclass(frozen=True)
class Verdict:
    rank: int
    node_id: str
    verdict: str  # one of VERDICTS
    evidence: dict[str, Any] = field(default_factory=dict)
    recommendation: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "node_id": self.node_id, "verdict": self.verdict,
                "evidence": _json_safe(self.evidence), "recommendation": self.recommendation}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        return cls(int(d["rank"]), str(d["node_id"]), d["verdict"], dict(d.get("evidence") or {}),
                   d.get("recommendation", ""))


def classify(steps: pd.DataFrame, memory_caps: Optional[dict[int, int]] = None,
             thresholds: BottleneckThresholds = BottleneckThresholds()) -> list[Verdict]:
    """One verdict per rank over the last ``thresholds.window_steps`` global steps.

    Args:
        steps: step rows; GPU columns may be missing or all NaN (CPU ranks). Rows of older
            attempts (before a restart) in the window are ignored.
        memory_caps: per-rank largest local batch that fits (from profiling), if known.

    Returns:
        Verdicts ordered by rank; empty for an empty frame.
    """
    window = latest_window(steps, thresholds.window_steps)
    if window.empty:
        return []
    stats = _rank_stats(window)
    step_s = float(window.groupby("global_step")["step_time_s"].max().median())
    comm_s = float(window.groupby("global_step")["wait_time_s"].min().median())
    comm_share = comm_s / step_s if step_s > 0 else math.nan
    out = stats["local_batch_size"] == 0
    evidence = _evidence(stats, out, step_s, comm_share, memory_caps or {})
    ranks_in = int((~out).sum())
    matched = {rank: _matched(stats.loc[rank], out.loc[rank], ranks_in - (not out.loc[rank]), e, thresholds)
               for rank, e in evidence.items()}
    if not any(STRAGGLER in hits for hits in matched.values()) and comm_share >= thresholds.comm_share:
        for rank in matched:
            if stats.loc[rank, "steps"] >= thresholds.min_steps and not out.loc[rank]:
                matched[rank].append(COMMUNICATION_BOUND)

    verdicts = []
    stragglers = [int(r) for r, hits in matched.items() if STRAGGLER in hits]
    for rank, hits in matched.items():
        ordered = [v for v in PRIORITY if v in hits]
        verdict = ordered[0] if ordered else BALANCED
        e = evidence[rank]
        e["also"] = ordered[1:]
        verdicts.append(Verdict(int(rank), str(stats.loc[rank, "node_id"]), verdict, e,
                                _recommend(int(rank), verdict, e, thresholds, stragglers)))
    return verdicts


def _evidence(stats: pd.DataFrame, out: pd.Series, step_s: float, comm_share: float,
              caps: dict[int, int]) -> dict[int, dict]:
    """Per rank, the figures its verdict rests on, each against the other ranks in."""
    global_batch = float(stats["local_batch_size"].sum())
    inverse_cost = 1.0 / stats["per_sample_s"].where(~out)  # over the ranks in
    fair_share = (global_batch * inverse_cost / inverse_cost.sum()).fillna(0.0)  # b_i* = B·(1/c_i)/Σ(1/c_j)
    evidence = {}
    for rank, row in stats.iterrows():
        others = stats[~out].drop(index=rank, errors="ignore")
        busy_others = float(others["busy_time_s"].median()) if len(others) else math.nan
        cost_others = float(others["per_sample_s"].median()) if len(others) else math.nan
        cap = caps.get(int(rank))
        evidence[rank] = {
            "steps": int(row["steps"]),
            "local_batch_size": float(row["local_batch_size"]),
            "busy_time_s": float(row["busy_time_s"]),
            "per_sample_s": float(row["per_sample_s"]),
            "data_share": float(row["data_share"]),
            "wait_share": float(row["wait_share"]),
            "step_time_s": step_s,
            "busy_ratio": _ratio(row["busy_time_s"], busy_others),
            "per_sample_ratio": _ratio(row["per_sample_s"], cost_others),
            "others_wait_share": float(others["wait_share"].median()) if len(others) else math.nan,
            "comm_share": comm_share,
            "fair_local_batch_size": float(fair_share.loc[rank]),
            "gpu_util": float(row["gpu_util"]),
            "memory_fraction": _nan_max([row["gpu_mem_peak_fraction"],
                                         row["local_batch_size"] / cap if cap else math.nan]),
            "memory_cap": cap,
            "probe_batch_size": float(row["probe_batch_size"]),
            "data_source": row["data_source"],
        }
    return evidence


def _matched(row: pd.Series, is_out: bool, others_in: int, e: dict, thresholds: BottleneckThresholds) -> list[str]:
    """Every verdict whose threshold a rank crosses (the first by priority is its verdict);
    ``others_in``: how many other ranks are in."""
    hits = [LEFT_OUT] if is_out else []
    if row["steps"] < thresholds.min_steps or is_out:
        return hits
    if e["data_share"] >= thresholds.input_share:
        hits.append(INPUT_BOUND)
    if others_in and e["busy_ratio"] >= thresholds.straggler_ratio and e["others_wait_share"] >= thresholds.wait_share:
        hits.append(STRAGGLER)
    if e["memory_fraction"] >= thresholds.memory_fraction:
        hits.append(MEMORY_BOUND)
    if row["gpu_util"] < thresholds.low_gpu_util:
        hits.append(UNDER_UTILISED_GPU)
    return hits


def verdicts_table(verdicts: list[Verdict]) -> pd.DataFrame:
    """One row per rank, the numbers in display units, for the dashboard and the CLI."""
    columns = ["rank", "node_id", "verdict", "local_batch_size", "busy_ms", "per_sample_ms", "data_pct",
               "wait_pct", "gpu_util_pct", "memory_pct", "recommendation"]
    rows = []
    for v in verdicts:
        e = v.evidence
        rows.append({
            "rank": v.rank, "node_id": v.node_id, "verdict": v.verdict,
            "local_batch_size": e.get("local_batch_size"),
            "busy_ms": _scaled(e.get("busy_time_s"), 1e3),
            "per_sample_ms": _scaled(e.get("per_sample_s"), 1e3),
            "data_pct": _scaled(e.get("data_share"), 100),
            "wait_pct": _scaled(e.get("wait_share"), 100),
            "gpu_util_pct": e.get("gpu_util"),
            "memory_pct": _scaled(e.get("memory_fraction"), 100),
            "recommendation": v.recommendation,
        })
    return pd.DataFrame(rows, columns=columns)


def format_verdicts(verdicts: list[Verdict]) -> str:
    """The CLI summary's bottleneck section: a table, then one recommendation per rank."""
    from hetero_ray.formatting import format_table

    if not verdicts:
        return "bottlenecks: no step records to judge"
    table = verdicts_table(verdicts)
    rows = [[r.rank, str(r.node_id)[:8], r.verdict, _fmt(r.local_batch_size, ".0f"), _fmt(r.busy_ms, ".1f"),
             _fmt(r.per_sample_ms, ".3f"), _fmt(r.data_pct, ".0f"), _fmt(r.wait_pct, ".0f"),
             _fmt(r.gpu_util_pct, ".0f"), _fmt(r.memory_pct, ".0f")] for r in table.itertuples()]
    lines = ["bottlenecks (last steps, per rank):",
             format_table(["rank", "node", "verdict", "batch", "busy ms", "ms/sample", "data %", "wait %",
                           "GPU %", "mem %"], rows)]
    lines += [f"  rank {v.rank}: {v.recommendation}" for v in verdicts]
    return "\n".join(lines)


def latest_window(steps: pd.DataFrame, window_steps: int) -> pd.DataFrame:
    """The latest attempt's rows of its last ``window_steps`` global steps (empty frame if none)."""
    if steps is None or steps.empty:
        return pd.DataFrame()
    frame = steps
    if "attempt" in frame.columns and frame["attempt"].notna().any():
        frame = frame[frame["attempt"] == frame["attempt"].max()]
    last = frame["global_step"].max()
    return frame[frame["global_step"] > last - window_steps]


def _rank_stats(window: pd.DataFrame) -> pd.DataFrame:
    frame = window.copy()
    for column in ("data_time_s", "wait_time_s", "optimizer_time_s", "gpu_util", "gpu_mem_peak_bytes",
                   "gpu_mem_total_bytes"):
        if column not in frame.columns:
            frame[column] = np.nan
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    if "node_id" not in frame.columns:
        frame["node_id"] = ""
    if "probe_batch_size" not in frame.columns:
        frame["probe_batch_size"] = 0
    frame["probe_batch_size"] = pd.to_numeric(frame["probe_batch_size"], errors="coerce").fillna(0)
    busy = frame["busy_time_s"].astype(float)
    # A rank left out ran its probe: its per-sample cost is the probe's.
    samples = frame["local_batch_size"].where(frame["local_batch_size"] > 0, frame["probe_batch_size"])
    frame["per_sample_s"] = busy / samples.clip(lower=1).astype(float)
    frame["data_share"] = frame["data_time_s"] / busy.where(busy > 0)
    step = frame["step_time_s"].astype(float)
    frame["wait_share"] = frame["wait_time_s"] / step.where(step > 0)
    frame["gpu_mem_peak_fraction"] = frame["gpu_mem_peak_bytes"] / frame["gpu_mem_total_bytes"].where(
        frame["gpu_mem_total_bytes"] > 0)
    grouped = frame.groupby("rank", sort=True)
    stats = grouped[["local_batch_size", "busy_time_s", "per_sample_s", "data_share", "wait_share",
                     "gpu_util", "gpu_mem_peak_fraction", "probe_batch_size"]].median()
    stats["steps"] = grouped.size()
    stats["node_id"] = grouped["node_id"].last()
    if "data_source" not in frame.columns:  # runs before the column
        frame["data_source"] = None
    stats["data_source"] = grouped["data_source"].agg(_last_given)
    return stats


def _last_given(values: pd.Series) -> Optional[str]:
    given = values[values.map(lambda v: isinstance(v, str))]
    return str(given.iloc[-1]) if len(given) else None


def _recommend(rank: int, verdict: str, e: dict, t: BottleneckThresholds, stragglers: list[int]) -> str:
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    pct = lambda x: f"{x * 100:.0f} %"  # noqa: E731
    if verdict == LEFT_OUT:
        probe = (f"; its probes of {e['probe_batch_size']:.0f} samples ({ms(e['per_sample_s'])}/sample) keep its speed "
                 "known" if e["probe_batch_size"] > 0 else "")
        source = e.get("data_source")
        if isinstance(source, str) and source.startswith(RAY_DATA_SOURCE_PREFIX):
            # on Ray Data a rank may also be out to feed the pipeline (planning/feed_trial.py)
            return ("left out of the plan: either its all-reduce costs more than its compute adds, or it was "
                    "measured faster feeding the Ray Data pipeline than training (decisions.parquet says which, "
                    f"with the predictions or the two measured rates){probe}")
        return ("left out of the plan: the planner predicted the step faster without it, its all-reduce costing "
                f"more than its compute adds (decisions.parquet has both predictions){probe}; it is brought back "
                "when it pays")
    if e["steps"] < t.min_steps:
        return f"only {e['steps']} step(s) in the window (fewer than {t.min_steps}): too few to judge"
    if verdict == INPUT_BOUND:
        waits = f"waits for its data {pct(e['data_share'])} of its busy time ({ms(e['data_share'] * e['busy_time_s'])}"
        source = e.get("data_source")
        if isinstance(source, str) and source.startswith(RAY_DATA_SOURCE_PREFIX):
            return (f"{waits} per step), read from the Ray Data pipeline of dataset "
                    f"{source[len(RAY_DATA_SOURCE_PREFIX):]!r}, which does not keep up: give it more CPUs (its "
                    "map_batches run on the cluster's free CPUs: add CPU-only nodes, let a CPU-only rank feed it "
                    "instead of training — HeteroConfig.feed_trial measures which is faster — or raise the "
                    "transform's concurrency); moving share away would only hide it")
        loader = "add data-loader workers or prefetching, or give the worker more CPUs (--cpus-per-worker)"
        if source == DATA_LOADER_SOURCE:
            return f"{waits} per step), read by its DataLoader: {loader}; moving share away would only hide it"
        return (f"{waits} per step): {loader}; reading Ray Data, give its pipeline more CPUs (its map_batches run "
                "on the cluster's free CPUs: add CPU-only nodes, or raise the transform's concurrency); moving share "
                "away would only hide it")
    if verdict == STRAGGLER:
        move = e["local_batch_size"] - e["fair_local_batch_size"]
        why = (f"its per-sample cost is {e['per_sample_ratio']:.2f}× the others' ({ms(e['per_sample_s'])}/sample)"
               if e["per_sample_ratio"] >= t.straggler_ratio else
               f"its per-sample cost is like the others' ({e['per_sample_ratio']:.2f}×), so its share is too large")
        return (f"busy {e['busy_ratio']:.2f}× the others' median while they wait {pct(e['others_wait_share'])} "
                f"of each step; {why}: move ~{max(1, round(move))} of its {e['local_batch_size']:.0f} samples to "
                f"faster ranks (equal-finish share {e['fair_local_batch_size']:.0f}); the adaptive policies "
                "(--policy optimal, the default, or dynamic) do this while training runs")
    if verdict == MEMORY_BOUND:
        cap = f" (cap {e['memory_cap']})" if e.get("memory_cap") else ""
        return (f"uses {pct(e['memory_fraction'])} of its memory{cap}: it cannot take a larger share; "
                "keep its share, or raise the cap with mixed precision or activation checkpointing")
    if verdict == COMMUNICATION_BOUND:
        return (f"communication takes {pct(e['comm_share'])} of each step after the slowest rank is done: "
                "raise the global batch (more compute per all-reduce) or use a faster interconnect "
                "(nccl on GPUs, fewer nodes per job)")
    if verdict == UNDER_UTILISED_GPU:
        return (f"its GPU is busy only {e['gpu_util']:.0f} % of the time: raise the global batch or this "
                "rank's share, and check host→device copies (h2d_time_s)")
    if stragglers and rank not in stragglers and e["wait_share"] >= t.wait_share:
        return (f"waits {pct(e['wait_share'])} of each step for rank(s) {', '.join(map(str, stragglers))}; "
                "it gets more share when theirs is moved")
    return "nothing limits this rank more than the others; keep the plan"


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b and b > 0 and math.isfinite(b) else math.nan


def _nan_max(values: list[float]) -> float:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return max(finite) if finite else math.nan


def _scaled(value, factor: float):
    if value is None or not math.isfinite(float(value)):
        return None
    return float(value) * factor


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _json_safe(value):
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
