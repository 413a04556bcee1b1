"""Ranks left out and brought back, end to end on a real local Ray with real gloo groups:
a user's BatchNorm model, own Dataset and loop (tests/api_jobs.py), under scripted plans
that leave ranks 1 and 2 out (b_i = 0) and bring them back mid-epoch.

- same math: the final weights and BatchNorm statistics are one device's on the same
  global batches (< 1e-5), which needs both sides of the mechanism: the ranks in reduce
  gradients and batch statistics over their own group, and a rank brought back trains from
  rank 0's parameters, buffers and optimiser state, not from those its zero-gradient
  steps left it with;
- exactly once: every sample once per epoch; the ranks left out consume nothing (their
  probes are timed, with weight 0, and recorded as probe_batch_size);
- nothing lost: a SIGKILL while a rank is out resumes at the checkpoint's step, and the run
  still ends with one device's weights (the same run: one fit proves all three).
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from hetero_ray import HeteroConfig
from hetero_ray.planning import policies
from tests import api_runs as api

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# 5 steps an epoch (the last a short window of 20), 2 epochs
LEAVE_AND_REJOIN = ({"global_step": 2, "local_batch_sizes": [30, 0, 0]},   # ranks 1, 2 out
                    {"global_step": 4, "local_batch_sizes": [10, 12, 8]},  # back, in a short window
                    {"global_step": 6, "local_batch_sizes": [20, 0, 10]},  # rank 1 out
                    {"global_step": 8, "local_batch_sizes": [6, 12, 12]})  # back


def _steps(run_dir: str) -> pd.DataFrame:
    return pd.read_parquet(os.path.join(run_dir, "steps.parquet"))


def test_ranks_left_out_brought_back_and_crashed_while_out_keep_one_device_weights_and_exactly_once(
        ray_session, tmp_path, monkeypatch):
    """Ranks 1 and 2 out at steps 2–3, back in a short window, rank 1 out again from step 6;
    it dies at step 7, once the checkpoint after step 6 is registered (checkpoints after
    steps 3, 4 (the epoch's end) and 6, each named by the step it resumes at): the group
    resumes at step 7 with rank 1 still out, and brings it back at step 8. The first plan,
    14/10/6, is a policy this test registers for itself: its class reaches the planner actor."""
    monkeypatch.setattr(policies, "_REGISTERED", dict(policies._REGISTERED))
    policies.register_policy(api.FirstSplitPolicy)
    hetero = HeteroConfig(global_batch_size=api.BATCH, policy=api.FirstSplitPolicy.name, rebalance_interval=1,
                          record_sample_ids=True, plan_changes=LEAVE_AND_REJOIN)
    run_dir = str(tmp_path / "leave-out")
    crash = {"at_step": 7, "after_checkpoint": "checkpoint_000000007", "run_dir": run_dir}
    result = api.fit(tmp_path, "leave-out", hetero, checkpoint_every=3, crash=crash)

    with open(os.path.join(run_dir, "attempts.json")) as f:
        attempts = json.load(f)
    assert [a["start_global_step"] for a in attempts] == [0, 7], attempts
    api.assert_one_device(api.final_weights(result))
    api.assert_exactly_once(run_dir)
    steps = _steps(run_dir)
    sizes = {s: rows.sort_values("rank")["local_batch_size"].tolist() for s, rows in steps.groupby("global_step")}
    probes = {s: rows.sort_values("rank")["probe_batch_size"].tolist() for s, rows in steps.groupby("global_step")}
    assert sizes[0] == sizes[1] == [14, 10, 6]  # the registered policy's first plan
    assert sizes[2] == sizes[3] == [30, 0, 0] and sizes[4] == [7, 8, 5] and sizes[6] == [20, 0, 10]
    assert sizes[8] == [6, 12, 12]  # brought back after the restart
    # a rank left out times a probe of half its last share (10 and 6 before step 2; 12 before step 6)
    assert probes[2] == [0, 5, 3] and probes[6] == [0, 6, 0] and probes[5] == [0, 0, 0]
    ids = pd.read_parquet(os.path.join(run_dir, "sample_ids.parquet"))
    assert set(ids[ids["global_step"].isin([2, 3])]["rank"]) == {0}  # the probes consumed nothing
    assert (steps["busy_time_s"] > 0).all()
