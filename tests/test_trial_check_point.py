"""A trial (shares beyond those a rank is known at: planning/moves.py) carries a check
point: the ranks ask the planner again ``check_after_steps`` plus their lookahead after it
came into force, so that a trial that made the step worse is undone there, not at the next
rebalance point. Two ranks of a real gloo group with DataLoader worker processes (a
lookahead of 4 steps), in-process sessions (tests/inprocess_session.py): all ranks switch
at that step, the trial's samples and the rollback's are each trained once, and a trial
that held is not asked about again before the next point."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers import on_gloo_ranks
from tests.inprocess_session import ScriptedPlanner, run_in_session, train_linear

pytestmark = pytest.mark.slow

INTERVAL, LOADER_WORKERS, PREFETCH = 10, 2, 2  # a lookahead of 2 × 2 = 4 steps
CHECK_AFTER = 3
TRIAL_POINT = 10
CHECK_POINT = TRIAL_POINT + CHECK_AFTER + LOADER_WORKERS * PREFETCH  # 17
NUM_SAMPLES, GLOBAL_BATCH = 300, 12  # 25 steps: points at 0, 10, 17, 20
PLANS = {
    "rolled back": {0: (6, 6), TRIAL_POINT: (9, 3), CHECK_POINT: (6, 6)},
    "held": {0: (6, 6), TRIAL_POINT: (9, 3)},
}


def loop(config: dict) -> list[int]:
    data = torch.utils.data.TensorDataset(torch.randn(NUM_SAMPLES, 4))
    return train_linear(torch.utils.data.DataLoader(data, num_workers=LOADER_WORKERS, prefetch_factor=PREFETCH))


def _rank(rank: int, world_size: int, out_dir: str) -> dict:
    results = {}
    for case, plans in PLANS.items():
        planner = ScriptedPlanner(plans, check_after_steps={TRIAL_POINT: CHECK_AFTER})
        seen, store, _ = run_in_session(loop, {}, rank=rank, num_workers=world_size, global_batch_size=GLOBAL_BATCH,
                                        planner=planner, storage=os.path.join(out_dir, case),
                                        rebalance_interval=INTERVAL)
        results[case] = {"seen": seen, "asked_at": planner.asked_at,
                         "sample_ids": [i for row in store.sample_ids for i in row["sample_indices"]],
                         "plans": [(row["first_global_step"], row["check_after_steps"]) for row in store.plans]}
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return on_gloo_ranks(_rank, 2, str(tmp_path_factory.mktemp("trial-check")))


def test_a_trial_rolled_back_at_its_check_point_switches_every_rank_there(ranks):
    expected = [[6] * TRIAL_POINT + [9] * (CHECK_POINT - TRIAL_POINT) + [6] * (25 - CHECK_POINT),
                [6] * TRIAL_POINT + [3] * (CHECK_POINT - TRIAL_POINT) + [6] * (25 - CHECK_POINT)]
    assert [r["rolled back"]["seen"] for r in ranks] == expected
    assert ranks[0]["rolled back"]["asked_at"] == [0, TRIAL_POINT, CHECK_POINT, 20]


def test_plans_parquet_says_which_plan_is_a_trial_and_when_it_is_checked(ranks):
    assert ranks[0]["rolled back"]["plans"] == [(0, None), (TRIAL_POINT, CHECK_AFTER), (CHECK_POINT, None)]
    assert ranks[1]["rolled back"]["plans"] == [], "rank 0 records the plans"


def test_a_trial_that_held_is_kept_to_the_next_point(ranks):
    assert [r["held"]["seen"][-1] for r in ranks] == [9, 3]
    assert ranks[0]["held"]["asked_at"] == [0, TRIAL_POINT, CHECK_POINT, 20], "asked once at its check point"


@pytest.mark.parametrize("case", list(PLANS))
def test_every_sample_is_trained_once(ranks, case):
    ids = sorted(ranks[0][case]["sample_ids"] + ranks[1][case]["sample_ids"])
    assert ids == list(range(NUM_SAMPLES))
