"""The split alone: the policies replayed on this machine's own noise, against the best split.

A bench run's efficiency mixes the split with what no split controls (jitter and
synchronisation, see :mod:`benchmarks.balance_analysis`). To judge the balancer's part by
itself, the bench replays its runs in plain Python (no Ray, seconds):

1. *devices*: per rank, ``t_i(b) = β_i·b`` with ``β_i`` its busy time per sample over
   all the policy runs (:func:`fit_devices` says why not a line);
2. *noise traces*: per run, ``x_s,i = busy_i,s / median busy of rank i at that batch
   size``: every step's departure from the rank's usual pace, slow phases shared by the
   ranks included (the first :data:`WARMUP_STEPS` steps left out);
3. every adaptive policy runs a :class:`SimulatedCluster` of those devices with each trace
   (and each rotation of its columns over the ranks), from equal shares, deciding every
   rebalance interval exactly as in training;
4. the reference is the best *fixed* split for the same noise: the split minimising the
   mean over steps of ``max_i x_s,i·t_i(b_i)`` (local search from the model's optimum).
   A row "mean speeds known" scores the model's optimum itself: a split made with exact
   knowledge of each device's mean speed, never changed (what perfect profiling gives).

    split efficiency = mean step time of the best fixed split / the policy's

over the steps from the second rebalance point on (the policy has had one interval to
measure). 1 is a balancer as good as knowing the noise in advance.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from benchmarks.balance_analysis import working_rows
from hetero_ray.planning.cost_model import CurveFit
from hetero_ray.planning.policies import PolicyConfig, make_policy
from hetero_ray.planning.simulation import SimulatedCluster, run_policy
from hetero_ray.planning.solver import solve_split

WARMUP_STEPS = 5  # first steps: allocation, caches, thread start-up; not the machine's steady noise
REPLAYED_POLICIES = ("dynamic", "optimal")
KNOWN_SPEEDS = "mean speeds known"  # the reference row: the devices' own split, fixed


@dataclass(frozen=True)
class ReplayResult:
    devices: list[CurveFit]
    num_traces: int
    num_steps: int
    rows: list[dict]  # per policy: split_efficiency (mean, p10), plan changes (mean, max)

    def to_dict(self) -> dict:
        return {"devices": [{"alpha_s": d.alpha_s, "beta_s_per_sample": d.beta_s_per_sample} for d in self.devices],
                "num_traces": self.num_traces, "num_steps": self.num_steps, "policies": self.rows}


def fit_devices(runs: Sequence[pd.DataFrame]) -> list[CurveFit]:
    """Per rank, its mean cost per sample over all ``runs`` (same devices in each): ``α = 0``.

    A line fitted across runs would read the machine's drift between runs (minutes apart,
    each at other batch sizes) as a slope; the noise, not the line, is what is replayed.
    """
    rows = pd.concat([working_rows(steps, WARMUP_STEPS) for steps in runs])
    sums = rows.groupby("rank", sort=True)[["busy_time_s", "local_batch_size"]].sum()
    return [CurveFit(0.0, float(busy / samples), float("nan"), 0)
            for busy, samples in zip(sums["busy_time_s"], sums["local_batch_size"])]


def noise_trace(steps: pd.DataFrame) -> np.ndarray:
    """``(steps, ranks)`` factors: busy time over the rank's median at that batch size."""
    rows = working_rows(steps, WARMUP_STEPS)
    usual = rows.groupby(["rank", "local_batch_size"])["busy_time_s"].transform("median")
    factors = (rows["busy_time_s"] / usual).to_numpy()
    table = pd.DataFrame({"global_step": rows["global_step"].to_numpy(), "rank": rows["rank"].to_numpy(),
                          "x": factors}).pivot_table(index="global_step", columns="rank", values="x")
    return table.dropna().to_numpy()  # steps where a rank ran no sample are left out


def mean_step_time_s(alphas: np.ndarray, betas: np.ndarray, sizes: Sequence[int], trace: np.ndarray) -> float:
    """The mean over the trace's steps of each step's slowest rank, for a fixed split."""
    return float(((alphas + betas * np.asarray(sizes, np.float64)) * trace).max(axis=1).mean())


def best_fixed_split(alphas: np.ndarray, betas: np.ndarray, trace: np.ndarray, start: Sequence[int]) -> list[int]:
    """Local search: move 4, 2 or 1 samples between ranks while the mean noisy step time drops."""
    def cost(sizes) -> float:
        return mean_step_time_s(alphas, betas, sizes, trace)

    best, best_cost = list(start), cost(start)
    improved = True
    while improved:
        improved = False
        for i, j in itertools.permutations(range(len(best)), 2):
            for moved in (4, 2, 1):
                if best[i] - moved < 1:
                    continue
                candidate = list(best)
                candidate[i] -= moved
                candidate[j] += moved
                candidate_cost = cost(candidate)
                if candidate_cost < best_cost - 1e-12:
                    best, best_cost, improved = candidate, candidate_cost, True
    return best


def replay(runs: Sequence[pd.DataFrame], traces_from: Sequence[pd.DataFrame], global_batch_size: int,
           rebalance_interval: int, config: PolicyConfig = PolicyConfig(),
           policies: Sequence[str] = REPLAYED_POLICIES) -> ReplayResult:
    """Replays ``policies`` on devices fitted from ``runs`` with the noise of ``traces_from``."""
    devices = fit_devices(runs)
    alphas = np.array([d.alpha_s for d in devices])
    betas = np.array([d.beta_s_per_sample for d in devices])
    n = len(devices)
    scored_from = 2 * rebalance_interval
    traces = [t for t in map(noise_trace, traces_from) if t.shape[1] == n and len(t) > scored_from + rebalance_interval]
    if not traces:  # runs too short to score (or of another rank count)
        return ReplayResult(devices, 0, 0, [])
    model_best = solve_split(alphas, betas, global_batch_size, config.min_local_batch_size)
    results: dict[str, list[tuple[float, int]]] = {p: [] for p in (*policies, KNOWN_SPEEDS)}
    for trace, rotation in itertools.product(traces, range(n)):
        rotated = np.roll(trace, rotation, axis=1)
        scored = rotated[scored_from:]
        best_s = mean_step_time_s(alphas, betas, best_fixed_split(alphas, betas, scored, model_best), scored)
        results[KNOWN_SPEEDS].append((best_s / mean_step_time_s(alphas, betas, model_best, scored), 0))
        for name in policies:
            policy = make_policy(name, config)
            cluster = SimulatedCluster(alphas, betas, noise_trace=rotated)
            result = run_policy(policy, cluster, steps=len(rotated), global_batch_size=global_batch_size,
                                rebalance_interval=rebalance_interval)
            achieved_s = float(result.step_times_s[scored_from:].mean())
            results[name].append((best_s / achieved_s, len(result.adopted)))
    rows = []
    for name, scores in results.items():
        efficiency = np.array([e for e, _ in scores])
        changes = np.array([c for _, c in scores])
        rows.append({"policy": name, "split_efficiency": float(efficiency.mean()),
                     "split_efficiency_p10": float(np.percentile(efficiency, 10)),
                     "plan_changes_mean": float(changes.mean()), "plan_changes_max": int(changes.max())})
    return ReplayResult(devices, len(traces), int(sum(len(t) for t in traces)), rows)
