"""The policies on the same short training, against the ideal.

    python benchmarks/balance.py [--model simple_cnn] [--emulate-speeds 1,1,0.5,0.25] [--steps 160]
        [--speed-change 100:1:0.5] [--homogeneous-check] [--cold-start] [--plain-anchor] [--json bench.json]

For every policy the same job runs on the same workers (by default four emulated devices
at speeds 1, 1, 0.5, 0.25 of the real one); :mod:`benchmarks.balance_analysis` turns each
run's step records into the figures printed here (balance efficiency against the sum of
the ranks' own throughput, steps to balance, where the rest of the ideal went), and
:mod:`benchmarks.replay` replays the policies on the runs' recorded noise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script

import pandas as pd  # noqa: E402

from benchmarks.balance_analysis import (  # noqa: E402
    FACTORS, ROLLING_STEPS, PolicyRun, analyse, cluster_throughput, cold_start_figures, jitter_ceiling,
    own_throughputs, steady_samples_per_s,
)
from hetero_ray.planning.policies import policy_names  # noqa: E402
from hetero_ray.errors import ConfigError, UserError  # noqa: E402
from hetero_ray.flags import float_list, speed_change  # noqa: E402
from hetero_ray.formatting import format_table  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="compare the policies on the same short training against the "
                                                 "ideal (Σ of the devices' own throughput)")
    parser.add_argument("--address", help="Ray cluster to run on (default: RAY_ADDRESS or a local Ray)")
    parser.add_argument("--model", default="simple_cnn", help="(default %(default)s)")
    parser.add_argument("--emulate-speeds", type=float_list, default=[1.0, 1.0, 0.5, 0.25],
                        help="per-rank emulated speed (default 1,1,0.5,0.25); 'none' for real devices only")
    parser.add_argument("--no-emulation", action="store_true", help="real devices only (a real heterogeneous cluster)")
    parser.add_argument("--num-workers", type=int, help="default: one per emulated speed")
    parser.add_argument("--batch-size", type=int, default=192, help="global batch (default %(default)s)")
    parser.add_argument("--steps", type=int, default=160, help="steps per policy (default %(default)s)")
    parser.add_argument("--rebalance-interval", type=int, default=20, help="(default %(default)s)")
    parser.add_argument("--policies", default=",".join(policy_names()), help="comma-separated (default %(default)s)")
    parser.add_argument("--speed-change", type=speed_change, metavar="STEP:RANK:SPEED",
                        help="also run optimal with this emulated slowdown mid-run (adaptation)")
    parser.add_argument("--homogeneous-check", action="store_true",
                        help="also run optimal without emulation and count plan changes (thrashing)")
    parser.add_argument("--cold-start", action="store_true",
                        help="also run optimal from equal shares without profiling, against the profiled run")
    parser.add_argument("--plain-anchor", action="store_true",
                        help="also run plain Ray Train (TorchTrainer, equal shares, same model and global batch) "
                             "and print each policy ÷ it")
    parser.add_argument("--output-dir", help="where the bench's runs go (default runs/bench-<time>)")
    parser.add_argument("--json", help="write the figures to this file")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Fills the defaults that depend on other flags and refuses what cannot run.

    Raises:
        ConfigError: a bad flag, named.
    """
    if args.no_emulation:
        args.emulate_speeds = None
    args.num_workers = args.num_workers or (len(args.emulate_speeds) if args.emulate_speeds else 2)
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in args.policies if p not in policy_names()]
    if unknown or not args.policies:
        raise ConfigError(f"--policies must be a comma-separated subset of {', '.join(policy_names())}; got {unknown}")
    if args.emulate_speeds and len(args.emulate_speeds) != args.num_workers:
        raise ConfigError(f"--emulate-speeds has {len(args.emulate_speeds)} values but --num-workers is {args.num_workers}")
    if args.speed_change and args.speed_change["rank"] >= args.num_workers:
        raise ConfigError(f"--speed-change rank {args.speed_change['rank']} does not exist with {args.num_workers} workers")
    for flag, value in (("--batch-size", args.batch_size), ("--steps", args.steps),
                        ("--rebalance-interval", args.rebalance_interval)):
        if value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")
    if args.batch_size < args.num_workers:
        raise ConfigError(f"--batch-size {args.batch_size} is smaller than the {args.num_workers} workers")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ConfigError as e:
        parser.error(str(e))
    try:
        result = run_bench(args)
    except UserError as e:  # e.g. a cluster that cannot hold the workers
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    print_result(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
        print(f"figures: {args.json}")
    return 0


def _run(args, output_dir: str, label: str, policy: str, emulate_speeds, speed_changes=None,
         profile: bool = True) -> PolicyRun:
    from hetero_ray.builtin.config import TrainConfig
    from hetero_ray.builtin.driver import run_training
    from hetero_ray.runs import run_files

    config = TrainConfig(
        model=args.model, dataset="synthetic_image", num_samples=args.batch_size * (args.steps + 1),
        global_batch_size=args.batch_size, epochs=1, max_steps=args.steps, num_workers=args.num_workers,
        policy=policy, emulate_speeds=emulate_speeds, rebalance_interval=args.rebalance_interval,
        checkpoint_every=10 * args.steps, storage_path=output_dir, name=label,
        address=args.address, max_failures=0, emulate_speed_changes=speed_changes, profile=profile,
    )
    started = time.monotonic()
    result = run_training(config, emit=lambda line: None)
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
    if args.cold_start:
        result["cold_start"] = _cold_start(args, output_dir, speeds, runs)
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


def _cold_start(args, output_dir: str, speeds, runs: list[PolicyRun]) -> dict:
    """``optimal`` from equal shares (no profiling): how close it gets to the profiled run,
    and how soon."""
    profiled = next((r for r in runs if r.policy == "optimal"), None)
    if profiled is None:
        raise SystemExit("--cold-start compares with the profiled optimal run: include optimal in --policies")
    cold = _run(args, output_dir, "optimal-cold-start", "optimal", speeds, profile=False)
    analyse(cold)
    return {**cold_start_figures(cold.steps, profiled.steps, args.rebalance_interval),
            "plan_changes": cold.plan_changes, "final_plan": cold.summary["final_plan"], "run_dir": cold.run_dir}


def _plain_anchor(args, output_dir: str) -> dict:
    """Plain Ray Train on the same workers, model and global batch (equal shares), in this
    run: the anchor for the policies' "× plain Ray Train". Its steady rate is taken as the
    policies' is: the second half of the steps, by wall time. Emulated speeds are not
    applied to it (it has no emulator), so the anchor is only meaningful on real devices."""
    from benchmarks.overhead import steady_rate
    from benchmarks.plain_ray_train import run_plain

    started = time.monotonic()
    ends = run_plain(args.model, "synthetic_image", args.batch_size * (args.steps + 1), args.batch_size,
                     args.steps, args.num_workers, lr=0.01, seed=0,
                     result_path=os.path.join(output_dir, "plain-ray-train.json"))
    rate = steady_rate(ends, args.batch_size)
    print(f"[bench] plain Ray Train: {rate:.0f} samples/s ({time.monotonic() - started:.0f} s)", flush=True)
    return {"samples_per_s": rate}


def _replay(args, runs: list[PolicyRun], extra_traces: list[pd.DataFrame]) -> Optional[dict]:
    """The split alone: the policies on these runs' noise, against the best fixed split."""
    from benchmarks.replay import replay

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
    figure.update_layout(title="hetero_ray: policies against the ideal", height=460)
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
    if "cold_start" in result:
        c = result["cold_start"]
        reached = ("never" if c["steps_to_95pct"] is None else
                   f"after {c['steps_to_95pct']} steps ({c['intervals_to_95pct']:.1f} rebalance intervals, "
                   f"{c['seconds_to_95pct']:.1f} s)")
        print(f"cold start (optimal from equal shares, no profiling): {c['samples_per_s']:.0f} samples/s = "
              f"{c['of_profiled']:.2f} of the profiled optimal run's (target ≥ 0.95); 0.95 of its final "
              f"efficiency reached {reached}; {c['plan_changes']} plan change(s), final plan "
              f"{'/'.join(map(str, c['final_plan'] or []))}")
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


if __name__ == "__main__":
    sys.exit(main())
