"""Every bottleneck verdict, on synthetic windows that must and must not trigger it.

Windows are built the way DDP produces them: each rank's busy time is its data wait plus
``α + b·c`` (with a little noise), the step ends when the slowest rank is done plus the
all-reduce, and every rank waits the difference.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from hetero_ray.runs.records import STEP_COLUMNS
from hetero_ray.bottlenecks.classify import (
    BALANCED, COMMUNICATION_BOUND, INPUT_BOUND, LEFT_OUT, MEMORY_BOUND, STRAGGLER, UNDER_UTILISED_GPU, VERDICTS,
    BottleneckThresholds, classify, format_verdicts, verdicts_table,
)

GIB = 1024**3


def window(ranks: list[dict], steps: int = 30, comm_s: float = 0.002, optimizer_s: float = 0.001,
           noise: float = 0.02, seed: int = 0, first_step: int = 0) -> pd.DataFrame:
    """``ranks``: per rank ``b`` (local batch), ``c`` (s/sample), optional ``alpha``, ``data``
    (data wait, s), ``gpu_util`` (%), ``peak``/``total`` (GPU bytes)."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(first_step, first_step + steps):
        busy = [(r.get("data", 0.0) + r.get("alpha", 0.0) + r["b"] * r["c"]) * (1 + noise * rng.standard_normal())
                for r in ranks]
        step_time = max(busy) + comm_s + optimizer_s
        for i, r in enumerate(ranks):
            row = {c: None for c in STEP_COLUMNS}
            row.update(epoch=0, step=s, global_step=s, rank=i, node_id=f"node{i}", attempt=0,
                       local_batch_size=r["b"], global_batch_size=sum(x["b"] for x in ranks), plan_version=0,
                       data_time_s=r.get("data", 0.0), busy_time_s=busy[i], optimizer_time_s=optimizer_s,
                       step_time_s=step_time, wait_time_s=step_time - busy[i] - optimizer_s,
                       gpu_util=r.get("gpu_util", math.nan), gpu_mem_peak_bytes=r.get("peak", math.nan),
                       gpu_mem_total_bytes=r.get("total", math.nan), probe_batch_size=r.get("probe", 0))
            rows.append(row)
    return pd.DataFrame(rows)


def verdicts_of(frame, **kw) -> list[str]:
    return [v.verdict for v in classify(frame, **kw)]


# --- balanced


def test_equal_ranks_are_balanced():
    assert verdicts_of(window([{"b": 32, "c": 0.001}] * 4)) == [BALANCED] * 4


def test_a_slow_device_with_a_matching_smaller_share_is_balanced():
    # Per-sample cost 3× higher, share 3× smaller: everyone finishes together.
    assert verdicts_of(window([{"b": 48, "c": 0.001}, {"b": 16, "c": 0.003}])) == [BALANCED, BALANCED]


# --- left out


def test_a_rank_left_out_is_said_to_be_out_and_why_and_judges_nobody_else():
    # rank 2 probes 4 samples at 5 ms each while the others train: its 20 ms of probing, longer
    # than their step, makes it neither a straggler nor part of their comparison
    verdicts = classify(window([{"b": 48, "c": 0.001}, {"b": 48, "c": 0.001},
                                {"b": 0, "c": 0.005, "alpha": 0.02, "probe": 4}]))
    assert [v.verdict for v in verdicts] == [BALANCED, BALANCED, LEFT_OUT]
    out = verdicts[2]
    assert "left out of the plan" in out.recommendation and "all-reduce" in out.recommendation
    assert "probes of 4 samples" in out.recommendation and "brought back when it pays" in out.recommendation
    assert verdicts[0].evidence["fair_local_batch_size"] == pytest.approx(48, rel=0.05)  # the ranks in share B


# --- straggler


def test_a_slow_device_at_an_equal_share_is_the_straggler():
    verdicts = classify(window([{"b": 32, "c": 0.001}, {"b": 32, "c": 0.001}, {"b": 32, "c": 0.003}]))
    assert [v.verdict for v in verdicts] == [BALANCED, BALANCED, STRAGGLER]
    e = verdicts[2].evidence
    assert e["busy_ratio"] == pytest.approx(3.0, rel=0.1)
    assert e["per_sample_ratio"] == pytest.approx(3.0, rel=0.1)
    # Equal finishing time: b* ∝ 1/c → 96 · (1/3)/(1+1+1/3) ≈ 13.7 samples for the slow rank.
    assert e["fair_local_batch_size"] == pytest.approx(96 / 7, rel=0.1)
    assert "move ~18" in verdicts[2].recommendation
    assert "waits" in verdicts[0].recommendation and "rank(s) 2" in verdicts[0].recommendation


