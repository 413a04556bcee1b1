"""The scheduler (pure class): a new instance on the same run directory — what Ray starts
after the actor crashed — serves the plan in force, keeps counting versions from where
the old one stopped, and still knows the node profiles and caps."""

from __future__ import annotations

import os

from hetero_ray.metrics.run_files import SCHEDULER_STATE_FILE
from hetero_ray.scheduler import Scheduler
from tests.helpers import cpu_device, node

B = 40
NODES = [node("fast", [cpu_device(beta=0.001, cap=26)]).to_dict(),
         node("slow", [cpu_device(beta=0.004, cap=400)]).to_dict()]
PLACEMENT = dict(rank_node_ids=["fast", "slow"], rank_device_kinds=["cpu", "cpu"])


def scheduler(run_dir, **overrides) -> Scheduler:
    """As the driver makes it (a restart makes it again with the same arguments)."""
    return Scheduler(**{**dict(global_batch_size=B, policy="optimal", run_dir=str(run_dir)), **overrides})


def test_a_restarted_scheduler_serves_the_plan_in_force_and_keeps_counting(tmp_path):
    first = scheduler(tmp_path)
    first.set_capabilities(NODES)
    profiled = first.plan_for(2, 0, **PLACEMENT)
    assert profiled["caps"] is not None and profiled["local_batch_sizes"][0] <= 26
    first.propose({"version": 1, "local_batch_sizes": [25, 15], "reason": "balancer"})
    in_force = first.plan_for(2, 20, **PLACEMENT)

    again = scheduler(tmp_path)  # the crashed actor's replacement
    assert again.restored_from == os.path.join(str(tmp_path), SCHEDULER_STATE_FILE)
    assert again.plan_for(2, 40, **PLACEMENT) == in_force  # same version, sizes and caps
    # The balancer proposes from the plan it sees (v1 → v2); no version is handed out twice.
    assert again.propose({"version": 2, "local_batch_sizes": [24, 16]})["version"] == 2
    assert scheduler(tmp_path).propose({"version": 1, "local_batch_sizes": [23, 17]})["version"] == 3


def test_a_restarted_scheduler_still_has_the_node_profiles(tmp_path):
    first = scheduler(tmp_path)
    first.set_capabilities(NODES)
    first.plan_for(2, 0, **PLACEMENT)

    knows_profiles = Scheduler(global_batch_size=B, policy="optimal")
    knows_profiles.set_capabilities(NODES)
    three_ranks = dict(rank_node_ids=["fast", "slow", "slow"], rank_device_kinds=["cpu"] * 3)
    expected = knows_profiles.plan_for(3, 0, **three_ranks)
    # An elastic restart after the crash: the new group's first plan comes from the profiles.
    again = scheduler(tmp_path).plan_for(3, 60, **three_ranks)
    assert again["local_batch_sizes"] == expected["local_batch_sizes"] and again["caps"] == expected["caps"]
    assert again["version"] == 1


def test_scripted_changes_already_applied_are_not_applied_again(tmp_path):
    changes = [{"global_step": 10, "local_batch_sizes": [30, 10]}]
    first = scheduler(tmp_path, policy="static", plan_changes=changes)
    first.plan_for(2, 0)
    assert first.plan_for(2, 10)["version"] == 1

    again = scheduler(tmp_path, policy="static", plan_changes=changes)
    assert again.plan_for(2, 20) == {"version": 1, "local_batch_sizes": [30, 10],
                                     "reason": "scripted change at step 10", "caps": None}


def test_a_damaged_state_file_means_a_fresh_start(tmp_path):
    (tmp_path / SCHEDULER_STATE_FILE).write_text('{"plan": {"version": 3, "local_batch_si')
    fresh = scheduler(tmp_path, policy="static")
    assert fresh.restored_from is None
    assert fresh.plan_for(2, 0)["local_batch_sizes"] == [20, 20]


def test_without_a_run_directory_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    in_memory = Scheduler(global_batch_size=B, policy="static")
    in_memory.plan_for(2, 0)
    in_memory.propose({"version": 1, "local_batch_sizes": [30, 10]})
    assert os.listdir(tmp_path) == []


def test_the_ranks_warm_up_lines_make_the_first_plan_with_the_profiled_caps():
    """Two ranks of ONE node (a profile cannot tell them apart): under emulated speeds their
    own warm-up lines decide the first plan, and the node's memory cap still holds."""
    one_node = Scheduler(global_batch_size=B, policy="optimal")
    one_node.set_capabilities([node("n", [cpu_device(beta=0.001, cap=60)]).to_dict()])
    placement = dict(rank_node_ids=["n", "n"], rank_device_kinds=["cpu", "cpu"])
    fits = [{"alpha_s": 0.0, "beta_s_per_sample": 0.001}, {"alpha_s": 0.0, "beta_s_per_sample": 0.003}]

    plan = one_node.plan_for(2, 0, **placement, rank_fits=fits)
    assert plan["local_batch_sizes"] == [30, 10]  # t = 30 ms on both ranks
    assert plan["reason"] == "optimal: split for the profiled cost model, measured by each rank's warm-up"
    assert plan["caps"] == [30, 30]  # the node's 60, shared by its two CPU ranks

    profiles_only = Scheduler(global_batch_size=B, policy="optimal")
    profiles_only.set_capabilities([node("n", [cpu_device(beta=0.001, cap=60)]).to_dict()])
    assert profiles_only.plan_for(2, 0, **placement, rank_fits=[fits[0], None])["local_batch_sizes"] == [20, 20]


def test_a_first_plan_waits_for_the_node_profiles_on_their_way(tmp_path):
    """Profiling beside the workers' start: the first plan is not made without the
    profiles while they are awaited (a restarted scheduler still awaits them); once they
    are in it is the profiled plan, with its caps."""
    waiting = scheduler(tmp_path)
    waiting.await_capabilities()
    assert waiting.plan_for(2, 0, **PLACEMENT) == {"awaiting": "node profiles"}
    assert scheduler(tmp_path).plan_for(2, 0, **PLACEMENT) == {"awaiting": "node profiles"}  # after a crash

    waiting.set_capabilities(NODES)
    profiled = waiting.plan_for(2, 0, **PLACEMENT)
    assert profiled["version"] == 0 and profiled["caps"] is not None and profiled["local_batch_sizes"][0] <= 26


def test_no_wait_where_the_first_plan_needs_no_profiles_or_the_wait_is_over():
    def awaiting(**overrides) -> Scheduler:
        made = Scheduler(**{**dict(global_batch_size=B, policy="optimal"), **overrides})
        made.await_capabilities()
        return made

    assert "awaiting" not in awaiting(policy="static").plan_for(2, 0, **PLACEMENT)
    assert awaiting(batch_split=[30, 10]).plan_for(2, 0, **PLACEMENT)["local_batch_sizes"] == [30, 10]
    gave_up = awaiting().plan_for(2, 0, **PLACEMENT, wait_for_capabilities=False)
    assert gave_up["local_batch_sizes"] == [20, 20]
    failed = awaiting()
    failed.set_capabilities([])  # profiling failed: nothing more is coming
    assert failed.plan_for(2, 0, **PLACEMENT)["local_batch_sizes"] == [20, 20]
