"""The figures of the policies' benchmark (:mod:`benchmarks.balance`), from a run's step records (pure: no Ray, no I/O).

In each policy's run, each rank's own ("solo") throughput is measured from its busy
time — compute plus emulation pad, never the time spent waiting for the others — and the
ideal is their sum:

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

from dataclasses import dataclass, field
from typing import Optional

import pandas as pd

from hetero_ray.metrics.summary import per_step

ROLLING_STEPS = 20
BALANCED_WITHIN = 0.10
FACTORS = ("balance", "jitter", "synchronisation")
COLD_START_OF_FINAL = 0.95  # a cold start has arrived at this fraction of its final efficiency


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


def cold_start_figures(cold: pd.DataFrame, profiled: pd.DataFrame, rebalance_interval: int) -> dict:
    """A run started from equal shares against one started from the profiled plan: its
    steady samples/s and their ratio, and when its step efficiency (median of the last
    half interval) first reached 0.95 of its final value (the second half's median) — in
    steps, rebalance intervals and seconds after its first step."""
    samples_per_s = steady_samples_per_s(cold)
    efficiency = step_efficiency(cold)
    final = float(efficiency.iloc[len(efficiency) // 2:].median())
    recent = efficiency.rolling(max(2, rebalance_interval // 2)).median()
    reached = recent[recent >= COLD_START_OF_FINAL * final]
    step = int(reached.index[0]) if len(reached) else None
    seconds = None
    if step is not None:
        ends = per_step(cold).set_index("global_step")["end_wall_time"]
        seconds = float(ends.loc[step] - ends.iloc[0])
    return {"samples_per_s": samples_per_s, "of_profiled": samples_per_s / steady_samples_per_s(profiled),
            "final_efficiency": final, "steps_to_95pct": step, "seconds_to_95pct": seconds,
            "intervals_to_95pct": None if step is None else step / rebalance_interval}


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
    # ≤ 1 by construction (each step's max of ratios that average 1); without jitter the
    # division rounds to 1.0000000000000002
    return min(1.0, float(1.0 / relative.groupby(rows["global_step"]).max().mean()))


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
