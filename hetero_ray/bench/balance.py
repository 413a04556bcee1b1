"""``hetero-ray bench``: the same short training under each policy, against the ideal.

For every policy the same job runs on the same workers (by default four emulated devices
at speeds 1, 1, 0.5, 0.25 of the real one). In each run, each rank's own ("solo")
throughput is measured from its busy time — compute plus emulation pad, never the time
spent waiting for the others — and the ideal is their sum:

    own_i = Σ_steps b_i / Σ_steps busy_i          ideal = Σ_i own_i
    balance efficiency = achieved samples/s / ideal

so an equal split is bounded by ``n·min_i own_i / Σ_i own_i`` (everyone runs at the
slowest rank's pace), and a perfect balancer approaches 1, minus what synchronous
training cannot avoid: the all-reduce, and each step waiting for the unluckiest rank.
Measuring in the same run means the devices are measured under the same conditions
(on a shared machine, their contention included).

Synchronous training also pays for jitter: every step waits for its slowest rank, and
a rank's busy time varies from step to step even when its mean is right. The *jitter
ceiling* is the efficiency a perfect split would reach with the run's own jitter (the
all-reduce left out): with ``x_i,s = busy_i,s / mean busy_i`` (per rank and batch size),

    jitter ceiling = 1 / mean_s max_i x_i,s

On a quiet GPU cluster it is near 1; on a small shared machine it is what caps everyone.

Where the rest of the ideal goes — three factors whose product is the efficiency, each
measured in the run (steady half; ``μ_i`` = rank i's mean busy time per step, ``B`` the
global batch, ``W`` the wall time per step):

    balance         = (B / ideal) / max_i μ_i         the split: 1 when every rank is
                                                       busy as long as the ideal step
    jitter          = max_i μ_i / mean_s max_i busy_i,s   each step waits for its
                                                       unluckiest rank
    synchronisation = mean_s max_i busy_i,s / W         the all-reduce, optimizer and
                                                       loop: time no rank is busy

Only the first is the balancer's to win; the run with identical workers
(``--homogeneous-check``) shows what the other two cost on the machine at hand.

Steps to balance: the first step from which the run's per-step efficiency (the step's
samples/s over the sum of its ranks' own samples/s in that step; rolling median over 20
steps) never falls more than 10 % below its steady value (the second half's median). A
slowdown of the whole machine slows both alike, so it does not count as imbalance.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from hetero_ray.formatting import format_table
from hetero_ray.metrics.summary import per_step

ROLLING_STEPS = 20
BALANCED_WITHIN = 0.10
FACTORS = ("balance", "jitter", "synchronisation")


@dataclass
class PolicyRun:
    policy: str
    label: str
    run_dir: str
    steps: pd.DataFrame
    summary: dict
    samples_per_s: float = 0.0
    ideal_samples_per_s: float = 0.0
    balance_efficiency: float = 0.0
    steps_to_balance: Optional[int] = None
    plan_changes: int = 0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "policy": self.policy, "label": self.label, "run_dir": self.run_dir,
            "samples_per_s": self.samples_per_s, "ideal_samples_per_s": self.ideal_samples_per_s,
            "balance_efficiency": self.balance_efficiency, "steps_to_balance": self.steps_to_balance,
            "plan_changes": self.plan_changes, "final_plan": self.summary.get("final_plan"), **self.extra,
        }


# ---------------------------------------------------------------------- pure analysis

def working_rows(steps: pd.DataFrame, since_step: int = 0) -> pd.DataFrame:
    """The records from ``since_step`` on of ranks that ran samples (an empty share times nothing)."""
    return steps[(steps["global_step"] >= since_step) & (steps["local_batch_size"] > 0)]


def cluster_throughput(steps: pd.DataFrame) -> pd.Series:
    """Samples/s of each global step, from the wall clock between step ends."""
    table = per_step(steps)
    seconds = table["end_wall_time"].diff()
    return pd.Series((table["samples"] / seconds).to_numpy(), index=table["global_step"]).iloc[1:]


def steady_samples_per_s(steps: pd.DataFrame, since_step: int = 0) -> float:
    """Cluster samples/s over the second half of the steps from ``since_step`` on."""
    table = per_step(steps[steps["global_step"] >= since_step])
    half = table.iloc[len(table) // 2 - 1:]
    span = half["end_wall_time"].iloc[-1] - half["end_wall_time"].iloc[0]
    return float(half["samples"].iloc[1:].sum() / span) if span > 0 else float("nan")


def step_efficiency(steps: pd.DataFrame) -> pd.Series:
    """Per global step: its samples/s over the sum of its ranks' own samples/s (b_i / busy_i)."""
    rows = working_rows(steps)
    own = (rows["local_batch_size"] / rows["busy_time_s"]).groupby(rows["global_step"]).sum()
    throughput = cluster_throughput(steps)
    return (throughput / own.reindex(throughput.index)).dropna()


