"""The policies' benchmark (benchmarks/balance.py): the figures it prints, from step records
(pure), one real run, and its refusal of bad flags before anything runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from benchmarks.balance_analysis import (
    PolicyRun,
    analyse,
    cold_start_figures,
    jitter_ceiling,
    own_throughputs,
    steps_to_balance,
)


def step_table(busy_per_rank: list[list[float]], sizes: list[int], step_time_s=None) -> pd.DataFrame:
    """Step records: ``busy_per_rank[i][s]`` for rank i at step s; steps end every step time."""
    rows, wall = [], 0.0
    for s in range(len(busy_per_rank[0])):
        busy = [ranks[s] for ranks in busy_per_rank]
        wall += step_time_s[s] if step_time_s is not None else max(busy)
        for rank, t in enumerate(busy):
            rows.append({"global_step": s, "rank": rank, "local_batch_size": sizes[rank], "busy_time_s": t,
                         "step_time_s": max(busy), "wall_time": wall})
    return pd.DataFrame(rows)


def test_a_perfect_split_without_jitter_is_efficiency_one():
    steps = step_table([[0.1] * 40, [0.1] * 40], sizes=[30, 10])
    run = PolicyRun("optimal", "optimal", "", steps, {})
    analyse(run)
    assert run.samples_per_s == pytest.approx(400)  # 40 samples every 0.1 s
    assert list(own_throughputs(steps, 0)) == pytest.approx([300, 100])
    assert run.balance_efficiency == pytest.approx(1.0)
    assert run.extra["equal_split_efficiency_bound"] == pytest.approx(0.5)  # 2 · 100 / 400
    assert run.extra["jitter_ceiling"] == pytest.approx(1.0)


def test_an_equal_split_of_unequal_devices_runs_at_the_slowest_pace():
    steps = step_table([[0.05] * 40, [0.2] * 40], sizes=[20, 20])  # rank 1 is 4× slower
    run = PolicyRun("static", "static", "", steps, {})
    analyse(run)
    # 40 samples per 0.2 s = 200/s; the devices' own: 400 + 100 = 500/s
    assert run.balance_efficiency == pytest.approx(0.4)
    assert run.extra["equal_split_efficiency_bound"] == pytest.approx(0.4)


def test_jitter_that_the_ranks_do_not_share_costs_every_step_the_worst():
    fast_slow = [0.09, 0.11] * 20
    steps = step_table([fast_slow, fast_slow[1:] + fast_slow[:1]], sizes=[10, 10])  # out of phase
    assert jitter_ceiling(steps, 0) == pytest.approx(1 / 1.1)


def test_jitter_that_all_ranks_share_costs_nothing():
    together = [0.09, 0.11] * 20
    steps = step_table([together, together], sizes=[10, 10])
    assert jitter_ceiling(steps, 0) == pytest.approx(1.0)


def test_jitter_is_measured_per_batch_size_so_a_plan_change_is_not_jitter():
    busy = [[0.1] * 20 + [0.2] * 20, [0.1] * 40]
    steps = step_table(busy, sizes=[10, 10])
    steps.loc[(steps["rank"] == 0) & (steps["global_step"] >= 20), "local_batch_size"] = 20
    assert jitter_ceiling(steps, 0) == pytest.approx(1.0)


def factors_of(steps: pd.DataFrame) -> dict:
    run = PolicyRun("optimal", "optimal", "", steps, {})
    analyse(run)
    factors = run.extra["efficiency_factors"]
    assert factors["balance"] * factors["jitter"] * factors["synchronisation"] == pytest.approx(run.balance_efficiency)
    return factors


def test_a_perfect_split_loses_nothing_anywhere():
    assert factors_of(step_table([[0.1] * 40, [0.1] * 40], sizes=[30, 10])) == pytest.approx(
        {"balance": 1.0, "jitter": 1.0, "synchronisation": 1.0})


def test_an_uneven_split_is_charged_to_balance_only():
    factors = factors_of(step_table([[0.05] * 40, [0.2] * 40], sizes=[20, 20]))
    assert factors == pytest.approx({"balance": 0.4, "jitter": 1.0, "synchronisation": 1.0})


def test_jitter_out_of_phase_is_charged_to_jitter():
    fast_slow = [0.09, 0.11] * 20
    factors = factors_of(step_table([fast_slow, fast_slow[1:] + fast_slow[:1]], sizes=[10, 10]))
    assert factors == pytest.approx({"balance": 1.0, "jitter": 1 / 1.1, "synchronisation": 1.0})


def test_time_when_no_rank_is_busy_is_charged_to_synchronisation():
    steps = step_table([[0.1] * 40, [0.1] * 40], sizes=[10, 10], step_time_s=[0.125] * 40)  # 25 ms all-reduce
    assert factors_of(steps) == pytest.approx({"balance": 1.0, "jitter": 1.0, "synchronisation": 0.8})


def test_the_three_factors_multiply_to_the_efficiency_of_a_messy_run():
    rng = np.random.default_rng(3)
    busy = [list(0.1 * (1 + 0.2 * rng.random(60))), list(0.07 * (1 + 0.3 * rng.random(60)))]
    walls = [max(a, b) + 0.01 * rng.random() for a, b in zip(*busy)]
    factors = factors_of(step_table(busy, sizes=[30, 20], step_time_s=walls))  # product checked inside
    assert all(0 < v <= 1 + 1e-12 for v in factors.values())
    assert factors["balance"] < 0.95 and factors["synchronisation"] < 0.99  # 30:20 for two ranks of nearly one speed


def test_steps_to_balance_is_where_the_split_stays_near_its_steady_efficiency():
    # rank 1 has 4× too much work until step 30, then the split is right
    steps = step_table([[0.1] * 100, [0.4] * 30 + [0.1] * 70], sizes=[10, 10])
    # the rolling median over 20 steps turns at the 11th balanced step (step 40)
    assert 35 <= steps_to_balance(steps) <= 45


def test_a_slowdown_of_the_whole_machine_is_not_imbalance():
    phase = [0.1] * 60 + [0.15] * 25 + [0.1] * 15  # every rank 1.5× slower at steps 60-84
    steps = step_table([[0.4] * 10 + phase[10:], phase], sizes=[10, 10])
    assert 15 <= steps_to_balance(steps) <= 25  # balanced from step ~20; the phase changes nothing


def test_a_cold_start_is_measured_against_the_profiled_run_and_timed_to_its_final_efficiency():
    # The profiled run is balanced from step 0; the cold one runs rank 1 with 4× too much
    # work for two intervals of 10 steps, then balanced: 0.95 of its final efficiency is
    # reached once the trailing median (half an interval) is past the change, at step ~24.
    profiled = step_table([[0.1] * 100, [0.1] * 100], sizes=[10, 10])
    cold = step_table([[0.1] * 100, [0.4] * 20 + [0.1] * 80], sizes=[10, 10])
    figures = cold_start_figures(cold, profiled, rebalance_interval=10)
    assert 22 <= figures["steps_to_95pct"] <= 26 and figures["intervals_to_95pct"] == figures["steps_to_95pct"] / 10
    assert figures["seconds_to_95pct"] == pytest.approx(19 * 0.4 + (figures["steps_to_95pct"] - 19) * 0.1)
    assert figures["of_profiled"] == pytest.approx(1.0)  # the second halves are alike
    never = cold_start_figures(step_table([[0.1] * 40, [0.4] * 40], sizes=[10, 10]), profiled, 10)
    assert never["of_profiled"] == pytest.approx(0.25) and never["steps_to_95pct"] is not None  # at once: no change


@pytest.mark.ray
@pytest.mark.slow  # three real runs (static, optimal, a cold start): ~65 s
@pytest.mark.usefixtures("ray_session")
def test_bench_runs_the_policies_and_writes_the_figures(tmp_path, capsys):
    out = tmp_path / "bench.json"
    from benchmarks.balance import main

    code = main(["--model", "mlp", "--emulate-speeds", "1,0.5", "--batch-size", "64", "--steps", "40",
                 "--rebalance-interval", "10", "--policies", "static,optimal", "--cold-start",
                 "--output-dir", str(tmp_path / "runs"), "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert "jitter ceiling" in stdout and "efficiency" in stdout and "synchronisation" in stdout
    result = json.loads(out.read_text())
    assert [r["policy"] for r in result["runs"]] == ["static", "optimal"]
    for r in result["runs"]:
        assert {"samples_per_s", "ideal_samples_per_s", "balance_efficiency", "steps_to_balance",
                "jitter_ceiling"} <= r.keys()
        assert 0 < r["balance_efficiency"] <= 1.2 and 0 < r["jitter_ceiling"] <= 1.0
        factors = r["efficiency_factors"]
        assert factors["balance"] * factors["jitter"] * factors["synchronisation"] == pytest.approx(
            r["balance_efficiency"])
    cold = result["cold_start"]
    assert cold["of_profiled"] > 0 and cold["samples_per_s"] > 0 and "cold start (optimal from equal shares" in stdout
    assert "split efficiency" in stdout  # the replay of the runs' noise
    assert {p["policy"] for p in result["replay"]["policies"]} == {"dynamic", "optimal", "mean speeds known"}
    assert (tmp_path / "runs" / "bench.html").exists()


@pytest.mark.parametrize("argv, says", [
    (["--policies", "static,fastest"], "--policies must be a comma-separated subset"),
    (["--emulate-speeds", "1,0.5", "--num-workers", "3"], "--emulate-speeds has 2 values but --num-workers is 3"),
    (["--speed-change", "10:4:0.5"], "--speed-change rank 4 does not exist with 4 workers"),
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--batch-size", "2"], "--batch-size 2 is smaller than the 4 workers"),
])
def test_bench_refuses_bad_flags_before_anything_runs(tmp_path, capsys, argv, says):
    from benchmarks.balance import main

    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--output-dir", str(tmp_path / "runs")])
    assert stopped.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
