"""Ranks left out, where a person sees them: the progress line, the closing summary and the
dashboard's decisions table (no Ray)."""

from __future__ import annotations

import pandas as pd

from hetero_ray.reporting import frames
from hetero_ray.reporting.summary_text import run_summary_text
from hetero_ray.runtime.progress import format_progress


def _rank(b, probe=0):
    return {"local_batch_size": b, "busy_time_s": 0.01, "step_time_s": 0.02, "node_id": "n", "probe_batch_size": probe}


def test_the_progress_line_names_the_ranks_left_out():
    progress = {"global_step": 9, "epoch": 0, "samples_per_s": 100.0, "loss": None, "plan_version": 2,
                "ranks": {0: _rank(256), 1: _rank(0, probe=12), 2: _rank(0, probe=12)}}
    line = format_progress(progress, 100)
    assert "shares 256/0/0" in line and "out 1,2" in line
    progress["ranks"] = {0: _rank(232), 1: _rank(12), 2: _rank(12)}
    assert "out " not in format_progress(progress, 100)


def test_the_summary_says_which_ranks_the_final_plan_leaves_out():
    summary = {"experiment_name": "x", "status": "finished", "wall_time_s": 1.0, "model": "m", "dataset": "d",
               "global_batch_size": 256, "num_workers": 3, "policy": "optimal", "global_steps": 10, "samples": 2560,
               "steady_samples_per_s": 100.0, "plan_changes": 1, "restarts": 0, "run_dir": "/tmp/runs/x",
               "left_out_ranks": [1, 2]}
    assert "leaves rank(s) 1, 2 out" in run_summary_text(summary)
    assert "leaves" not in run_summary_text({**summary, "left_out_ranks": []})


def test_the_summary_shows_the_plans_beside_the_split_of_the_emulated_speeds():
    """What `make demo` prints, so a reader can check the plan against the speeds asked for."""
    summary = {"experiment_name": "x", "status": "finished", "wall_time_s": 1.0, "model": "m", "dataset": "d",
               "global_batch_size": 96, "num_workers": 4, "policy": "optimal", "global_steps": 10, "samples": 960,
               "steady_samples_per_s": 100.0, "plan_changes": 2, "restarts": 0, "run_dir": "/tmp/runs/x",
               "first_plan": [24, 24, 24, 24], "final_plan": [37, 36, 16, 7], "emulate_speeds": [1, 1, 0.5, 0.25]}
    text = run_summary_text(summary)
    assert "plans: first 24/24/24/24, final 37/36/16/7; by the emulated speeds alone 35/35/17/9" in text
    assert "by the emulated speeds" not in run_summary_text({**summary, "emulate_speeds": None})
    assert "plans:" not in run_summary_text({**summary, "first_plan": None})


def test_the_decisions_table_has_a_left_out_column():
    table = frames.decisions_frame(pd.DataFrame({
        "global_step": [10, 20], "policy": ["optimal"] * 2, "adopted": [True, True], "reason": ["a", "b"],
        "plan_version": [1, 2], "local_batch_sizes": [[256, 0, 0], [86, 85, 85]],
        "predicted_step_time_s": [0.05, 0.03], "current_predicted_step_time_s": [0.06, 0.05],
        "predicted_gain": [0.12, 0.4], "achieved_step_time_s": [0.05, 0.03], "wall_time": [1.0, 2.0],
        "left_out_ranks": [[1, 2], []]}))
    assert table["left_out"].tolist() == ["1, 2", ""] and table["split"].tolist() == ["256/0/0", "86/85/85"]
