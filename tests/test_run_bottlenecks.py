"""The one bottleneck rule (driver, store and app): the window, the last plan, the caps."""

from __future__ import annotations

import pandas as pd

from hetero_ray.bottlenecks.classify import BALANCED, MEMORY_BOUND, STRAGGLER, BottleneckThresholds
from hetero_ray.bottlenecks.judge import judge_run
from hetero_ray.runs.records import STEP_COLUMNS


def steps(plans: list[tuple[int, list[float]]], batch: int = 32, nodes: tuple[str, ...] = ("a", "b")) -> pd.DataFrame:
    """``plans``: (number of steps, per-rank seconds per sample) in order; plan versions 0, 1, …"""
    rows, global_step = [], 0
    for version, (count, costs) in enumerate(plans):
        for _ in range(count):
            busy = [batch * c for c in costs]
            step_time = max(busy) + 0.003
            for rank, b in enumerate(busy):
                row = {c: None for c in STEP_COLUMNS}
                row.update(global_step=global_step, rank=rank, node_id=nodes[rank], attempt=0,
                           local_batch_size=batch, plan_version=version, busy_time_s=b, data_time_s=0.0,
                           optimizer_time_s=0.001, step_time_s=step_time, wait_time_s=step_time - b - 0.001)
                rows.append(row)
            global_step += 1
    return pd.DataFrame(rows)


def profiles(**cpu_caps: int) -> list[dict]:
    """Node dicts as ``nodes.json`` holds them: one CPU device per node, with its cap."""
    return [{"node_id": node_id, "status": "ok", "devices": [{"kind": "cpu", "index": 0, "max_batch_size": cap}]}
            for node_id, cap in cpu_caps.items()]


def verdicts(frame: pd.DataFrame, nodes=None) -> list[str]:
    return [v["verdict"] for v in judge_run(frame, nodes)]


MIN_STEPS = BottleneckThresholds().min_steps


def test_only_the_plan_in_force_is_judged():
    """The shares in force are what a verdict advises on: the steps of an older plan (here a
    straggler the balancer has since fixed) must not speak for them."""
    straggling_then_even = steps([(40, [0.001, 0.003]), (MIN_STEPS, [0.001, 0.001])])
    assert verdicts(straggling_then_even) == [BALANCED, BALANCED]
    even_then_straggling = steps([(40, [0.001, 0.001]), (MIN_STEPS, [0.001, 0.003])])
    assert verdicts(even_then_straggling) == [BALANCED, STRAGGLER]


def test_a_plan_in_force_too_new_to_judge_says_so():
    straggling_then_even = steps([(40, [0.001, 0.003]), (MIN_STEPS - 2, [0.001, 0.001])])
    judged = judge_run(straggling_then_even)
    assert [v["verdict"] for v in judged] == [BALANCED, BALANCED]  # not the old plan's straggler
    assert all("too few to judge" in v["recommendation"] for v in judged)


def test_a_recent_window_gives_the_verdicts_of_the_whole_run():
    run = steps([(300, [0.001, 0.003]), (30, [0.001, 0.001]), (25, [0.001, 0.004])])
    recent = run[run["global_step"] >= run["global_step"].max() - 60]
    assert judge_run(recent) == judge_run(run)


def test_ranks_sharing_a_node_share_its_cap():
    frame = steps([(30, [0.001, 0.001])], batch=32, nodes=("a", "a"))
    assert verdicts(frame) == [BALANCED, BALANCED]
    assert verdicts(frame, profiles(a=64)) == [MEMORY_BOUND, MEMORY_BOUND]  # 32 of a cap of 64 // 2
    assert verdicts(frame, profiles(a=128)) == [BALANCED, BALANCED]
    assert judge_run(frame, profiles(a=64))[0]["evidence"]["memory_cap"] == 32


def test_the_caps_are_the_planners():
    """The verdicts use the caps the planner gives the ranks (planning.capacity): a GPU rank
    has its own device's cap, not a share of the node's RAM."""
    frame = steps([(30, [0.001, 0.001])], batch=32, nodes=("g", "g"))
    gpus = [{"node_id": "g", "status": "ok", "devices": [
        {"kind": "cpu", "index": 0, "max_batch_size": 40},
        *({"kind": "gpu", "index": i, "max_batch_size": 34, "alpha_s": 0.001, "beta_s_per_sample": 1e-4}
          for i in range(2))]}]
    assert [v["evidence"]["memory_cap"] for v in judge_run(frame, gpus)] == [34, 34]


def test_no_steps_no_verdicts():
    assert judge_run(pd.DataFrame(columns=list(STEP_COLUMNS))) == []
