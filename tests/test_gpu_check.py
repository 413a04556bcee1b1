"""benchmarks/gpu_check.py where there is no GPU: a clear exit 2; its table from fake and real rows."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import Row

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100 = os.path.join(REPO_ROOT, "tests", "data", "h100_resnet18_nodes.json")


def test_without_a_gpu_it_says_so_and_exits_2_having_run_nothing(tmp_path):
    log_dir = tmp_path / "check"
    done = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "benchmarks", "gpu_check.py"),
                           "--log-dir", str(log_dir)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO_ROOT, CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == gpu_check.NO_GPU_EXIT_CODE
    assert "no CUDA GPU on this machine" in done.stderr and "Nothing was run" in done.stderr
    assert not log_dir.exists()


def test_the_table_has_one_row_per_check_and_ratios_to_the_gpu_alone():
    rows = gpu_check.throughput_rows({"GPU alone": 132263.0, "GPU + 3 CPU, optimal": 64181.0,
                                      "GPU + 3 CPU, static": None})
    assert [r.ratio for r in rows] == [pytest.approx(1.0), pytest.approx(0.485, abs=1e-3), None]
    assert [r.status for r in rows] == ["ok", "ok", "FAILED"]
    table = gpu_check.format_check_table([Row("nvml", "inventory gpu0", "NVIDIA H100"), *rows])
    lines = table.splitlines()
    assert lines[0].split() == ["stage", "check", "value", "vs", "GPU", "alone", "status"]
    assert len(lines) == 2 + 4 and "132,263 samples/s" in lines[3] and "0.49×" in lines[4]
    assert gpu_check.exit_code(rows) == gpu_check.FAILED_EXIT_CODE
    assert gpu_check.exit_code(rows[:2]) == 0


def test_curve_rows_from_hetero_ray_plan_on_the_h100_profile():
    from hetero_ray.cli.plan import load_profile, plan_report

    plan = plan_report(load_profile(H100), 512, None, "optimal", H100)
    (row,) = gpu_check.curve_rows(plan)
    assert row.check.startswith("curve gpu0 NVIDIA H100") and "b = 8,16,32,64" in row.check
    assert row.value.startswith("flat") and row.status == "ok"  # within 10 % at every probed size
    bad = {"devices": [{**plan["devices"][0], "max_rel_error": 0.4}]}
    assert gpu_check.curve_rows(bad)[0].status == "FAILED"


def test_the_all_reduce_is_the_least_wait_of_a_step():
    steps = pd.DataFrame({"global_step": [0, 0, 1, 1, 2, 2], "rank": [0, 1] * 3,
                          "wait_time_s": [0.010, 0.003, 0.012, 0.002, 0.011, 0.004],
                          "local_batch_size": [400, 112] * 3})
    assert gpu_check.comm_time_s(steps) == pytest.approx(0.003)
    assert gpu_check.comm_time_s(steps[steps["rank"] == 0]) is None  # one rank: no all-reduce
    # rank 1 left out from step 3 on: it waits for no all-reduce, and those steps teach none
    out = pd.concat([steps, pd.DataFrame({"global_step": [3, 3, 4, 4], "rank": [0, 1] * 2,
                                          "wait_time_s": [0.0, 0.0001, 0.0, 0.0001],
                                          "local_batch_size": [512, 0] * 2})])
    assert gpu_check.comm_time_s(out) == pytest.approx(0.003)
    assert gpu_check.comm_time_s(out[out["global_step"] >= 3]) is None


def test_the_best_subset_leaves_out_ranks_whose_all_reduce_costs_more_than_they_add():
    gpu = {"node_id": "g", "kind": "gpu", "index": 0, "alpha_s": 0.0, "beta_s_per_sample": 0.00001,
           "floor_s": 0.003, "max_batch_size": None}
    cpu = {"node_id": "c", "kind": "cpu", "index": 0, "alpha_s": 0.002, "beta_s_per_sample": 0.0005,
           "floor_s": 0.0, "max_batch_size": None}
    plan = {"devices": [gpu, cpu], "workers": [{"node_id": "g", "kind": "gpu", "index": 0}] +
            [{"node_id": "c", "kind": "cpu", "index": 0}] * 3}
    measured = {"GPU alone": 132263.0, "GPU + 3 CPU, optimal": 64181.0}
    row = gpu_check.best_subset_row(plan, 512, 0.0026, measured)
    assert row.value.startswith("ranks gpu0:") and "best measured: GPU alone" in row.value
    assert row.ratio == pytest.approx(1.0)
    # free communication: every rank helps
    assert gpu_check.best_subset_row(plan, 512, 0.0, measured).value.startswith("ranks gpu0,cpu1,cpu2,cpu3:")
    assert gpu_check.best_subset_row({}, 512, None, measured).status == "skipped"


def test_a_runs_final_plan_and_the_ranks_it_left_out_are_said_beside_its_figure():
    summary = {"final_plan": [512, 0, 0, 0], "left_out_ranks": [1, 2, 3], "plan_changes": 2}
    assert gpu_check.plan_text(summary) == "final shares 512/0/0/0, ranks 1,2,3 out, 2 plan changes"
    assert gpu_check.plan_text({"final_plan": [200, 312], "left_out_ranks": []}) == \
        "final shares 200/312, no rank out, 0 plan changes"
    assert gpu_check.plan_text({"final_plan": [512]}) == ""
    rows = gpu_check.throughput_rows({"GPU alone": 100.0, "GPU + 3 CPU, optimal": 98.0},
                                     plans={"GPU + 3 CPU, optimal": gpu_check.plan_text(summary)})
    assert rows[0].value == "100 samples/s"
    assert rows[1].value == "98 samples/s; final shares 512/0/0/0, ranks 1,2,3 out, 2 plan changes"


def test_the_mean_step_is_rank_0s_over_the_second_half_with_and_without_its_pauses():
    ends = [0.0, 0.1, 0.2, 0.3, 0.305, 0.310, 0.315, 0.9, 0.905]  # a 585 ms pause in the second half
    steps = pd.DataFrame({"global_step": list(range(9)) * 2, "rank": [0] * 9 + [1] * 9,
                          "wall_time": ends + [e + 7 for e in ends]})
    assert gpu_check.step_text(steps) == "mean step 150.00 ms, 5.00 ms without its 1 pause over 100 ms"
    assert gpu_check.step_text(steps[steps["global_step"] < 7]) == "mean step 5.00 ms"
    assert gpu_check.step_text(steps[steps["rank"] == 1]) == ""
