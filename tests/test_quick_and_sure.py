"""benchmarks/quick_and_sure.py's rows: figures read from the benchmarks' own outputs,
each against its target (no Ray; the outputs are written here as the benchmarks write them)."""

from __future__ import annotations

import json

from benchmarks import quick_and_sure as qs


def _quota_run(static: float, optimal: float, cold_of_profiled: float) -> dict:
    return {"runs": [{"label": "static", "samples_per_s": static}, {"label": "optimal", "samples_per_s": optimal}],
            "cold_start": {"of_profiled": cold_of_profiled}}


def test_the_worst_quota_run_is_judged_not_the_best():
    rows = qs.quota_rows([_quota_run(800, 1600, 1.0), _quota_run(800, 1400, 1.2), _quota_run(800, 1700, 0.95)])
    static, profiled = rows
    assert static[2].startswith("1.75 (runs 2.00, 1.75, 2.12)") and static[4] == "NOT met"
    assert profiled[2].startswith("0.83") and profiled[4] == "NOT met"  # profiled at 1/1.2 of a cold start
    assert qs.quota_rows([_quota_run(800, 1600, 1.0)])[0][4] == "met"


def test_the_first_step_is_judged_by_the_gap_of_the_medians():
    result = {"gaps_s": [3.3, 3.6, 2.4], "gap_of_medians_s": 3.6}
    row = qs.first_step_row(result)
    assert row[2] == "+3.6 s (per round +3.3, +3.6, +2.4)" and row[3] == "3 rounds" and row[4] == "NOT met"
    assert qs.first_step_row({**result, "gap_of_medians_s": 2.9})[4] == "met"


def test_the_demo_row_puts_its_plans_beside_the_speeds_split(tmp_path):
    summary = {"emulate_speeds": [1.0, 1.0, 0.5, 0.25], "first_plan": [36, 36, 17, 7], "final_plan": [37, 36, 16, 7],
               "plan_changes": 1, "left_out_ranks": []}
    row = qs.demo_row(summary)
    assert row[2].startswith("36/36/17/7 → 37/36/16/7 (35/35/17/9); 1 plan change(s)") and row[4] == "met"
    assert qs.demo_row({**summary, "final_plan": [39, 34, 16, 7]})[4] == "NOT met"  # identical ranks 5 apart


def test_given_files_nothing_runs(tmp_path, capsys):
    first = tmp_path / "fs.json"
    first.write_text(json.dumps({"gaps_s": [1.0, 2.0, 1.5], "gap_of_medians_s": 1.5}))
    quota = tmp_path / "q.json"
    quota.write_text(json.dumps(_quota_run(800, 1600, 1.0)))
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "summary.json").write_text(json.dumps({"emulate_speeds": [1, 1], "first_plan": [48, 48],
                                                   "final_plan": [48, 48], "plan_changes": 0}))
    assert qs.main(["--first-step-json", str(first), "--quota-json", str(quota), "--demo-run", str(demo)]) == 0
    out = capsys.readouterr().out
    assert "+1.5 s" in out and "2.00" in out and "48/48 → 48/48 (48/48)" in out