def test_a_normal_device_given_too_large_a_share_is_a_straggler_with_that_reason():
    verdicts = classify(window([{"b": 64, "c": 0.001}, {"b": 16, "c": 0.001}]))
    assert verdicts[0].verdict == STRAGGLER
    assert verdicts[0].evidence["per_sample_ratio"] == pytest.approx(1.0, rel=0.1)
    assert "share is too large" in verdicts[0].recommendation


def test_more_samples_within_the_noise_band_is_not_a_straggler():
    # 10 % more busy time than the others: below the 1.15× threshold.
    assert verdicts_of(window([{"b": 35, "c": 0.001}, {"b": 32, "c": 0.001}, {"b": 32, "c": 0.001}])) == [BALANCED] * 3


def test_busy_above_the_others_is_not_a_straggler_when_they_do_not_wait():
    frame = window([{"b": 32, "c": 0.0013}, {"b": 32, "c": 0.001}])
    frame["wait_time_s"] = 0.0001  # e.g. their wait overlapped with other work
    assert STRAGGLER not in verdicts_of(frame)


def test_a_rank_left_out_while_reading_ray_data_may_be_feeding_its_pipeline():
    frame = window([{"b": 64, "c": 0.001}, {"b": 0, "c": 0.005, "probe": 1}])
    frame["data_source"] = "ray_data:train"
    out = classify(frame)[1]
    assert out.verdict == LEFT_OUT and "feeding the Ray Data pipeline" in out.recommendation
    assert "decisions.parquet says which" in out.recommendation


# --- input-bound


def test_a_rank_waiting_for_data_is_input_bound_before_it_is_a_straggler():
    verdicts = classify(window([{"b": 32, "c": 0.001, "data": 0.03}, {"b": 32, "c": 0.001}]))
    assert verdicts[0].verdict == INPUT_BOUND
    assert STRAGGLER in verdicts[0].evidence["also"]  # it is also what the other waits for
    assert verdicts[0].evidence["data_share"] == pytest.approx(0.03 / 0.062, rel=0.1)
    assert "data-loader workers" in verdicts[0].recommendation
    assert verdicts[1].verdict == BALANCED


@pytest.mark.parametrize("source, says, not_says", [
    ("ray_data:train", ["Ray Data pipeline of dataset 'train'", "HeteroConfig.feed_trial"], ["data-loader workers"]),
    ("data_loader", ["read by its DataLoader", "data-loader workers"], ["Ray Data"]),
])
def test_an_input_bound_verdict_names_the_source_its_step_rows_record(source, says, not_says):
    frame = window([{"b": 32, "c": 0.001, "data": 0.03}, {"b": 32, "c": 0.001}])
    frame["data_source"] = source
    verdict = classify(frame)[0]
    assert verdict.verdict == INPUT_BOUND and verdict.evidence["data_source"] == source
    assert all(s in verdict.recommendation for s in says), verdict.recommendation
    assert not any(s in verdict.recommendation for s in not_says), verdict.recommendation


def test_a_small_data_wait_is_not_input_bound():
    assert INPUT_BOUND not in verdicts_of(window([{"b": 32, "c": 0.001, "data": 0.005}] * 2))


# --- communication-bound


def test_long_all_reduce_without_a_straggler_is_communication_bound():
    verdicts = classify(window([{"b": 32, "c": 0.001}] * 3, comm_s=0.04))
    assert [v.verdict for v in verdicts] == [COMMUNICATION_BOUND] * 3
    assert verdicts[0].evidence["comm_share"] == pytest.approx(0.04 / 0.073, rel=0.1)
    assert "global batch" in verdicts[0].recommendation


def test_waiting_for_a_straggler_is_not_communication_bound():
    verdicts = verdicts_of(window([{"b": 32, "c": 0.001}, {"b": 32, "c": 0.004}], comm_s=0.002))
    assert COMMUNICATION_BOUND not in verdicts and verdicts[1] == STRAGGLER


def test_short_all_reduce_is_not_communication_bound():
    assert COMMUNICATION_BOUND not in verdicts_of(window([{"b": 32, "c": 0.001}] * 3, comm_s=0.005))


# --- memory-bound


def test_gpu_near_its_memory_is_memory_bound():
    ranks = [{"b": 256, "c": 0.0001, "gpu_util": 95, "peak": 38 * GIB, "total": 40 * GIB},
             {"b": 256, "c": 0.0001, "gpu_util": 95, "peak": 20 * GIB, "total": 40 * GIB}]
    verdicts = classify(window(ranks))
    assert [v.verdict for v in verdicts] == [MEMORY_BOUND, BALANCED]
    assert verdicts[0].evidence["memory_fraction"] == pytest.approx(0.95)


