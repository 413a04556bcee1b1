"""Do plans hold? Identical workers, emulated devices and the capped-node testbed, one command.

    python benchmarks/stability.py                      # everything, with the defaults below
    python benchmarks/stability.py --capped-runs 0      # without the cgroup testbed
    python benchmarks/stability.py --json stability.json

Prints, per run:

* identical workers (``optimal``, no emulation; ``--homogeneous-runs`` runs of
  ``--homogeneous-steps``): plan changes — the target is 0 in every run;
* emulated devices (speeds 1, 1, 0.5, 0.25): plan changes (it must still move);
* the capped-node testbed (``benchmarks/cgroup_cluster.py``, one node at ⅓ core;
  ``--capped-runs`` runs): ``optimal`` ÷ ``static`` samples/s (target ≥ 1.8);
* for every ``optimal`` run: the longest a plan more than 10 % slower than its
  predecessor stayed in force (target: at most one rebalance interval), and predicted ÷
  measured step time for the plan in force at the end (target within 10 %).

Predicted ÷ measured: the prediction is the last decision's for the plan in force
(``current_predicted_step_time_s``: ``max_i t_i(b_i) + c(G)`` from the fitted curves and
the learned all-reduce) — or, for a plan adopted too late for a later decision, the
prediction that adopted it (``predicted_step_time_s``, made before it ran) — measured on
that plan's steps after the decision (up to one interval; before it, where the run ended
too soon). Its compute part is set against the
slowest rank's mean busy time and the mean of each step's slowest busy time (each step
waits for its unluckiest rank). The step time it predicts adds the decision's
``rest_of_step_s`` — what the plan's steps before the decision took beyond ``max_i t_i +
c`` (optimizer, loop, jitter; planning/balancer.py) — and is set against the mean step
time of the steps after it: the target figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Optional

import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetero_ray.formatting import format_table  # noqa: E402
from hetero_ray.planning.cost_model import kept_mean_s  # noqa: E402

WORSE_BY = 0.10  # a plan this much slower than its predecessor is "worse" (issue 25)
EMULATED_SPEEDS = [1.0, 1.0, 0.5, 0.25]
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------- figures (pure)
def plan_periods(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per stretch of consecutive steps under one plan: version, first and last
    step, and the per-step step time and slowest busy time (lists, in step order)."""
    per = steps.groupby("global_step", sort=True).agg(
        plan_version=("plan_version", "max"), step_time_s=("step_time_s", "max"),
        max_busy_time_s=("busy_time_s", "max")).reset_index()
    stretch = (per["plan_version"] != per["plan_version"].shift()).cumsum()
    rows = []
    for _, g in per.groupby(stretch, sort=True):
        rows.append({"plan_version": int(g["plan_version"].iloc[0]), "first_step": int(g["global_step"].iloc[0]),
                     "last_step": int(g["global_step"].iloc[-1]), "num_steps": len(g),
                     "step_time_s": g["step_time_s"].tolist(), "max_busy_time_s": g["max_busy_time_s"].tolist()})
    return pd.DataFrame(rows)


def worse_plans(steps: pd.DataFrame, compare_steps: int) -> list[dict]:
    """Every plan whose step time (kept mean over all its steps) came out more than
    :data:`WORSE_BY` above its predecessor's (over the predecessor's last ``compare_steps``
    steps: the plan it replaced, as it ran just before), with how long it stayed in force."""
    periods = plan_periods(steps)
    out = []
    for prev, cur in zip(periods.itertuples(), periods.iloc[1:].itertuples()):
        before = kept_mean_s(prev.step_time_s[-compare_steps:])
        after = kept_mean_s(cur.step_time_s)
        if after > before * (1 + WORSE_BY):
            out.append({"plan_version": cur.plan_version, "first_step": cur.first_step, "steps_in_force": cur.num_steps,
                        "step_time_s": after, "predecessor_step_time_s": before})
    return out


