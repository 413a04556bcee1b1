"""The figures of benchmarks/stability.py from step and decision tables (pure: no Ray)."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks.stability import predicted_vs_measured, run_figures


def steps_table(plan_by_step, step_time_by_version, busy=(0.8, 1.0)) -> pd.DataFrame:
    rows = []
    for step, version in enumerate(plan_by_step):
        t = step_time_by_version[version]
        for rank, share in enumerate(busy):
            rows.append({"global_step": step, "rank": rank, "plan_version": version, "local_batch_size": 8,
                         "step_time_s": t, "busy_time_s": share * t * (1.1 if step % 2 and rank else 1.0)})
    return pd.DataFrame(rows)


def test_a_worse_plan_is_found_with_how_long_it_stayed():
    versions = [0] * 40 + [1] * 30 + [2] * 30
    steps = steps_table(versions, {0: 0.332, 1: 0.381, 2: 0.330})
    figures = run_figures(steps, pd.DataFrame(columns=["global_step", "plan_version", "adopted",
                                                       "current_predicted_step_time_s"]), interval=20)
    assert figures["plan_changes"] == 2
    assert [w["plan_version"] for w in figures["worse_plans"]] == [1]  # v2 is faster than v1: fine
    assert figures["longest_worse_plan_steps"] == 30
    assert figures["worse_plans"][0]["step_time_s"] == pytest.approx(0.381)
    assert figures["predicted_vs_measured"] is None  # no decision predicted the final plan


def test_predicted_against_the_steps_after_the_last_decision_on_the_final_plan():
    steps = steps_table([0] * 20 + [1] * 40, {0: 0.2, 1: 0.1})
    decisions = pd.DataFrame([
        {"global_step": 19, "plan_version": 1, "adopted": True, "current_predicted_step_time_s": 0.2},
        {"global_step": 39, "plan_version": 1, "adopted": False, "current_predicted_step_time_s": 0.1},
    ])
    pvm = predicted_vs_measured(steps, decisions, interval=10)
    assert pvm["decided_at"] == 39 and pvm["num_steps"] == 10
    # rank 1's busy is 1.0·t on even steps and 1.1·t on odd ones: mean 1.05·t, each step's max the same
    assert pvm["vs_slowest_rank_mean_busy"] == pytest.approx(1 / 1.05)
    assert pvm["vs_mean_step_time"] == pytest.approx(1.0)  # no rest of the step measured: none added


def test_the_step_time_predicted_adds_the_rest_of_the_step_measured_before_the_decision():
    steps = steps_table([0] * 40, {0: 0.1})
    decisions = pd.DataFrame([{"global_step": 19, "plan_version": 0, "adopted": False,
                               "current_predicted_step_time_s": 0.08, "rest_of_step_s": 0.02}])
    pvm = predicted_vs_measured(steps, decisions, interval=10)
    assert pvm["predicted_step_time_s"] == pytest.approx(0.1)
    assert pvm["vs_mean_step_time"] == pytest.approx(1.0)
    assert pvm["vs_mean_slowest_busy"] == pytest.approx(0.08 / 0.105)  # rank 1: 1.0·t and 1.1·t in turn


def test_a_plan_adopted_too_late_to_be_kept_is_judged_by_the_prediction_that_adopted_it():
    steps = steps_table([0] * 40 + [1] * 10, {0: 0.2, 1: 0.1})
    decisions = pd.DataFrame([
        {"global_step": 19, "plan_version": 0, "adopted": False, "current_predicted_step_time_s": 0.2,
         "predicted_step_time_s": 0.1, "rest_of_step_s": 0.01},
        {"global_step": 39, "plan_version": 1, "adopted": True, "current_predicted_step_time_s": 0.2,
         "predicted_step_time_s": 0.09, "rest_of_step_s": 0.01},
    ])
    pvm = predicted_vs_measured(steps, decisions, interval=20)
    assert pvm["basis"] == "adopted" and pvm["decided_at"] == 39 and pvm["num_steps"] == 10
    assert pvm["vs_mean_step_time"] == pytest.approx(1.0)


def test_a_row_without_the_rest_of_the_step_predicts_nothing():
    # (tables from before rollback rows carried it)
    steps = steps_table([0] * 40 + [1] * 10, {0: 0.2, 1: 0.1})
    decisions = pd.DataFrame([{"global_step": 39, "plan_version": 1, "adopted": True,
                               "current_predicted_step_time_s": 0.2, "predicted_step_time_s": 0.1,
                               "rest_of_step_s": None}])
    assert predicted_vs_measured(steps, decisions, interval=20) is None
