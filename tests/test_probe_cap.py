"""A rank left out runs a probe of at most half its last share — and never more than its
memory cap: half a share that fitted before may not fit now (its first plan left it out,
or it resumed on a device with less free memory), and a probe past the cap would fail at
the same step after every restart. Two ranks of a real gloo group, in-process sessions
(tests/inprocess_session.py): the loop sees, and the step rows record, the capped probe."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import on_gloo_ranks
from tests.inprocess_session import ScriptedPlanner, run_in_session, train_linear

pytestmark = pytest.mark.slow

CAPS = [16, 3]  # rank 1 holds at most 3 samples
PLANS = {0: (2, 10), 2: (12, 0)}  # rank 1's last share 10: half of it, 5, is past its cap


def loop(config: dict) -> list[int]:
    return train_linear(torch.utils.data.TensorDataset(torch.randn(48, 4)))


def _rank(rank: int, world_size: int, out_dir: str) -> dict:
    seen, store, _ = run_in_session(loop, {}, rank=rank, num_workers=world_size, global_batch_size=12,
                                    planner=ScriptedPlanner(PLANS, CAPS), storage=out_dir)
    return {"seen": seen, "probes": [row["probe_batch_size"] for row in store.steps]}


def test_a_probe_stays_within_the_rank_memory_cap(tmp_path):
    rank1 = on_gloo_ranks(_rank, 2, str(tmp_path))[1]
    assert rank1["seen"] == [10, 10, 3, 3]  # in for two steps, then probes of min(10 // 2, cap 3)
    assert rank1["probes"] == [0, 0, 3, 3]