def test_local_batch_near_the_measured_cap_is_memory_bound():
    frame = window([{"b": 60, "c": 0.001}, {"b": 60, "c": 0.001}])
    assert verdicts_of(frame, memory_caps={0: 64, 1: 1000}) == [MEMORY_BOUND, BALANCED]
    assert verdicts_of(frame, memory_caps={0: 100}) == [BALANCED, BALANCED]


# --- under-utilised GPU


def test_a_mostly_idle_gpu_is_under_utilised():
    ranks = [{"b": 32, "c": 0.001, "gpu_util": 22, "peak": 4 * GIB, "total": 40 * GIB},
             {"b": 32, "c": 0.001, "gpu_util": 91, "peak": 4 * GIB, "total": 40 * GIB}]
    verdicts = classify(window(ranks))
    assert [v.verdict for v in verdicts] == [UNDER_UTILISED_GPU, BALANCED]
    assert "22 %" in verdicts[0].recommendation


def test_a_busy_gpu_is_not_under_utilised_and_an_idle_one_waiting_on_the_network_is_communication_bound():
    busy = [{"b": 32, "c": 0.001, "gpu_util": 88, "peak": 4 * GIB, "total": 40 * GIB}] * 2
    assert verdicts_of(window(busy)) == [BALANCED, BALANCED]
    idle_in_all_reduce = [{"b": 32, "c": 0.0001, "gpu_util": 30, "peak": 4 * GIB, "total": 40 * GIB}] * 2
    verdicts = classify(window(idle_in_all_reduce, comm_s=0.01))
    assert [v.verdict for v in verdicts] == [COMMUNICATION_BOUND] * 2  # the root cause first
    assert verdicts[0].evidence["also"] == [UNDER_UTILISED_GPU]


def test_no_gpu_readings_never_give_a_gpu_verdict():
    frame = window([{"b": 32, "c": 0.001}] * 2)  # GPU columns all NaN (CPU ranks)
    verdicts = classify(frame)
    assert [v.verdict for v in verdicts] == [BALANCED] * 2
    assert verdicts[0].evidence["gpu_util"] is not None and math.isnan(verdicts[0].evidence["gpu_util"])
    assert verdicts[0].to_dict()["evidence"]["gpu_util"] is None  # JSON: null, not invented


# --- the window, the output forms, the thresholds


def test_only_the_last_window_and_the_latest_attempt_count():
    old = window([{"b": 32, "c": 0.001}, {"b": 32, "c": 0.004}], steps=100)  # straggler long ago
    new = window([{"b": 32, "c": 0.001}, {"b": 32, "c": 0.001}], steps=50, first_step=100)
    assert verdicts_of(pd.concat([old, new])) == [BALANCED, BALANCED]
    restarted = new.copy()
    restarted["attempt"] = 1
    stale = window([{"b": 32, "c": 0.001}, {"b": 32, "c": 0.004}], steps=50, first_step=100)
    assert verdicts_of(pd.concat([stale, restarted])) == [BALANCED, BALANCED]


def test_too_few_steps_judge_nothing():
    verdicts = classify(window([{"b": 32, "c": 0.001}, {"b": 32, "c": 0.004}], steps=3))
    assert [v.verdict for v in verdicts] == [BALANCED, BALANCED]
    assert "too few" in verdicts[1].recommendation


def test_empty_frame_gives_no_verdicts():
    assert classify(pd.DataFrame(columns=list(STEP_COLUMNS))) == []
    assert "no step records" in format_verdicts([])


def test_outputs_are_json_table_and_text():
    verdicts = classify(window([{"b": 32, "c": 0.001}, {"b": 32, "c": 0.003}]))
    json.dumps([v.to_dict() for v in verdicts], allow_nan=False)
    table = verdicts_table(verdicts)
    assert list(table["verdict"]) == [BALANCED, STRAGGLER]
    assert table.loc[1, "busy_ms"] == pytest.approx(96, rel=0.1)
    text = format_verdicts(verdicts)
    assert "straggler" in text and "rank 1:" in text
    assert {v.verdict for v in verdicts} <= set(VERDICTS)


@pytest.mark.parametrize("field, value", [
    ("window_steps", 0), ("min_steps", -1), ("input_share", 1.5), ("wait_share", 0), ("comm_share", 1),
    ("memory_fraction", -0.1), ("straggler_ratio", 1.0), ("low_gpu_util", 0), ("low_gpu_util", 150),
])
def test_thresholds_reject_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"bottlenecks.{field}"):
        BottleneckThresholds(**{field: value})


def test_thresholds_move_the_verdicts():
    frame = window([{"b": 32, "c": 0.001}, {"b": 40, "c": 0.001}])  # busy 1.25×
    assert verdicts_of(frame)[1] == STRAGGLER
    assert verdicts_of(frame, thresholds=BottleneckThresholds(straggler_ratio=1.5))[1] == BALANCED