def predicted_vs_measured(steps: pd.DataFrame, decisions: pd.DataFrame, interval: int) -> Optional[dict]:
    """Predicted ÷ measured step time for the plan in force at the end (module docstring);
    None without a decision that predicted it."""
    if steps.empty or decisions.empty:
        return None
    final_version = int(steps.loc[steps["global_step"].idxmax(), "plan_version"])
    # tables from before a column: as if it were null
    mine_rows = decisions[decisions["plan_version"] == final_version].reindex(
        columns=[*decisions.columns, *({"predicted_step_time_s", "rest_of_step_s"} - set(decisions.columns))])
    adopted = mine_rows["adopted"].astype(bool)
    kept = mine_rows[~adopted & mine_rows["current_predicted_step_time_s"].notna()]
    # A plan adopted too late for a decision to keep it: its proposal's own prediction, made
    # before it ran (a rollback's: the restored plan's step as measured before it was left).
    proposed = mine_rows[adopted & mine_rows["predicted_step_time_s"].notna() & mine_rows["rest_of_step_s"].notna()]
    if kept.empty and proposed.empty:
        return None
    basis, column = ("kept", "current_predicted_step_time_s") if not kept.empty else ("adopted", "predicted_step_time_s")
    last = (kept if not kept.empty else proposed).sort_values("global_step").iloc[-1]
    predicted = float(last[column])
    rest = last.get("rest_of_step_s")
    rest = float(rest) if rest is not None and pd.notna(rest) else 0.0  # tables from before the column: none
    mine = steps[steps["plan_version"] == final_version]
    after = mine[(mine["global_step"] > last["global_step"]) & (mine["global_step"] <= last["global_step"] + interval)]
    window = after if after["global_step"].nunique() >= 5 else (
        mine[mine["global_step"] > mine["global_step"].max() - interval])
    slowest_mean = float(window.groupby("rank")["busy_time_s"].mean().max())
    per_step = window.groupby("global_step").agg(busy=("busy_time_s", "max"), step=("step_time_s", "max"))
    return {"plan_version": final_version, "decided_at": int(last["global_step"]), "basis": basis,
            "predicted_s": predicted,
            "rest_of_step_s": rest, "predicted_step_time_s": predicted + rest, "num_steps": int(len(per_step)),
            "slowest_rank_mean_busy_s": slowest_mean, "mean_slowest_busy_s": float(per_step["busy"].mean()),
            "mean_step_time_s": float(per_step["step"].mean()),
            "vs_slowest_rank_mean_busy": predicted / slowest_mean,
            "vs_mean_slowest_busy": predicted / float(per_step["busy"].mean()),
            "vs_mean_step_time": (predicted + rest) / float(per_step["step"].mean())}


def run_figures(steps: pd.DataFrame, decisions: pd.DataFrame, interval: int) -> dict:
    """Plan changes, the worst plans kept and predicted ÷ measured, for one run."""
    versions = steps.sort_values("global_step")["plan_version"]
    worse = worse_plans(steps, compare_steps=interval)
    return {"plan_changes": int((versions.diff().fillna(0) != 0).sum()),
            "worse_plans": worse,
            "longest_worse_plan_steps": max((w["steps_in_force"] for w in worse), default=0),
            "predicted_vs_measured": predicted_vs_measured(steps, decisions, interval)}


# ---------------------------------------------------------------------------- runs
def _train(args, output_dir: str, label: str, policy: str, speeds) -> dict:
    try:
        return _train_once(args, output_dir, label, policy, speeds)
    except Exception as e:  # one failed run must not cost the others' figures
        print(f"[stability] {label} failed: {e!r}", flush=True)
        return {"label": label, "error": repr(e)[-300:]}


