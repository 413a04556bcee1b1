"""Emulated devices on a real local Ray: each rank's recorded busy time has its device's shape.

Rank 0 follows the H100's resnet18 curve (flat from 8 to 64 samples), rank 1 a CPU-like line
(5 ms + 1 ms per sample); a scripted plan change swaps their shares 8 ↔ 24 halfway. The
assertions are about shape (ratios, generous tolerances), never absolute times: the
common factor k and the machine's load set those. Each size's fastest step stands for it:
a step can only come out slower than its target (the machine stalls it, or wakes it late
from its pad), never faster — with two isolated Ray tests beside it, rank 0's median at 8
samples came out 9.8 ms against 7.1 ms at 24, its fastest step 8.7 ms.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

H100 = os.path.join(os.path.dirname(__file__), "data", "h100_resnet18_nodes.json")


def test_busy_times_follow_the_device_curves(ray_session, fast_config):
    from hetero_ray.builtin.driver import run_training

    config = fast_config(
        num_workers=2, global_batch_size=32, num_samples=32 * 16, name="curves", rebalance_interval=1,
        batch_split=[8, 24], plan_changes=[{"global_step": 8, "local_batch_sizes": [24, 8]}],
        emulate_devices=[f"{H100}:gpu0", "curve:0:5:1"],
    )
    result = run_training(config)

    with open(os.path.join(result.run_dir, "attempts.json")) as f:
        factor = json.load(f)[0]["emulated_devices_factor"]  # measured before step 0: the run says which
    assert factor >= 1.0
    steps = pd.read_parquet(os.path.join(result.run_dir, "steps.parquet"))
    steps = steps[~steps["global_step"].isin([0, 8])]  # the first step of each plan warms its sizes up
    busy = steps.groupby(["rank", "local_batch_size"])["busy_time_s"].min()
    assert set(busy.index) == {(0, 8), (0, 24), (1, 8), (1, 24)}
    # rank 0 is flat: the H100 takes as long for 24 samples as for 8
    assert 0.75 < busy[(0, 24)] / busy[(0, 8)] < 1.33
    # rank 1 grows as its line: (5 + 24) / (5 + 8) ≈ 2.2
    assert 1.6 < busy[(1, 24)] / busy[(1, 8)] < 3.0
    # one factor for both: at 24 samples the line is 29 ms against the H100's 6.9 ms (× 4.2)
    assert 3.0 < busy[(1, 24)] / busy[(0, 24)] < 6.0
    # the shape comes from the pad: every rank and size has padded steps (a step the machine
    # stalls overruns its target and needs none)
    padded = steps[steps["pad_time_s"] > 0].groupby(["rank", "local_batch_size"]).size()
    assert set(padded.index) == set(busy.index), padded
