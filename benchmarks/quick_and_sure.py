"""Quick to start and sure in its moves, side by side: the first step against plain Ray
Train's, the CPU-quota testbed's worst of five runs, and the demo's plans against the
split its emulated speeds alone would give.

    python benchmarks/quick_and_sure.py            # runs all three (about 40 minutes on 2 cores)
    python benchmarks/quick_and_sure.py --first-step-json fs.json --quota-json q1.json q2.json ... --demo-run runs/demo

Given files, it reads them instead of running that part: ``bench_first_step.py --json``,
``cgroup_cluster.py --policies static,optimal --cold-start --json`` (one file a run) and a
finished demo's run folder. Each row says its target and how many runs it holds; the
figures come from the runs, never from a setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST_STEP_TARGET_S = 3.0  # hetero_ray's median first step at most this much after plain Ray Train's
QUOTA_RUNS = 5
OPTIMAL_OVER_STATIC_TARGET = 1.8  # the worst of the quota runs (the limit for speeds 1 : ⅓ is 2.0)
PROFILED_OVER_UNPROFILED_TARGET = 0.9  # profiling must never cost a run its throughput
DEMO_SPEEDS = "1,1,0.5,0.25"
DEMO_FLAGS = ["--model", "simple_cnn", "--dataset", "synthetic_image", "--num-samples", "6144", "--epochs", "2",
              "--global-batch-size", "96", "--num-workers", "4", "--emulate-speeds", DEMO_SPEEDS]  # make demo's


def first_step_row(result: dict) -> list:
    gap = result["gap_of_medians_s"]
    rounds = ", ".join(f"{g:+.1f}" for g in result["gaps_s"])
    return ["first step after plain Ray Train's (medians)", f"≤ +{FIRST_STEP_TARGET_S:.0f} s",
            f"{gap:+.1f} s (per round {rounds})", f"{len(result['gaps_s'])} rounds",
            "met" if gap <= FIRST_STEP_TARGET_S else "NOT met"]


def quota_rows(results: Sequence[dict]) -> list[list]:
    """The worst ``optimal`` ÷ ``static`` and the worst profiled ÷ unprofiled (cold start) run."""
    over_static, over_cold = [], []
    for result in results:
        by_label = {run["label"]: run["samples_per_s"] for run in result["runs"]}
        over_static.append(by_label["optimal"] / by_label["static"])
        over_cold.append(1.0 / result["cold_start"]["of_profiled"])
    runs = f"{len(results)} runs"
    worst_static, worst_cold = min(over_static), min(over_cold)
    return [["quota testbed: optimal ÷ static, worst run", f"≥ {OPTIMAL_OVER_STATIC_TARGET}",
             f"{worst_static:.2f} (runs {', '.join(f'{r:.2f}' for r in over_static)})", runs,
             "met" if worst_static >= OPTIMAL_OVER_STATIC_TARGET else "NOT met"],
            ["quota testbed: profiled ÷ unprofiled optimal, worst run", f"≥ {PROFILED_OVER_UNPROFILED_TARGET}",
             f"{worst_cold:.2f} (runs {', '.join(f'{r:.2f}' for r in over_cold)})", runs,
             "met" if worst_cold >= PROFILED_OVER_UNPROFILED_TARGET else "NOT met"]]


def demo_row(summary: dict) -> list:
    """The demo's plans beside the speeds' split; identical ranks (equal speeds) must hold
    shares within one sample of each other, in the first plan and the final one."""
    from hetero_ray.formatting import format_shares
    from hetero_ray.planning.plan import largest_remainder

    speeds = [float(s) for s in summary["emulate_speeds"]]
    first, final = summary["first_plan"], summary["final_plan"]
    ideal = largest_remainder(speeds, sum(final))
    twins = [(i, j) for i in range(len(speeds)) for j in range(i + 1, len(speeds)) if speeds[i] == speeds[j]]
    equal = all(abs(plan[i] - plan[j]) <= 1 for plan in (first, final) for i, j in twins)
    return ["demo: first → final plan (the speeds alone)", "identical ranks within 1 sample",
            f"{format_shares(first)} → {format_shares(final)} ({format_shares(ideal)}); "
            f"{summary['plan_changes']} plan change(s), left out: {summary.get('left_out_ranks') or 'none'}",
            "1 run", "met" if equal else "NOT met"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first-step-json", help="bench_first_step.py --json's file (else it runs, 3 rounds)")
    parser.add_argument("--quota-json", nargs="+", help="cgroup_cluster.py --json files, one a run (else five run)")
    parser.add_argument("--demo-run", help="a finished demo's run folder (else the demo runs)")
    args = parser.parse_args(argv)
    sys.path.insert(0, REPO)
    with tempfile.TemporaryDirectory(prefix="quick_and_sure_") as work:
        first_step = _load(args.first_step_json) if args.first_step_json else _first_step(work)
        quota = [_load(p) for p in args.quota_json] if args.quota_json else _quota(work)
        demo = _load(os.path.join(args.demo_run or _demo(work), "summary.json"))
    from hetero_ray.formatting import format_table

    rows = [first_step_row(first_step), *(quota_rows(quota) if quota else []), demo_row(demo)]
    print(format_table(["check", "target", "measured", "runs", "verdict"], rows))
    if not quota:
        print("quota testbed: not run here (it needs a writable cgroup v1 cpu controller)")
    return 0


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _first_step(work: str) -> dict:
    out = os.path.join(work, "first_step.json")
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_first_step.py"), "--json", out],
                   check=True)
    return _load(out)


def _quota(work: str) -> list[dict]:
    from benchmarks.local_cluster import cgroup_unusable_reason

    if cgroup_unusable_reason():
        return []
    results = []
    for run in range(QUOTA_RUNS):
        out = os.path.join(work, f"quota-{run}.json")
        print(f"quota testbed: run {run + 1} of {QUOTA_RUNS}", flush=True)
        subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "cgroup_cluster.py"), "--steps", "150",
                        "--batch-size", "256", "--policies", "static,optimal", "--cold-start", "--no-plain-anchor",
                        "--json", out], check=True)
        results.append(_load(out))
    return results


def _demo(work: str) -> str:
    cli = os.path.join(os.path.dirname(sys.executable), "hetero-ray")
    subprocess.run([cli, "train", *DEMO_FLAGS, "--storage-path", work, "--name", "demo"], check=True,
                   env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    return os.path.join(work, "demo")


if __name__ == "__main__":
    sys.exit(main())