def _train_once(args, output_dir: str, label: str, policy: str, speeds) -> dict:
    from benchmarks.balance import _run
    from hetero_ray.runs import run_files

    run_args = SimpleNamespace(model=args.model, batch_size=args.batch_size, steps=args.steps_now,
                               num_workers=4, rebalance_interval=args.rebalance_interval, address=None)
    run = _run(run_args, output_dir, label, policy, speeds)
    decisions = run_files.read_table(run.run_dir, "decisions")
    return {"label": label, "run_dir": run.run_dir, "final_plan": run.summary["final_plan"],
            "first_plan": _first_plan(run.steps), **run_figures(run.steps, decisions, args.rebalance_interval)}


def _first_plan(steps: pd.DataFrame) -> list[int]:
    first = steps[steps["global_step"] == steps["global_step"].min()].sort_values("rank")
    return [int(b) for b in first["local_batch_size"]]


def _capped_run(args, index: int, output_dir: str) -> dict:
    try:
        return _capped_run_once(args, index, output_dir)
    except Exception as e:  # one failed run must not cost the others' figures
        print(f"[stability] capped run {index + 1} failed: {e!r}", flush=True)
        return {"error": repr(e)[-300:]}


def _capped_run_once(args, index: int, output_dir: str) -> dict:
    """One run of benchmarks/cgroup_cluster.py (static and optimal), in its own process."""
    from hetero_ray.runs import run_files

    out = os.path.join(output_dir, f"capped-{index}.json")
    command = [sys.executable, os.path.join(REPO_ROOT, "benchmarks", "cgroup_cluster.py"), "--steps",
               str(args.capped_steps), "--policies", "static,optimal", "--no-plain-anchor", "--json", out]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {(done.stderr or done.stdout)[-600:]}"}
    with open(out) as f:
        result = json.load(f)
    rates = {r["policy"]: r["samples_per_s"] for r in result["runs"]}
    optimal = next(r for r in result["runs"] if r["policy"] == "optimal")
    steps = run_files.read_table(optimal["run_dir"], "steps")
    decisions = run_files.read_table(optimal["run_dir"], "decisions")
    figures = run_figures(steps, decisions, result["scenario"]["rebalance_interval"])
    print(f"[stability] capped run {index + 1}: optimal ÷ static {rates['optimal'] / rates['static']:.2f} "
          f"({time.monotonic() - started:.0f} s)", flush=True)
    return {"static_samples_per_s": rates["static"], "optimal_samples_per_s": rates["optimal"],
            "optimal_over_static": rates["optimal"] / rates["static"], "final_plan": optimal["final_plan"],
            "rebalance_interval": result["scenario"]["rebalance_interval"], **figures}


def run(args) -> dict:
    import ray

    from hetero_ray.runtime.cluster import connect

    output_dir = os.path.abspath(args.output_dir or tempfile.mkdtemp(prefix="hetero_ray_stability_"))
    os.makedirs(output_dir, exist_ok=True)
    result: dict = {"rebalance_interval": args.rebalance_interval, "batch_size": args.batch_size,
                    "model": args.model, "homogeneous": [], "emulated": [], "capped": []}
    if args.homogeneous_runs or args.emulated_runs:
        connection = connect(None, local_num_cpus=max(os.cpu_count() or 1, 4), timeout_s=30)
        args.steps_now = args.homogeneous_steps
        for i in range(args.homogeneous_runs):
            result["homogeneous"].append(_train(args, output_dir, f"identical-{i}", "optimal", None))
            _save(args, result)
        args.steps_now = args.emulated_steps
        for i in range(args.emulated_runs):
            result["emulated"].append(_train(args, output_dir, f"emulated-{i}", "optimal", EMULATED_SPEEDS))
            _save(args, result)
        if connection.started_local:
            ray.shutdown()
    for i in range(args.capped_runs):
        result["capped"].append(_capped_run(args, i, output_dir))
        _save(args, result)
    return result


