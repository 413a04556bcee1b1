"""A simulated cluster that drives the policies in plain Python (tests, benchmarks).

Device model of rank i at step s, with speed factor ``f_i(s)`` (1 at start, multiplied by
each ``(step, rank, factor)`` speed change at or before s; 0.5 = half as fast):

    busy_i(s) = (α_i + β_i·b_i) / f_i(s) · max(0.1, 1 + noise·z),   z ~ N(0, 1)
    step_time(s) = max_i busy_i(s)          (DDP: every rank waits for the slowest)

A rank listed in ``silent_ranks`` from some step on keeps training (its busy time still
counts) but its records stop arriving, as when its metrics connection is lost.

With a ``noise_trace`` (steps × ranks factors measured on a real machine, see
:mod:`benchmarks.replay`) the factor of step s is row ``s mod len(trace)`` instead
of ``1 + noise·z``: the policies meet the machine's own jitter, its slow phases included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from hetero_ray.planning.capacity import RankCapacity
from hetero_ray.planning.estimates import ClusterEstimates
from hetero_ray.planning.decision import Decision
from hetero_ray.planning.policies import Policy
from hetero_ray.planning.solver import predicted_step_time_s, solve_split
from hetero_ray.planning.plan import Plan


class SimulatedCluster:
    """Ranks with linear busy-time models, noise, and speed changes at given steps.

    Args:
        alphas: per-rank fixed cost α_i (s).
        betas: per-rank cost per sample β_i (s/sample).
        noise: relative standard deviation of each busy time.
        speed_changes: ``(global_step, rank, factor)``: from that step on, the rank runs at
            ``factor`` × its previous speed (0.5: busy times double).
        silent_ranks: ``(global_step, rank)``: from that step on, the rank sends no records.
        seed: for the noise.
        noise_trace: ``(steps, ranks)`` positive factors on the busy times, replayed in
            place of the Gaussian noise.
    """

    def __init__(
        self,
        alphas: Sequence[float],
        betas: Sequence[float],
        noise: float = 0.0,
        speed_changes: Sequence[tuple[int, int, float]] = (),
        silent_ranks: Sequence[tuple[int, int]] = (),
        seed: int = 0,
        noise_trace: Optional[np.ndarray] = None,
    ):
        self.alphas = np.asarray(alphas, dtype=np.float64)
        self.betas = np.asarray(betas, dtype=np.float64)
        if self.alphas.shape != self.betas.shape or self.alphas.ndim != 1 or self.alphas.size == 0:
            raise ValueError("need one α and one β per rank")
        if np.any(self.alphas < 0) or np.any(self.betas <= 0):
            raise ValueError("α must be ≥ 0 and β > 0 for every rank")
        if noise < 0:
            raise ValueError(f"noise must be ≥ 0, got {noise}")
        self.noise = float(noise)
        self.speed_changes = sorted((int(s), int(r), float(f)) for s, r, f in speed_changes)
        if any(f <= 0 for _, _, f in self.speed_changes):
            raise ValueError("speed change factors must be > 0")
        self.silent_ranks = [(int(s), int(r)) for s, r in silent_ranks]
        self._rng = np.random.default_rng(seed)
        self.noise_trace = None
        if noise_trace is not None:
            trace = np.asarray(noise_trace, dtype=np.float64)
            if trace.ndim != 2 or trace.shape[1] != self.alphas.size or trace.shape[0] == 0:
                raise ValueError(f"noise_trace must be (steps, {self.alphas.size}), got shape {trace.shape}")
            if not np.all(np.isfinite(trace) & (trace > 0)):
                raise ValueError("noise_trace factors must be finite and > 0")
            self.noise_trace = trace

    @property
    def num_workers(self) -> int:
        return int(self.alphas.size)

    def speeds(self, global_step: int) -> np.ndarray:
        """``f_i(s)`` for every rank."""
        f = np.ones(self.num_workers)
        for step, rank, factor in self.speed_changes:
            if step <= global_step:
                f[rank] *= factor
        return f

    def true_model(self, global_step: int) -> tuple[np.ndarray, np.ndarray]:
        """The noiseless ``(α_i/f_i, β_i/f_i)`` in force at ``global_step``."""
        f = self.speeds(global_step)
        return self.alphas / f, self.betas / f

    def model_step_time_s(self, sizes: Sequence[int], global_step: int) -> float:
        """Noiseless step time of ``sizes`` at ``global_step``."""
        a, b = self.true_model(global_step)
        return predicted_step_time_s(a, b, sizes)

    def ideal_step_time_s(self, global_batch_size: int, global_step: int, min_size: int = 1,
                          caps: Optional[Sequence[Optional[int]]] = None) -> float:
        """Noiseless step time of the best integer split at ``global_step``."""
        a, b = self.true_model(global_step)
        return predicted_step_time_s(a, b, solve_split(a, b, global_batch_size, min_size, caps))

    def busy_times_s(self, sizes: Sequence[int], global_step: int) -> np.ndarray:
        """One noisy busy time per rank for one step."""
        a, b = self.true_model(global_step)
        t = a + b * np.asarray(sizes, dtype=np.float64)
        if self.noise_trace is not None:
            return t * self.noise_trace[global_step % len(self.noise_trace)]
        if self.noise:
            t = t * np.maximum(0.1, 1.0 + self.noise * self._rng.standard_normal(t.size))
        return t

    def step(self, plan: Plan, global_step: int) -> tuple[list[dict], float]:
        """Runs one step under ``plan``: the records that reach the balancer, and the step time."""
        sizes = plan.local_batch_sizes
        busy = self.busy_times_s(sizes, global_step)
        step_time_s = float(busy.max())
        silent = {r for s, r in self.silent_ranks if s <= global_step}
        records = [
            {"rank": rank, "global_step": global_step, "local_batch_size": sizes[rank],
             "busy_time_s": t, "step_time_s": step_time_s, "plan_version": plan.version}
            for rank, t in enumerate(busy.tolist()) if rank not in silent
        ]
        return records, step_time_s


@dataclass
class SimulationResult:
    """What happened in :func:`run_policy`; per-step arrays are indexed by global step."""

    plans: list[Plan]  # the plan in force at each step
    step_times_s: np.ndarray  # noisy, as measured
    model_step_times_s: np.ndarray  # noiseless step time of each step's plan
    ideal_step_times_s: np.ndarray  # noiseless step time of the best split at each step
    decisions: list[Decision] = field(default_factory=list)

    @property
    def adopted(self) -> list[Decision]:
        return [d for d in self.decisions if d.adopt]

    @property
    def final_plan(self) -> Plan:
        return self.plans[-1]

    def plan_at(self, global_step: int) -> Plan:
        return self.plans[global_step]

    def relative_excess(self) -> np.ndarray:
        """``model / ideal − 1`` per step: how far each step's plan is from the best split."""
        return self.model_step_times_s / self.ideal_step_times_s - 1.0


