"""Benchmark of the split solver (target: ≤ 5 ms for 1,024 ranks) and of the estimator.

    .venv/bin/python benchmarks/solver.py            # default sizes 8, 64, 1024, 4096
    .venv/bin/python benchmarks/solver.py --repeats 200 --ranks 1024

Prints the median wall time of ``solve_split`` per number of ranks (random heterogeneous
α_i, β_i, global batch 32 samples per rank; with and without per-rank caps) and its ratio
to the 5 ms target, then the time of one estimates snapshot and one decision at 1,024 ranks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

try:
    import hetero_ray  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from hetero_ray.planning import ClusterEstimates, make_policy, solve_split

TARGET_S = 0.005  # the budget for 1,024 ranks


def median_time_s(fn, repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    print(f"{'ranks':>6} {'caps':>5} {'median solve':>13} {'vs 5 ms':>8}")
    for n in args.ranks:
        speed = rng.choice([1.0, 0.5, 0.25], n)
        alphas = rng.uniform(0.005, 0.02, n) / speed
        betas = rng.uniform(0.8e-3, 1.2e-3, n) / speed
        total = 32 * n
        caps = [int(c) if rng.random() < 0.5 else None for c in rng.integers(20, 80, n)]
        for label, cap_arg in (("no", None), ("yes", caps)):
            t = median_time_s(lambda: solve_split(alphas, betas, total, 1, cap_arg), args.repeats)
            print(f"{n:>6} {label:>5} {t * 1e3:>10.3f} ms {t / TARGET_S:>7.2f}×")

    n, window = 1024, 32
    est = ClusterEstimates(n, window_steps=window)
    for step in range(window):
        est.add_arrays(np.arange(n), np.full(n, 24 if step < 12 else 32),
                       0.01 + 0.003 * np.full(n, 24 if step < 12 else 32) * rng.uniform(0.95, 1.05, n),
                       np.full(n, step))
    t_est = median_time_s(est.estimates, max(10, args.repeats // 10))
    snapshot = est.estimates()
    policy = make_policy("optimal")
    plan = policy.initial_plan(32 * n, n)
    t_dec = median_time_s(lambda: policy.decide(plan, snapshot, window), max(10, args.repeats // 10))
    print(f"estimates snapshot, {n} ranks × {window} records: {t_est * 1e3:.2f} ms")
    print(f"optimal decision, {n} ranks (solver included): {t_dec * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
