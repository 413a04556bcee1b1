"""Plain-text summaries for the terminal."""

from __future__ import annotations

import os
from typing import Any

from hetero_ray.formatting import format_shares, format_table
from hetero_ray.planning.plan import largest_remainder


def run_summary_text(summary: dict[str, Any]) -> str:
    lines = [
        f"== {summary['experiment_name']}: {summary['status']} in {summary['wall_time_s']:.1f} s ==",
        f"{summary['model']} on {summary['dataset']}, global batch {summary['global_batch_size']}, "
        f"{summary['num_workers']} workers, policy {summary['policy']}"
        + (f", emulated speeds {summary['emulate_speeds']}" if summary.get("emulate_speeds") else ""),
        f"{summary['global_steps']} steps, {summary['samples']} samples, "
        f"steady throughput {_num(summary.get('steady_samples_per_s'))} samples/s, "
        f"{summary['plan_changes']} plan change(s), {summary['restarts']} restart(s)"
        + (f"; the final plan leaves rank(s) {', '.join(map(str, summary['left_out_ranks']))} out (no samples, "
           "no all-reduce)" if summary.get("left_out_ranks") else ""),
    ]
    plans = _plans_beside_the_speeds(summary)
    if plans:
        lines.append(plans)
    if summary.get("final_eval_metric") is not None:
        lines.append(f"final train loss {summary['final_train_loss']:.4f}, "
                     f"eval {summary['eval_metric_name']} {summary['final_eval_metric']:.4f}")
    ranks = summary.get("ranks") or []
    if ranks:
        lines.append("")
        lines.append(format_table(
            ["rank", "node", "local batch", "busy ms", "wait ms", "samples/s (own)"],
            [[r["rank"], r["node_id"][:8], r["local_batch_size"], _ms(r["busy_time_s"]),
              _ms(r["wait_time_s"]), _num(r["samples_per_s"])] for r in ranks],
        ))
    verdicts = [v for v in summary.get("bottlenecks") or [] if "verdict" in v]
    if verdicts:
        from hetero_ray.bottlenecks.classify import Verdict, format_verdicts

        lines.append("")
        lines.append(format_verdicts([Verdict.from_dict(v) for v in verdicts]))
    lines.append("")
    lines.append(f"results: {summary['run_dir']}  (summary.json, steps.parquet, plans.parquet, "
                 "epochs.parquet, model_final.pt)")
    runs_dir = os.path.dirname(summary["run_dir"])
    lines.append(f"look at it: hetero-ray dashboard --runs-dir {runs_dir}   (then http://127.0.0.1:8050)")
    lines.append(f"            hetero-ray report {summary['run_dir']}   (one HTML file with the plots)")
    if summary.get("error"):
        lines.append(f"error: {summary['error']}")
    return "\n".join(lines)


def _plans_beside_the_speeds(summary: dict[str, Any]) -> str:
    """The first and final plans beside the split the emulated speeds alone would give,
    so a reader can check the plan against the speeds they asked for."""
    first, final, speeds = summary.get("first_plan"), summary.get("final_plan"), summary.get("emulate_speeds")
    if not first or not final:
        return ""
    text = f"plans: first {format_shares(first)}, final {format_shares(final)}"
    if speeds and len(speeds) == len(final):
        ideal = largest_remainder([float(s) for s in speeds], int(sum(final)))
        text += (f"; by the emulated speeds alone {format_shares(ideal)} (the planner also weighs each step's fixed cost "
                 "and the all-reduce, and leaves out a rank that costs more than it adds)")
    return text


def print_run_summary(summary: dict[str, Any]) -> None:
    print(run_summary_text(summary), flush=True)


def _num(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"
