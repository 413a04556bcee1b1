"""Frames and figures of the app, called directly on small hand-made DataFrames.

The frames are the numbers (throughput, efficiency, per-rank speed, buckets); the figures
draw them. Both are pure, so these tests need no browser and no Ray.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from hetero_ray.reporting import figures, frames
from tests.helpers import make_steps


# ---- frames ---------------------------------------------------------------------------------

def test_cluster_steps_measures_achieved_ideal_and_efficiency():
    # rank 0: 6 samples in 60 ms (100/s), rank 1: 2 samples in 40 ms (50/s); steps take 70 ms.
    table = frames.cluster_steps(make_steps(30), smooth_steps=1)
    assert list(table["global_step"]) == list(range(30))
    assert table["samples"].iloc[0] == 8 and table["num_ranks"].iloc[0] == 2
    assert table["ideal_samples_per_s"].iloc[5] == pytest.approx(150)
    assert table["efficiency"].iloc[5] == pytest.approx((8 / 0.07) / 150)
    # wall-clock rate: 8 samples every 70 ms
    assert table["samples_per_s"].iloc[10] == pytest.approx(8 / 0.07)
    assert table["elapsed_s"].iloc[0] == pytest.approx(0.07)
    assert table["loss"].iloc[3] == pytest.approx(2.0 - 0.03)


def test_cluster_steps_do_not_depend_on_row_order():
    steps = make_steps(25)
    shuffled = steps.sample(frac=1.0, random_state=1)
    pd.testing.assert_frame_equal(frames.cluster_steps(steps), frames.cluster_steps(shuffled))


def test_trailing_rates_never_change_when_steps_are_added():
    """What lets a live page append points: a point depends only on steps up to it."""
    long = frames.cluster_steps(make_steps(40))
    short = frames.cluster_steps(make_steps(25))
    pd.testing.assert_frame_equal(short, long.iloc[:25].reset_index(drop=True), check_exact=False)


def test_a_restart_starts_a_new_rate_window():
    steps = pd.concat([make_steps(10), make_steps(10, first_step=10, attempt=1, start_wall=5000.0)])
    table = frames.cluster_steps(steps)
    assert table["samples_per_s"].max() < 1000  # the 4000 s gap is not counted as a slow step


def test_complete_steps_drop_the_steps_not_every_rank_reported():
    steps = make_steps(10)
    partial = steps[~((steps["rank"] == 1) & (steps["global_step"] >= 7))]
    assert frames.complete_steps(partial)["global_step"].max() == 6
    assert len(frames.complete_steps(steps)) == len(steps)


def test_rank_steps_measure_each_ranks_own_speed():
    table = frames.rank_steps(make_steps(5), smooth_steps=1)
    assert table[table["rank"] == 0]["samples_per_s"].iloc[0] == pytest.approx(100)
    assert table[table["rank"] == 1]["samples_per_s"].iloc[0] == pytest.approx(50)


@pytest.mark.parametrize("steps,width", [(10, 1), (1500, 1), (1501, 2), (3000, 2), (3001, 4), (1_000_000, 1024)])
def test_bucket_width_is_a_power_of_two_keeping_points_bounded(steps, width):
    assert frames.bucket_width(steps) == width
    assert math.ceil(steps / width) <= frames.MAX_POINTS


def test_downsample_means_buckets_and_can_leave_out_the_unfinished_one():
    df = pd.DataFrame({"global_step": np.arange(10), "value": np.arange(10, dtype=float), "name": list("abcdefghij")})
    out = frames.downsample(df, max_points=4)
    assert out.attrs["bucket_steps"] == 4
    assert list(out["global_step"]) == [0, 4, 8] and list(out["value"]) == [1.5, 5.5, 8.5]
    assert list(out["name"]) == ["d", "h", "j"]
    live = frames.downsample(df, max_points=4, drop_partial=True)
    assert list(live["global_step"]) == [0, 4]


def test_downsample_per_rank():
    ranks = frames.rank_steps(make_steps(3000))
    out = frames.downsample(ranks, by="rank")
    assert out.attrs["bucket_steps"] == 2 and len(out) == 3000
    assert set(out["rank"]) == {0, 1}


def test_step_breakdown_uses_recent_medians():
    table = frames.step_breakdown(make_steps(100), window_steps=10)
    assert list(table["rank"]) == [0, 1]
    assert table["forward_time_s"].iloc[0] == pytest.approx(0.02)
    assert table["wait_time_s"].iloc[1] == pytest.approx(0.07 - 0.04 - 0.002)


def test_plan_changes_list_only_real_changes():
    plans = pd.DataFrame({"plan_version": [0, 1, 2, 3], "first_global_step": [0, 10, 20, 30],
                          "local_batch_sizes": [[4, 4], [5, 3], [5, 3], [6, 2]], "reason": ["a", "b", "c", "d"]})
    changes = frames.plan_changes(plans)
    assert list(changes["first_global_step"]) == [10, 30] and list(changes["split"]) == ["5/3", "6/2"]


def test_the_plan_table_marks_a_trials_check_and_reads_a_run_recorded_before_it():
    plans = pd.DataFrame({"plan_version": [1, 0, 2], "first_global_step": [10, 0, 17], "attempt": [0, 0, 0],
                          "local_batch_sizes": [[9, 3], [6, 6], [6, 6]], "reason": ["trial", "first", "rollback"],
                          "wall_time": [1.0, 0.0, 2.0], "check_after_steps": [7, None, None]})
    table = frames.plan_table(plans)
    assert list(table.columns) == frames.PLAN_COLUMNS
    assert list(table["plan_version"]) == [0, 1, 2] and list(table["check_after_steps"]) == ["", 7, ""]
    older = frames.plan_table(plans.drop(columns="check_after_steps"))
    assert list(older["check_after_steps"]) == ["", "", ""]


def test_epoch_progress_gives_totals_and_an_eta():
    config = {"epochs": 4, "num_samples": 80, "batch_size": 8, "dataset": "synthetic_image"}
    progress = frames.epoch_progress(make_steps(20), pd.DataFrame(columns=["epoch"]), config)
    assert progress["total_steps"] == 40 and progress["global_step"] == 20 and progress["fraction"] == 0.5
    assert progress["eta_s"] == pytest.approx(20 * 0.07, rel=0.05)


def test_epoch_progress_of_a_file_dataset_learns_the_epoch_length():
    progress = frames.epoch_progress(make_steps(25), pd.DataFrame(columns=["epoch"]), {"epochs": 3, "dataset": "cifar10"})
    assert progress["total_steps"] == 30


def test_nodes_frame_marks_live_and_idle_nodes():
    steps = make_steps(5)
    nodes = [{"node_id": "node-0", "hostname": "gpu-box", "cpu": {"model": "EPYC", "physical_cores": 32},
              "devices": [{"kind": "gpu", "name": "H100"}]}]
    last = steps["wall_time"].max()
    table = frames.nodes_frame(nodes, steps, live=True, now=last + 1).set_index("node_id")
    assert table.loc["node-0", "state"] == "live" and table.loc["node-0", "devices"] == "H100"
    assert table.loc["node-1", "status"] == "not profiled"
    assert set(frames.nodes_frame(nodes, steps, live=True, now=last + 60)["state"]) == {"idle"}
    assert set(frames.nodes_frame(nodes, steps, live=False, now=last)["state"]) == {"idle"}


def test_devices_frame_flattens_the_profile():
    nodes = [{"node_id": "n", "hostname": "h", "devices": [
        {"kind": "gpu", "index": 0, "name": "A100", "matmul_tflops_fp32": 19.5, "memory_total_bytes": 40e9}]}]
    table = frames.devices_frame(nodes)
    assert table["memory_total_gb"].iloc[0] == 40 and table["matmul_tflops_fp32"].iloc[0] == 19.5
    assert frames.devices_frame([]).empty


def test_gpu_frame_is_empty_on_cpu_runs():
    assert frames.gpu_frame(make_steps(5)).empty
    assert len(frames.gpu_frame(make_steps(5, gpu=True))) == 10


def test_time_to_metric_uses_the_best_value_every_run_reached():
    fast = pd.DataFrame({"eval_metric": [0.5, 0.8], "elapsed_s": [10.0, 20.0]})
    slow = pd.DataFrame({"eval_metric": [0.4, 0.7], "elapsed_s": [15.0, 30.0]})
    target, times = frames.time_to_metric({"fast": fast, "slow": slow})
    assert target == 0.7 and times == {"fast": 20.0, "slow": 30.0}
    assert frames.time_to_metric({"a": pd.DataFrame({"eval_metric": [], "elapsed_s": []})}) == (None, {"a": None})


# ---- figures --------------------------------------------------------------------------------

def cluster_plot(num_steps=30):
    return frames.downsample(frames.cluster_steps(make_steps(num_steps)))


def legend(fig) -> list[str]:
    return [trace.name for trace in fig.data]


def test_throughput_figure_draws_achieved_and_ideal_and_may_be_appended_to():
    fig = figures.throughput_figure(cluster_plot())
    assert legend(fig) == ["achieved", "ideal (no waiting)"]
    assert len(fig.data[0].x) == 30 and fig.layout.meta["append"]


@pytest.mark.parametrize("make", [
    lambda empty: figures.throughput_figure(empty),
    lambda empty: figures.loss_figure(empty, pd.DataFrame(columns=["eval_loss"])),
    lambda empty: figures.efficiency_figure(empty, frames.plan_changes(pd.DataFrame())),
])
def test_empty_frames_draw_an_explained_empty_state(make):
    fig = make(frames.cluster_steps(make_steps(0)))
    assert fig.layout.meta["empty"] and "No steps recorded yet" in fig.layout.annotations[0].text


def test_loss_figure_adds_eval_loss_per_epoch():
    evals = frames.eval_points(pd.DataFrame({
        "epoch": [0, 1], "global_step": [9, 19], "attempt": [0, 0], "train_loss": [2, 1], "eval_loss": [2.1, 1.1],
        "eval_metric": [0.3, 0.5], "eval_metric_name": ["accuracy"] * 2, "wall_time": [1001.0, 1002.0]}), 1000.0)
    fig = figures.loss_figure(cluster_plot(), evals)
    assert legend(fig) == ["train loss", "eval loss"]
    metric = figures.eval_metric_figure(evals)
    assert list(metric.data[0].x) == [1, 2] and "accuracy" in metric.layout.title.text


def test_ranks_figures_follow_the_selection():
    ranks = frames.rank_steps(make_steps(20))
    assert len(figures.busy_wait_figure(ranks).data) == 4  # busy + waiting per rank
    only_one = figures.busy_wait_figure(ranks, [1])
    assert len(only_one.data) == 2 and only_one.layout.annotations[0].text == "rank 1"
    assert "No rank selected" in figures.busy_wait_figure(ranks, []).layout.annotations[0].text
    assert legend(figures.rank_throughput_figure(ranks, [0])) == ["rank 0"]


def test_batch_size_figure_marks_plan_changes():
    plans = pd.DataFrame({"plan_version": [0, 1], "first_global_step": [0, 12],
                          "local_batch_sizes": [[6, 2], [5, 3]], "reason": ["first", "rebalanced"]})
    fig = figures.batch_size_figure(frames.rank_steps(make_steps(20)), frames.plan_changes(plans))
    assert legend(fig) == ["rank 0", "rank 1"]
    assert len(fig.layout.shapes) == 1 and fig.layout.shapes[0].x0 == 12
    assert "plan changes" in fig.layout.title.text


def test_step_breakdown_figure_stacks_the_parts_in_ms():
    fig = figures.step_breakdown_figure(frames.step_breakdown(make_steps(20)))
    assert legend(fig) == ["data", "forward", "backward", "emulation pad", "optimizer", "waiting"]
    assert fig.layout.barmode == "stack"
    assert fig.data[1].x[0] == pytest.approx(20)  # forward of rank 0: 20 ms


def decisions(reason="gain 12 % above threshold"):
    return frames.decisions_frame(pd.DataFrame({
        "global_step": [20, 10], "policy": ["optimal"] * 2, "adopted": [True, False], "reason": [reason, "too small"],
        "plan_version": [1, 0], "local_batch_sizes": [[5, 3], [6, 2]], "predicted_step_time_s": [0.05, 0.07],
        "current_predicted_step_time_s": [0.06, 0.071], "predicted_gain": [0.12, 0.01],
        "achieved_step_time_s": [0.052, 0.07], "wall_time": [2.0, 1.0]}))


def test_decisions_figure_separates_adopted_and_kept():
    fig = figures.decisions_figure(decisions())
    assert legend(fig) == ["adopted", "kept current plan"]
    assert list(fig.data[0].x) == [20] and "12 %" in fig.data[0].text[0]


def test_text_from_run_files_is_escaped():
    fig = figures.decisions_figure(decisions("<img src=x onerror=alert(1)>"))
    assert "<img" not in fig.data[0].text[0] and "&lt;img" in fig.data[0].text[0]


def test_predicted_vs_achieved_figure():
    fig = figures.predicted_vs_achieved_figure(decisions(), cluster_plot())
    assert legend(fig) == ["measured step time", "predicted (proposed plan)", "predicted (current plan)", "achieved"]
    assert list(fig.data[1].x) == [10, 20]  # in step order


def test_efficiency_figure_is_a_fraction():
    fig = figures.efficiency_figure(cluster_plot(), frames.plan_changes(pd.DataFrame()))
    assert list(fig.layout.yaxis.range) == [0, 1.05]
    assert all(0 < v <= 1 for v in fig.data[0].y)


def test_gpu_figure_explains_its_empty_state_and_draws_four_panels():
    assert "ran on CPUs" in figures.gpu_figure(frames.gpu_frame(make_steps(5))).layout.annotations[0].text
    fig = figures.gpu_figure(frames.gpu_frame(make_steps(5, gpu=True)))
    names = {a.text for a in fig.layout.annotations}
    assert {"utilisation %", "memory used GB", "temperature °C", "power W"} <= names
    assert len(fig.data) == 2 * 4 + 2  # a trace per rank and panel, plus memory totals


def test_capabilities_and_rank_speed_figures():
    devices = frames.devices_frame([{"node_id": "n", "hostname": "h", "devices": [
        {"kind": "gpu", "index": 0, "name": "A100", "matmul_tflops_fp32": 19.5, "matmul_tflops_bf16": 250.0}]}])
    fig = figures.capabilities_figure(devices)
    assert legend(fig) == ["fp32 TFLOP/s", "bf16 TFLOP/s"] and list(fig.data[0].x) == ["h gpu0: A100"]
    assert "No device profile" in figures.capabilities_figure(frames.devices_frame([])).layout.annotations[0].text
    speed = figures.rank_speed_figure(frames.rank_table(make_steps(20)))
    assert list(speed.data[0].x) == ["rank 0", "rank 1"] and list(speed.data[0].y) == [100, 50]


def test_compare_figures_draw_one_line_per_run():
    series = {"static": cluster_plot(20), "optimal": cluster_plot(30)}
    fig = figures.compare_series_figure(series, "samples_per_s", "Cluster samples/s", "samples/s")
    assert legend(fig) == ["static", "optimal"]
    evals = {"static": pd.DataFrame({"eval_metric": [0.5], "elapsed_s": [3.0], "eval_metric_name": ["accuracy"]})}
    accuracy = figures.time_to_accuracy_figure(evals, target=0.5)
    assert legend(accuracy) == ["static"] and accuracy.layout.shapes[0].y0 == 0.5
    assert "Choose two or more runs" in figures.compare_series_figure({}, "x", "t", "y").layout.annotations[0].text
