"""The bench's replay: policies on recorded noise against the best fixed split (no Ray)."""

import numpy as np
import pandas as pd
import pytest

from benchmarks.replay import KNOWN_SPEEDS, best_fixed_split, fit_devices, noise_trace, replay
from hetero_ray.planning import SimulatedCluster


def recorded_run(betas, sizes, factors) -> pd.DataFrame:
    """Step records of ranks with ``busy = β_i·b_i·factors[s, i]``."""
    rows = [{"global_step": s, "rank": i, "local_batch_size": sizes[i], "busy_time_s": betas[i] * sizes[i] * x}
            for s, step_factors in enumerate(factors) for i, x in enumerate(step_factors)]
    return pd.DataFrame(rows)


def test_the_trace_is_each_step_over_the_ranks_usual_pace():
    factors = np.array([[9.0, 9.0]] * 5 + [[1.0, 2.0], [3.0, 2.0], [2.0, 4.0]])  # 5 warm-up steps first
    trace = noise_trace(recorded_run([1e-3, 2e-3], [10, 10], factors))
    assert trace == pytest.approx(np.array([[0.5, 1.0], [1.5, 1.0], [1.0, 2.0]]))  # medians 2 and 2


def test_the_devices_are_each_ranks_cost_per_sample_over_all_runs():
    quiet = np.ones((30, 2))
    runs = [recorded_run([1e-3, 4e-3], [10, 10], quiet), recorded_run([1e-3, 4e-3], [16, 4], quiet)]
    assert [d.beta_s_per_sample for d in fit_devices(runs)] == pytest.approx([1e-3, 4e-3])
    assert [d.alpha_s for d in fit_devices(runs)] == [0.0, 0.0]


def test_the_best_fixed_split_gives_less_to_a_rank_whose_noise_is_worse():
    trace = np.array([[1.0, 1.0], [1.0, 2.0]] * 10)  # rank 1 is twice as slow every other step
    best = best_fixed_split(np.zeros(2), np.ones(2), trace, start=[20, 20])
    assert sum(best) == 40 and best[1] < best[0]
    # the mean step, max(b0, b1)/2 + max(b0, 2·b1)/2, is lowest (27) at 26:14 and 27:13
    assert best in ([26, 14], [27, 13])


def test_the_simulated_cluster_replays_a_trace_in_place_of_gaussian_noise():
    trace = np.array([[1.0, 2.0], [3.0, 1.0]])
    cluster = SimulatedCluster([0.0, 0.0], [1.0, 1.0], noise=0.5, noise_trace=trace)
    assert list(cluster.busy_times_s([1, 1], 0)) == [1.0, 2.0]
    assert list(cluster.busy_times_s([1, 1], 3)) == [3.0, 1.0]  # cycled
    with pytest.raises(ValueError, match="shape"):
        SimulatedCluster([0.0], [1.0], noise_trace=np.ones((4, 2)))
    with pytest.raises(ValueError, match="> 0"):
        SimulatedCluster([0.0, 0.0], [1.0, 1.0], noise_trace=np.array([[1.0, np.nan]]))


def test_replayed_policies_come_close_to_the_best_split_for_the_noise():
    rng = np.random.default_rng(0)
    betas = [1e-3, 1e-3, 2e-3, 4e-3]
    runs = [recorded_run(betas, sizes, 1 + 0.1 * rng.standard_normal((100, 4)).clip(-0.5, 0.5))
            for sizes in ([48, 48, 48, 48], [70, 70, 35, 17])]
    result = replay(runs, runs, global_batch_size=192, rebalance_interval=20)
    assert result.num_traces == 2 and result.num_steps == 190
    rows = {row["policy"]: row for row in result.rows}
    assert set(rows) == {"dynamic", "optimal", KNOWN_SPEEDS}
    assert rows[KNOWN_SPEEDS]["plan_changes_max"] == 0
    for name in ("dynamic", "optimal"):  # from equal shares, with 10 % noise
        assert 0.9 < rows[name]["split_efficiency"] <= 1.02
        assert rows[name]["plan_changes_max"] <= 3
    assert result.to_dict()["policies"] == result.rows


def test_runs_too_short_to_score_replay_nothing():
    short = recorded_run([1e-3, 2e-3], [10, 10], np.ones((40, 2)))  # 35 steps after warm-up < 3 intervals
    result = replay([short], [short], global_batch_size=20, rebalance_interval=20)
    assert result.num_traces == 0 and result.rows == []