def run_policy(
    policy: Policy,
    cluster: SimulatedCluster,
    *,
    steps: int,
    global_batch_size: int,
    rebalance_interval: int = 20,
    estimates: Optional[ClusterEstimates] = None,
    capacities: Optional[Sequence[RankCapacity]] = None,
) -> SimulationResult:
    """Trains ``steps`` simulated steps under ``policy``, deciding every ``rebalance_interval``.

    The loop mirrors the real one: records of step s reach the estimates after step s; at
    every multiple of the interval the policy decides from them, and an adopted plan
    applies from that step on. ``capacities`` (profiled, one per rank) go to the first plan.
    """
    if steps < 1 or rebalance_interval < 1:
        raise ValueError("steps and rebalance_interval must be ≥ 1")
    n = cluster.num_workers
    est = estimates or ClusterEstimates(n)
    plan = policy.initial_plan(global_batch_size, n, capacities)
    caps = getattr(policy, "caps", None)
    min_size = policy.config.min_local_batch_size if hasattr(policy, "config") else 1
    plans, step_times, model_times, ideal_times, decisions = [], [], [], [], []
    ideal_cache: dict[tuple, float] = {}
    for global_step in range(steps):
        if global_step > 0 and global_step % rebalance_interval == 0:
            decision = policy.decide(plan, est.estimates(global_step), global_step)
            decisions.append(decision)
            if decision.adopt:
                plan = decision.plan
        records, step_time_s = cluster.step(plan, global_step)
        est.add(records)
        plans.append(plan)
        step_times.append(step_time_s)
        model_times.append(cluster.model_step_time_s(plan.local_batch_sizes, global_step))
        speeds_key = tuple(cluster.speeds(global_step))
        if speeds_key not in ideal_cache:
            ideal_cache[speeds_key] = cluster.ideal_step_time_s(global_batch_size, global_step, min_size, caps)
        ideal_times.append(ideal_cache[speeds_key])
    return SimulationResult(plans, np.array(step_times), np.array(model_times), np.array(ideal_times), decisions)