def steps_to_balance(steps: pd.DataFrame) -> Optional[int]:
    """First step from which the rolling step efficiency never falls 10 % below its steady value."""
    efficiency = step_efficiency(steps)
    rolling = efficiency.rolling(ROLLING_STEPS, min_periods=ROLLING_STEPS).median().dropna()
    if rolling.empty:
        return None
    steady = float(efficiency.iloc[len(efficiency) // 2:].median())
    off = rolling < (1 - BALANCED_WITHIN) * steady
    if not off.any():
        return int(rolling.index[0]) if len(rolling) else None
    last_off = off[off].index.max()
    later = rolling.index[rolling.index > last_off]
    return int(later[0]) if len(later) else None


def own_throughputs(steps: pd.DataFrame, since_step: int) -> pd.Series:
    """Each rank's own samples/s over the steps from ``since_step`` on: Σ b / Σ busy."""
    rows = working_rows(steps, since_step)
    sums = rows.groupby("rank")[["local_batch_size", "busy_time_s"]].sum()
    return sums["local_batch_size"] / sums["busy_time_s"]


def jitter_ceiling(steps: pd.DataFrame, since_step: int) -> float:
    """The efficiency a perfect split would reach given each rank's step-to-step jitter."""
    rows = working_rows(steps, since_step)
    if rows.empty:
        return float("nan")
    mean_busy = rows.groupby(["rank", "local_batch_size"])["busy_time_s"].transform("mean")
    relative = rows["busy_time_s"] / mean_busy  # x_i,s: 1 is this rank's usual pace
    return float(1.0 / relative.groupby(rows["global_step"]).max().mean())


def efficiency_factors(steps: pd.DataFrame, since_step: int, samples_per_s: float,
                       ideal_samples_per_s: float) -> dict[str, float]:
    """``balance × jitter × synchronisation = samples_per_s / ideal`` (module docstring)."""
    rows = working_rows(steps, since_step)
    by_step = rows.groupby("global_step")
    batch = float(by_step["local_batch_size"].sum().mean())
    ideal_step_s = batch / ideal_samples_per_s
    slowest_mean_busy_s = float(rows.groupby("rank")["busy_time_s"].mean().max())
    mean_max_busy_s = float(by_step["busy_time_s"].max().mean())
    wall_step_s = batch / samples_per_s
    return {"balance": ideal_step_s / slowest_mean_busy_s,
            "jitter": slowest_mean_busy_s / mean_max_busy_s,
            "synchronisation": mean_max_busy_s / wall_step_s}


def steady_start(steps: pd.DataFrame) -> int:
    """The first step of the second half (where steady figures are taken)."""
    table = per_step(steps)
    return int(table["global_step"].iloc[len(table) // 2])


# ---------------------------------------------------------------------- running

def _run(args, output_dir: str, label: str, policy: str, emulate_speeds, speed_changes=None) -> PolicyRun:
    from hetero_ray.config import TrainConfig
    from hetero_ray.metrics import run_files
    from hetero_ray.runtime.driver import run_training

    config = TrainConfig(
        model=args.model, dataset="synthetic_image", num_samples=args.batch_size * (args.steps + 1),
        batch_size=args.batch_size, epochs=1, max_steps=args.steps, num_workers=args.num_workers,
        policy=policy, emulate_speeds=emulate_speeds, rebalance_interval=args.rebalance_interval,
        checkpoint_every=10 * args.steps, output_dir=output_dir, experiment_name=label,
        address=args.address, max_failures=0,
    )
    started = time.monotonic()
    result = run_training(config, speed_changes=speed_changes, emit=lambda line: None)
    steps = run_files.read_table(result.run_dir, "steps")
    print(f"[bench] {label}: {result.summary['steady_samples_per_s']:.0f} samples/s, "
          f"final plan {result.summary['final_plan']} ({time.monotonic() - started:.0f} s)", flush=True)
    return PolicyRun(policy, label, result.run_dir, steps, result.summary,
                     plan_changes=result.summary["plan_changes"])


def run_bench(args) -> dict:
    import ray

    from hetero_ray.runtime.cluster import connect

    connection = connect(args.address, local_num_cpus=max(os.cpu_count() or 1, args.num_workers), timeout_s=30)
    output_dir = os.path.abspath(args.output_dir or os.path.join("runs", time.strftime("bench-%Y%m%d-%H%M%S")))
    os.makedirs(output_dir, exist_ok=True)
    speeds = args.emulate_speeds
    runs = [_run(args, output_dir, policy, policy, speeds) for policy in args.policies]
    for run in runs:
        analyse(run)
    result = {
        "scenario": {"model": args.model, "global_batch_size": args.batch_size, "num_workers": args.num_workers,
                     "emulate_speeds": speeds, "steps": args.steps, "rebalance_interval": args.rebalance_interval},
        "runs": [r.to_dict() for r in runs],
    }
    if args.speed_change:
        result["adaptation"] = _adaptation(args, output_dir, speeds)
    if args.plain_anchor:
        result["plain_ray_train"] = _plain_anchor(args, output_dir)
    if args.homogeneous_check:
        homogeneous = _run(args, output_dir, "optimal-homogeneous", "optimal", None)
        analyse(homogeneous)
        result["homogeneous"] = {"plan_changes": homogeneous.plan_changes,
                                 "final_plan": homogeneous.summary["final_plan"],
                                 "balance_efficiency": homogeneous.balance_efficiency,
                                 "jitter_ceiling": homogeneous.extra["jitter_ceiling"],
                                 "efficiency_factors": homogeneous.extra["efficiency_factors"],
                                 "run_dir": homogeneous.run_dir}
    if connection.started_local:  # a Ray this process joined (a cluster, a test session) stays up
        ray.shutdown()
    result["replay"] = _replay(args, runs, extra_traces=[homogeneous.steps] if args.homogeneous_check else [])
    result["report"] = _write_report(output_dir, runs, result)
    return result


def _plain_anchor(args, output_dir: str) -> dict:
    """Plain Ray Train on the same workers, model and global batch (equal shares), in this
    run: the anchor for the policies' "× plain Ray Train". Its steady rate is taken as the
    policies' is: the second half of the steps, by wall time. Emulated speeds are not
    applied to it (it has no emulator), so the anchor is only meaningful on real devices."""
    from hetero_ray.bench.overhead import steady_rate
    from hetero_ray.bench.plain_ray_train import run_plain

    started = time.monotonic()
    ends = run_plain(args.model, "synthetic_image", args.batch_size * (args.steps + 1), args.batch_size,
                     args.steps, args.num_workers, lr=0.01, seed=0,
                     result_path=os.path.join(output_dir, "plain-ray-train.json"))
    rate = steady_rate(ends, args.batch_size)
    print(f"[bench] plain Ray Train: {rate:.0f} samples/s ({time.monotonic() - started:.0f} s)", flush=True)
    return {"samples_per_s": rate}


def analyse(run: PolicyRun) -> None:
    """Fills a run's figures from its step records (see the module docstring)."""
    since = steady_start(run.steps)
    own = own_throughputs(run.steps, since)
    run.samples_per_s = steady_samples_per_s(run.steps)
    run.ideal_samples_per_s = float(own.sum())
    run.balance_efficiency = run.samples_per_s / run.ideal_samples_per_s
    run.steps_to_balance = steps_to_balance(run.steps)
    run.extra["own_samples_per_s"] = [float(v) for v in own.to_numpy()]
    run.extra["equal_split_efficiency_bound"] = float(len(own) * own.min() / own.sum())
    run.extra["jitter_ceiling"] = jitter_ceiling(run.steps, since)
    run.extra["efficiency_factors"] = efficiency_factors(run.steps, since, run.samples_per_s,
                                                         run.ideal_samples_per_s)


def _replay(args, runs: list[PolicyRun], extra_traces: list[pd.DataFrame]) -> Optional[dict]:
    """The split alone: the policies on these runs' noise, against the best fixed split."""
    from hetero_ray.bench.replay import replay

    if args.num_workers < 2 or not runs:
        return None
    result = replay([r.steps for r in runs], [r.steps for r in runs] + extra_traces,
                    args.batch_size, args.rebalance_interval)
    return result.to_dict() if result.num_traces else None


def _adaptation(args, output_dir: str, speeds) -> dict:
    """Optimal with a rank slowing down mid-run: how fast throughput returns to the new ideal."""
    change = args.speed_change
    run = _run(args, output_dir, "optimal-speed-change", "optimal", speeds, speed_changes=[change])
    step = change["global_step"]
    # The new ideal: the ranks' own throughput after the change has settled (last third).
    settled = int(step + (run.steps["global_step"].max() - step) * 2 / 3)
    new_ideal = float(own_throughputs(run.steps, settled).sum())
    throughput = cluster_throughput(run.steps)
    intervals = []
    for k in range(1, 7):
        lo, hi = step + (k - 1) * args.rebalance_interval, step + k * args.rebalance_interval
        window = throughput[(throughput.index > lo) & (throughput.index <= hi)]
        if len(window):
            intervals.append({"interval": k, "samples_per_s": float(window.median()),
                              "of_new_ideal": float(window.median() / new_ideal)})
    after = steady_samples_per_s(run.steps, since_step=step)
    recovered = next((i["interval"] for i in intervals if i["samples_per_s"] >= 0.9 * after), None)
    before = steady_samples_per_s(run.steps[run.steps["global_step"] < step])
    return {"speed_change": change, "new_ideal_samples_per_s": new_ideal, "before_change_samples_per_s": before,
            "steady_after_change_samples_per_s": after, "steady_after_of_new_ideal": after / new_ideal,
            "jitter_ceiling_after_change": jitter_ceiling(run.steps, settled),
            "intervals": intervals, "intervals_to_within_10pct_of_steady": recovered,
            "plan_changes": run.plan_changes, "run_dir": run.run_dir}


def _write_report(output_dir: str, runs: list[PolicyRun], result: dict) -> str:
    """bench.html: throughput over steps per policy and efficiency per policy (self-contained)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=3, column_widths=[0.5, 0.2, 0.3],
                           subplot_titles=("cluster samples/s (rolling median)", "balance efficiency",
                                           "efficiency = balance × jitter × synchronisation"))
    for run in runs:
        series = cluster_throughput(run.steps).rolling(ROLLING_STEPS, min_periods=1).median()
        figure.add_trace(go.Scatter(x=series.index, y=series.to_numpy(), mode="lines", name=run.label), 1, 1)
    figure.add_trace(go.Bar(x=[r.label for r in runs], y=[r.balance_efficiency for r in runs],
                            showlegend=False, text=[f"{r.balance_efficiency:.2f}" for r in runs]), 1, 2)
    figure.update_xaxes(title_text="global step", row=1, col=1)
    for factor in FACTORS:
        figure.add_trace(go.Bar(x=[r.label for r in runs], y=[r.extra["efficiency_factors"][factor] for r in runs],
                                name=factor, text=[f"{r.extra['efficiency_factors'][factor]:.2f}" for r in runs]),
                         1, 3)
    figure.update_yaxes(range=[0, 1.05], row=1, col=2)
    figure.update_yaxes(range=[0, 1.05], row=1, col=3)
    figure.update_layout(title="hetero_ray bench: policies against the ideal", height=460)
    path = os.path.join(output_dir, "bench.html")
    figure.write_html(path, include_plotlyjs=True)
    return path


def print_result(result: dict) -> None:
    s = result["scenario"]
    print()
    print(f"scenario: {s['model']}, global batch {s['global_batch_size']}, {s['num_workers']} workers, "
          f"emulated speeds {s['emulate_speeds']}, {s['steps']} steps, rebalance every {s['rebalance_interval']}")
    static = next((r for r in result["runs"] if r["policy"] == "static"), None)
    rows = []
    for r in result["runs"]:
        ratio = f"{r['samples_per_s'] / static['samples_per_s']:.2f}" if static else "-"
        rows.append([r["label"], f"{r['samples_per_s']:.0f}", ratio, f"{r['ideal_samples_per_s']:.0f}",
                     f"{r['balance_efficiency']:.3f}", f"{r['equal_split_efficiency_bound']:.2f}",
                     "-" if r["steps_to_balance"] is None else r["steps_to_balance"], r["plan_changes"],
                     "/".join(map(str, r["final_plan"] or [])),
                     "/".join(f"{v:.0f}" for v in r["own_samples_per_s"])])
    print(format_table(["policy", "samples/s", "× static", "ideal", "efficiency", "n·min/Σ",
                        "steps to balance",
                        "plan changes", "final plan", "own samples/s per rank"], rows))
    if "plain_ray_train" in result:
        plain = result["plain_ray_train"]["samples_per_s"]
        print(f"plain Ray Train (TorchTrainer, equal shares, measured in this run): {plain:.0f} samples/s; "
              + ", ".join(f"{r['label']} ÷ plain Ray Train {r['samples_per_s'] / plain:.2f}" for r in result["runs"]))
    _print_factors(result)
    if "adaptation" in result:
        a = result["adaptation"]
        c = a["speed_change"]
        print()
        print(f"adaptation: rank {c['rank']} to speed {c['speed']} at step {c['global_step']}: "
              f"{a['before_change_samples_per_s']:.0f} samples/s before; after: steady "
              f"{a['steady_after_change_samples_per_s']:.0f}, new ideal {a['new_ideal_samples_per_s']:.0f} "
              f"({a['steady_after_of_new_ideal']:.2f} of it; jitter ceiling {a['jitter_ceiling_after_change']:.2f})")
        print(format_table(["interval after change", "samples/s", "of new ideal"],
                           [[i["interval"], f"{i['samples_per_s']:.0f}", f"{i['of_new_ideal']:.2f}"]
                            for i in a["intervals"]]))
        print(f"back within 10 % of its steady throughput after {a['intervals_to_within_10pct_of_steady']} "
              "rebalance interval(s)")
    if "homogeneous" in result:
        h = result["homogeneous"]
        print(f"\nhomogeneous workers (no emulation), optimal: {h['plan_changes']} plan change(s), final plan "
              f"{'/'.join(map(str, h['final_plan'] or []))}, efficiency {h['balance_efficiency']:.3f}")
    if result.get("replay"):
        r = result["replay"]
        print(f"\nthe split alone, replayed: each policy from equal shares on simulated devices with these runs' "
              f"mean speeds and their recorded step-to-step noise ({r['num_traces']} traces, {r['num_steps']} "
              "steps, each rotated over the ranks); split efficiency = mean step time of the best fixed split "
              "for that noise / the policy's, from the second rebalance point on")
        print(format_table(["policy", "split efficiency", "worst 10 %", "plan changes (mean / max)"],
                           [[p["policy"], f"{p['split_efficiency']:.3f}", f"{p['split_efficiency_p10']:.3f}",
                             f"{p['plan_changes_mean']:.1f} / {p['plan_changes_max']}"] for p in r["policies"]]))
    print(f"\nplots: {result['report']}")


def _print_factors(result: dict) -> None:
    """Where the rest of the ideal went, per run: efficiency = balance × jitter × sync."""
    runs = [(r["label"], r) for r in result["runs"]]
    if "homogeneous" in result:
        runs.append(("identical workers (optimal)", result["homogeneous"]))
    rows = [[label, f"{r['balance_efficiency']:.3f}",
             *(f"{r['efficiency_factors'][k]:.3f}" for k in FACTORS), f"{r['jitter_ceiling']:.3f}"]
            for label, r in runs]
    print("\nwhere the rest went: efficiency = balance (the split: the balancer's part) × jitter (each step "
          "waits for its unluckiest rank) × synchronisation (all-reduce, optimizer, loop)")
    print(format_table(["policy", "efficiency", "balance", "jitter", "synchronisation", "jitter ceiling"], rows))