def _save(args, result: dict) -> None:
    """The figures so far (a long benchmark that fails late keeps what it measured)."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)


# ---------------------------------------------------------------------------- printing
def _ratio(pvm: Optional[dict], key: str) -> str:
    return "-" if pvm is None else f"{pvm[key]:.2f}"


def _worst(r: dict) -> str:
    if not r["worse_plans"]:
        return "none"
    w = max(r["worse_plans"], key=lambda w: w["steps_in_force"])
    return (f"v{w['plan_version']}: {w['steps_in_force']} steps, {w['step_time_s'] * 1e3:.0f} ms against "
            f"{w['predecessor_step_time_s'] * 1e3:.0f} ms")


def print_result(result: dict) -> None:
    interval = result["rebalance_interval"]
    head = ["plan changes", "first plan", "final plan", "longest >10 %-worse plan in force",
            "pred ÷ slowest rank's mean busy", "pred ÷ mean slowest busy",
            "pred + rest ÷ mean step time (target 0.9–1.1)"]

    def row(r: dict) -> list:
        if "error" in r:
            return [r["error"][-100:], *[""] * (len(head) - 1)]
        pvm = r["predicted_vs_measured"]
        return [r["plan_changes"], "/".join(map(str, r.get("first_plan") or [])), "/".join(map(str, r["final_plan"] or [])),
                _worst(r), _ratio(pvm, "vs_slowest_rank_mean_busy"), _ratio(pvm, "vs_mean_slowest_busy"),
                _ratio(pvm, "vs_mean_step_time")]

    print(f"\nmodel {result['model']}, global batch {result['batch_size']}, rebalance every {interval} steps")
    if result["homogeneous"]:
        print("\nidentical workers (4, optimal, no emulation): target 0 plan changes in every run")
        print(format_table(["run", *head], [[i + 1, *row(r)] for i, r in enumerate(result["homogeneous"])]))
    if result["emulated"]:
        print(f"\nemulated speeds {','.join(f'{s:g}' for s in EMULATED_SPEEDS)} (optimal): it must still move")
        print(format_table(["run", *head], [[i + 1, *row(r)] for i, r in enumerate(result["emulated"])]))
    if result["capped"]:
        print("\ncapped-node testbed (2 nodes, one at 1/3 core; benchmarks/cgroup_cluster.py): target optimal ÷ "
              "static ≥ 1.8 and no >10 %-worse plan in force beyond one interval")
        rows = []
        for i, r in enumerate(result["capped"]):
            if "error" in r:
                rows.append([i + 1, r["error"][-100:], *[""] * 8])
                continue
            full = row(r)
            rows.append([i + 1, f"{r['static_samples_per_s']:.0f}", f"{r['optimal_samples_per_s']:.0f}",
                         f"{r['optimal_over_static']:.2f}", full[0], *full[2:]])
        print(format_table(["run", "static samples/s", "optimal samples/s", "optimal ÷ static", head[0], *head[2:]],
                           rows))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="simple_cnn")
    parser.add_argument("--batch-size", type=int, default=192, help="global batch (default %(default)s)")
    parser.add_argument("--rebalance-interval", type=int, default=20)
    parser.add_argument("--homogeneous-runs", type=int, default=5)
    parser.add_argument("--homogeneous-steps", type=int, default=200)
    parser.add_argument("--emulated-runs", type=int, default=1)
    parser.add_argument("--emulated-steps", type=int, default=160)
    parser.add_argument("--capped-runs", type=int, default=5)
    parser.add_argument("--capped-steps", type=int, default=150)
    parser.add_argument("--output-dir", help="where the runs go (default: a new temporary folder)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    for flag in ("batch_size", "rebalance_interval", "homogeneous_steps", "emulated_steps", "capped_steps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be a positive integer")
    for flag in ("homogeneous_runs", "emulated_runs", "capped_runs"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} must be 0 or more")
    result = run(args)
    print_result(result)
    if args.json:
        _save(args, result)
        print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
