"""The memory cap stops bounding a share once the loop trains shares in micro-batches
(planner, pure class): the plan gives a rank capped at 8 samples the 32 its speed calls
for, and tells every rank its cap, the size of its micro-batches. Without micro-batches,
and for a model with synced BatchNorm (whose loop never says it cuts), the cap holds as
before."""

from __future__ import annotations

import pytest

from hetero_ray.planning.planner import Planner
from hetero_ray.planning.rank_facts import RankFacts
from hetero_ray.planning.simulation import SimulatedCluster
from hetero_ray.training.gradients.micro_batches import MicroBatchPolicy
from tests.helpers import cpu_device, node
from tests.helpers import step_rows

B = 40
# Rank 0 is 4x faster but holds 8 samples at most: by time alone it takes 32 of 40.
NODES = [node("fast", [cpu_device(alpha=0.002, beta=0.001, cap=8)]).to_dict(),
         node("slow", [cpu_device(alpha=0.002, beta=0.004, cap=400)]).to_dict()]
PLACEMENT = dict(node_ids=["fast", "slow"], device_kinds=["cpu", "cpu"])


def planner() -> Planner:
    one = Planner(global_batch_size=B, policy="optimal", rebalance_interval=5)
    one.set_capabilities(NODES)
    return one


def test_without_micro_batches_the_share_stays_at_the_memory_cap():
    plan = planner().plan_for(2, 0, RankFacts(**PLACEMENT))
    assert plan["local_batch_sizes"] == [8, 32]
    assert plan["memory_caps"] == [8, 400]  # the ranks learn their caps either way


def test_with_micro_batches_the_share_follows_time_past_the_cap():
    one = planner()
    plan = one.plan_for(2, 0, RankFacts(**PLACEMENT), micro_batches=True)
    assert plan["local_batch_sizes"] == [32, 8]
    assert plan["memory_caps"] == [8, 400]  # rank 0 trains its 32 as 4 micro-batches of 8
    assert one.caps is None and one.memory_caps == [8, 400]


def test_the_balancer_moves_past_the_cap_once_rank_0_says_the_loop_cuts():
    """The first plan is made before the loop has run a step (capped); from the first plan
    asked for after the loop called micro_batches, the balancer moves work by time alone."""
    one = planner()
    cluster = SimulatedCluster(alphas=[0.002, 0.002], betas=[0.001, 0.004], noise=0.02, seed=0)
    plan = one.plan_for(2, 0, RankFacts(**PLACEMENT))
    assert plan["local_batch_sizes"] == [8, 32]
    one.begin_attempt(0, 2, 0, end_global_step=60)
    served = []
    for step in range(60):
        if step % 5 == 0:
            plan = one.plan_for(2, step, RankFacts(**PLACEMENT), micro_batches=step > 0)
            served.append(plan["local_batch_sizes"])
        one.add_steps(step_rows(cluster, step, plan, attempt=0), now=step * 0.01)
    assert served[0] == [8, 32]
    assert max(sizes[0] for sizes in served) > 8, served
    assert served[-1][0] >= 28, served  # near the 32 of equal finishing times


def test_a_restarted_planner_keeps_the_caps_and_that_the_loop_cuts():
    one = planner()
    one.plan_for(2, 0, RankFacts(**PLACEMENT), micro_batches=True)
    again = Planner(global_batch_size=B, policy="optimal", rebalance_interval=5)
    again.load_state_dict(one.state_dict())
    assert again.memory_caps == [8, 400] and again.caps is None
    assert again.plan_for(3, 0, RankFacts(["fast", "slow", "slow"],  # an elastic restart: a new first plan
                                    ["cpu"] * 3))["local_batch_sizes"][0] > 8


def test_a_model_with_synced_batchnorm_is_never_cut_so_its_shares_keep_the_cap(caplog):
    """The default for BatchNorm: its statistics are the global batch's, which micro-batches
    cannot keep. A batch past the cap is trained whole (said once), the loop never tells
    the planner it cuts, so the plan keeps the share at the cap; asking for a size is an
    error that says what to do."""
    policy = MicroBatchPolicy(synced_batchnorm=True, rank=0)
    with caplog.at_level("WARNING", logger="hetero_ray.worker"):
        assert policy.sizes(32, cap=8, max_size=None) == [32]
        assert policy.sizes(32, cap=8, max_size=None) == [32]
    assert len([r for r in caplog.records if "sync_batchnorm=False" in r.getMessage()]) == 1
    assert not policy.cuts
    one = planner()
    assert one.plan_for(2, 0, RankFacts(**PLACEMENT), micro_batches=policy.cuts)["local_batch_sizes"] == [8, 32]
    from hetero_ray.errors import UserError

    with pytest.raises(UserError, match="sync_batchnorm=False"):
        policy.sizes(32, cap=8, max_size=8)

    local = MicroBatchPolicy(synced_batchnorm=False, rank=0)  # the opt-in: each micro-batch normalised alone
    assert local.sizes(32, cap=8, max_size=None) == [8, 8, 8, 8] and local.cuts
