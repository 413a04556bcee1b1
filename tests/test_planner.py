"""The planner (pure class) and its actor's shell (as a plain class, without Ray).

A new actor on the same run directory — what Ray starts after the actor crashed — serves
the plan in force, keeps counting versions from where the old one stopped, and still knows
the node profiles, the caps, the worker group it serves and the run's end."""

from __future__ import annotations

import os

import pytest

from hetero_ray.planning.balancer_state import Proposal
from hetero_ray.planning.planner import Planner
from hetero_ray.planning.rank_facts import RankFacts
from hetero_ray.planning.simulation import SimulatedCluster
from hetero_ray.runs.run_files import PLANNER_STATE_FILE
from hetero_ray.runtime.planner_actor import PlannerActor
from tests.helpers import cpu_device, node, step_rows

B = 40
NODES = [node("fast", [cpu_device(beta=0.001, cap=26)]).to_dict(),
         node("slow", [cpu_device(beta=0.004, cap=400)]).to_dict()]
PLACEMENT = dict(node_ids=["fast", "slow"], device_kinds=["cpu", "cpu"])


class FakeStore:
    """The metrics store's one method the planner actor calls."""

    def __init__(self):
        self.decisions: list[dict] = []
        self.add_decision = self

    def remote(self, row: dict) -> None:
        self.decisions.append(row)


def planner(**overrides) -> Planner:
    return Planner(**{**dict(global_batch_size=B, policy="optimal", rebalance_interval=5), **overrides})


def actor(run_dir, store=None, **overrides) -> PlannerActor:
    """As the driver makes it (a restart makes it again with the same arguments)."""
    return PlannerActor(store or FakeStore(), str(run_dir),
                        **{**dict(global_batch_size=B, policy="optimal", rebalance_interval=5), **overrides})


def test_records_feed_the_plan_rank_0_is_given():
    """One authority: the plan the balancer adopts is the plan ``plan_for`` serves, within
    the caps of the first plan, with versions from one counter."""
    one = planner()
    # Profiled as equally fast; rank 0 is really 4x faster, but holds 26 samples at most.
    one.set_capabilities([node("fast", [cpu_device(beta=0.002, cap=26)]).to_dict(),
                          node("slow", [cpu_device(beta=0.002, cap=400)]).to_dict()])
    first = one.plan_for(2, 0, RankFacts(**PLACEMENT))
    assert first["local_batch_sizes"] == [20, 20] and one.caps == [26, 400]
    one.begin_attempt(0, 2, 0, end_global_step=60)
    cluster = SimulatedCluster(alphas=[0.005, 0.005], betas=[0.001, 0.004], noise=0.03, seed=0)
    plan, served, decisions = first, [first], []
    for step in range(60):
        if step % 5 == 0:
            plan = one.plan_for(2, step, RankFacts(**PLACEMENT))
            served.append(plan)
        decisions += one.add_steps(step_rows(cluster, step, plan, attempt=0), now=step * 0.01)
    decisions += one.close()
    versions = [p["version"] for p in served]
    assert versions == sorted(versions) and versions[-1] >= 1, "the balancer never moved work"
    assert all(p["local_batch_sizes"][0] <= 26 for p in served), served
    adopted = {d["plan_version"]: d["local_batch_sizes"] for d in decisions if d["adopted"]}
    assert all(adopted[p["version"]] == p["local_batch_sizes"] for p in served if p["version"] >= 1)


def test_a_decision_row_names_the_version_its_plan_was_given():
    """The planner alone numbers plans. Records reach it an interval late, so a scripted
    change is adopted between two balancer decisions while the second is still made on
    records of the plan before that change; its row must name the version its plan was
    given, not one after the plan it decided on (that is the scripted plan's)."""
    scripted_step = 15
    one = planner(plan_changes=[{"global_step": scripted_step, "local_batch_sizes": [30, 10]}],
                  policy_config={"confirm_below": 1.0})  # moves at once: the timing this test sets up
    cluster = SimulatedCluster(alphas=[0.005, 0.005], betas=[0.001, 0.004], noise=0.03, seed=0)
    plan = one.plan_for(2, 0)
    one.begin_attempt(0, 2, 0, end_global_step=60)
    served, decisions, late = [plan], [], []
    for step in range(60):
        if step and step % 5 == 0:  # rank 0 at a rebalance point, then the last interval's records
            plan = one.plan_for(2, step)
            served.append(plan)
            decisions += one.add_steps(late)
            late = []
        late += step_rows(cluster, step, plan, attempt=0)
    decisions += one.add_steps(late) + one.close()

    scripted = next(p for p in served if p["reason"].startswith("scripted"))
    adopted = sorted((d for d in decisions if d["adopted"]), key=lambda d: d["global_step"])
    by_version = {d["plan_version"]: d for d in adopted}
    assert any(d["plan_version"] < scripted["version"] for d in adopted), "no balancer plan before the change"
    after = next(p for p in served if p["version"] > scripted["version"])
    assert by_version[after["version"]]["global_step"] < scripted_step  # decided on the plan before the change
    for p in served:  # every balancer plan rank 0 was given has the row of its decision
        if p["version"] >= 1 and p is not scripted:
            assert by_version[p["version"]]["local_batch_sizes"] == p["local_batch_sizes"], (p, adopted)
    versions = [d["plan_version"] for d in adopted]
    assert versions == sorted(set(versions)) and scripted["version"] not in versions, versions
    sizes_of = {}
    for p in served:  # versions only increase, and none is handed out twice
        assert p["version"] >= max(sizes_of, default=0)
        assert sizes_of.setdefault(p["version"], p["local_batch_sizes"]) == p["local_batch_sizes"]


def test_a_restarted_planner_serves_the_plan_in_force_and_keeps_counting(tmp_path):
    first = actor(tmp_path)
    first.set_capabilities(NODES)
    profiled = first.plan_for(2, 0, RankFacts(**PLACEMENT))
    assert first.info()["caps"] is not None and profiled["local_batch_sizes"][0] <= 26
    first._planner._adopt(Proposal((25, 15), "balancer", row={}))  # as an adoption does
    first._save()
    in_force = first.plan_for(2, 20, RankFacts(**PLACEMENT))

    again = actor(tmp_path)  # the crashed actor's replacement
    assert again.info()["restored_from"] == [os.path.join(str(tmp_path), PLANNER_STATE_FILE)]
    assert again.plan_for(2, 40, RankFacts(**PLACEMENT)) == in_force  # same version and sizes
    assert again.info()["caps"] == first.info()["caps"]
    again._planner._adopt(Proposal((24, 16), "balancer", row={}))
    assert again.plan_for(2, 45)["version"] == 2  # no version is handed out twice


def test_a_restarted_planner_still_knows_the_group_and_the_end(tmp_path):
    first = actor(tmp_path)
    first.set_capabilities(NODES)
    first.plan_for(2, 0, RankFacts(**PLACEMENT))
    first.begin_attempt(3, 2, 10, end_global_step=30)

    info = actor(tmp_path).info()
    assert (info["attempt"], info["num_workers"], info["caps"], info["end_global_step"]) == (3, 2, [26, 400], 30)


def test_a_restarted_planner_still_has_the_node_profiles(tmp_path):
    first = actor(tmp_path)
    first.set_capabilities(NODES)
    first.plan_for(2, 0, RankFacts(**PLACEMENT))

    knows_profiles = planner()
    knows_profiles.set_capabilities(NODES)
    three_ranks = dict(node_ids=["fast", "slow", "slow"], device_kinds=["cpu"] * 3)
    expected = knows_profiles.plan_for(3, 0, RankFacts(**three_ranks))
    # An elastic restart after the crash: the new group's first plan comes from the profiles.
    again = actor(tmp_path)
    plan = again.plan_for(3, 60, RankFacts(**three_ranks))
    assert plan["local_batch_sizes"] == expected["local_batch_sizes"] and again.info()["caps"] == knows_profiles.caps
    assert plan["version"] == 1


def test_scripted_changes_already_applied_are_not_applied_again(tmp_path):
    changes = [{"global_step": 10, "local_batch_sizes": [30, 10]}]
    first = actor(tmp_path, policy="static", plan_changes=changes)
    first.plan_for(2, 0)
    assert first.plan_for(2, 10)["version"] == 1

    again = actor(tmp_path, policy="static", plan_changes=changes)
    assert again.plan_for(2, 20) == {"version": 1, "local_batch_sizes": [30, 10],
                                     "reason": "scripted change at step 10"}


def test_a_damaged_state_file_means_a_fresh_start(tmp_path):
    (tmp_path / PLANNER_STATE_FILE).write_text('{"plan": {"version": 3, "local_batch_si')
    fresh = actor(tmp_path, policy="static")
    assert fresh.info()["restored_from"] == []
    assert fresh.plan_for(2, 0)["local_batch_sizes"] == [20, 20]


def test_without_a_run_directory_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    in_memory = PlannerActor(FakeStore(), None, global_batch_size=B, policy="static", rebalance_interval=5)
    in_memory.plan_for(2, 0)
    in_memory.begin_attempt(0, 2, 0)
    assert os.listdir(tmp_path) == []


def test_the_ranks_warm_up_lines_make_the_first_plan_with_the_profiled_caps():
    """Two ranks of ONE node (a profile cannot tell them apart): under emulated speeds their
    own warm-up lines decide the first plan, and the node's memory cap still holds."""
    one_node = planner()
    one_node.set_capabilities([node("n", [cpu_device(beta=0.001, cap=60)]).to_dict()])
    placement = dict(node_ids=["n", "n"], device_kinds=["cpu", "cpu"])
    fits = [{"alpha_s": 0.0, "beta_s_per_sample": 0.001}, {"alpha_s": 0.0, "beta_s_per_sample": 0.003}]

    plan = one_node.plan_for(2, 0, RankFacts(**placement, fits=fits))
    assert plan["local_batch_sizes"] == [30, 10]  # t = 30 ms on both ranks
    assert plan["reason"] == "optimal: split for the profiled cost model, measured by each rank's warm-up"
    assert one_node.caps == [30, 30]  # the node's 60, shared by its two CPU ranks

    profiles_only = planner()
    profiles_only.set_capabilities([node("n", [cpu_device(beta=0.001, cap=60)]).to_dict()])
    assert profiles_only.plan_for(2, 0, RankFacts(**placement, fits=[fits[0], None]))["local_batch_sizes"] == [20, 20]


def test_a_first_plan_waits_for_the_node_profiles_on_their_way(tmp_path):
    """Profiling beside the workers' start: the first plan is not made without the
    profiles while they are awaited (a restarted planner still awaits them); once they
    are in it is the profiled plan, with its caps. What the driver's fit() said at the
    planner's start holds once per fit(): not again after a restart, again at the next."""
    waiting = actor(tmp_path, launch_id="fit-1", first_plan="profiles")
    assert waiting.plan_for(2, 0, RankFacts(**PLACEMENT)) == {"awaiting": "node profiles"}
    restarted = actor(tmp_path, launch_id="fit-1", first_plan="profiles")  # after a crash
    assert restarted.plan_for(2, 0, RankFacts(**PLACEMENT)) == {"awaiting": "node profiles"}

    waiting.set_capabilities(NODES)
    profiled = waiting.plan_for(2, 0, RankFacts(**PLACEMENT))
    assert profiled["version"] == 0 and waiting.info()["caps"] is not None
    assert profiled["local_batch_sizes"][0] <= 26

    def awaits(launch_id: str, first_plan) -> bool:
        return actor(tmp_path, launch_id=launch_id, first_plan=first_plan)._planner.state_dict()["awaiting_capabilities"]

    assert not awaits("fit-1", "profiles"), "restarted after the profiles came, within one fit(), it awaits them again"
    # A later fit() of the run (a resume) that profiles again awaits its own profiles; one
    # that does not profile awaits nothing, whatever the one before was waiting for.
    assert awaits("fit-2", "profiles") and not awaits("fit-3", None)
    with pytest.raises(ValueError, match="first_plan must be"):
        actor(tmp_path / "bad", launch_id="fit-1", first_plan="guess")


def test_no_wait_where_the_first_plan_needs_no_profiles_or_the_wait_is_over():
    def awaiting(**overrides) -> Planner:
        made = planner(**overrides)
        made.await_capabilities()
        return made

    assert "awaiting" not in awaiting(policy="static").plan_for(2, 0, RankFacts(**PLACEMENT))
    assert awaiting(batch_split=[30, 10]).plan_for(2, 0, RankFacts(**PLACEMENT))["local_batch_sizes"] == [30, 10]
    gave_up = awaiting().plan_for(2, 0, RankFacts(**PLACEMENT), wait_for_capabilities=False)
    assert gave_up["local_batch_sizes"] == [20, 20]
    failed = awaiting()
    failed.set_capabilities([])  # profiling failed: nothing more is coming
    assert failed.plan_for(2, 0, RankFacts(**PLACEMENT))["local_batch_sizes"] == [20, 20]


def test_decision_rows_go_to_the_store(tmp_path):
    store = FakeStore()
    one = actor(tmp_path, store=store, batch_split=[20, 20])
    plan = one.plan_for(2, 0)
    one.begin_attempt(0, 2, 0)
    cluster = SimulatedCluster(alphas=[0.005, 0.005], betas=[0.001, 0.004], noise=0.03, seed=1)
    for step in range(12):
        one.add_steps(step_rows(cluster, step, plan, attempt=0))
    one.close()
    assert store.decisions and all(d["policy"] == "optimal" for d in store.decisions)


def test_a_decision_awaiting_its_outcome_survives_a_restart(tmp_path):
    """Killed between an adoption and its measured outcome, the planner's replacement still
    emits that decision's row (with the version its plan was given) once the plan has run:
    the decisions table names every plan the balancer made."""
    first, store = actor(tmp_path, policy="optimal"), FakeStore()
    first._store = store
    cluster = SimulatedCluster(alphas=[0.005, 0.005], betas=[0.001, 0.004], noise=0.0, seed=0)
    plan = first.plan_for(2, 0)
    first.begin_attempt(0, 2, 0, end_global_step=60)
    step = 0
    while first.info()["plan"]["version"] == 0:
        first.add_steps(step_rows(cluster, step, plan, attempt=0))
        step += 1
    adopted = first.info()["plan"]
    assert not any(d["adopted"] for d in store.decisions), "the adoption's row was emitted before its outcome"

    again, after = actor(tmp_path, policy="optimal"), FakeStore()
    again._store = after
    plan = again.plan_for(2, step)
    assert plan == adopted
    for step in range(step, step + 10):
        again.add_steps(step_rows(cluster, step, plan, attempt=0))
    rows = [d for d in after.decisions if d["adopted"]]
    assert [(d["plan_version"], d["local_batch_sizes"]) for d in rows] == [(1, adopted["local_batch_sizes"])], rows
    assert rows[0]["achieved_step_time_s"] > 0


def test_what_a_rollback_taught_survives_a_restart(tmp_path):
    first = actor(tmp_path)
    first.plan_for(2, 0)
    first.begin_attempt(0, 2, 0, end_global_step=60)
    first._planner.balancer._learned_caps = [24, None]  # as a rollback leaves them
    first._save()
    assert actor(tmp_path)._planner.balancer._learned_caps == [24, None]


def test_without_profiles_to_come_the_first_plan_follows_the_ranks_cores(tmp_path):
    """Several CPU-only nodes are not profiled: the first plan shares the batch by the cores
    each rank can use (the capped node's third of a core), and a restarted planner still
    knows that no profiles will come."""
    first = actor(tmp_path, launch_id="fit-1", first_plan="cores")
    cpus = [{"threads": 1, "quota_cores": None}, {"threads": 1, "quota_cores": 0.33}]
    plan = first.plan_for(2, 0, RankFacts(["head", "capped"], ["cpu", "cpu"], cpus=cpus))
    assert plan["local_batch_sizes"] == [30, 10]  # 1 : 0.33 of 40
    assert "CPU cores each rank can use (1, 0.33)" in plan["reason"]
    three = actor(tmp_path, launch_id="fit-1", first_plan="cores").plan_for(3, 20, RankFacts(["head", "capped", "capped"], ["cpu"] * 3,
                                                               cpus=[cpus[0], cpus[1], cpus[1]]))
    assert three["local_batch_sizes"] == [30, 5, 5]  # the capped node's two ranks share its quota

    told_nothing = actor(tmp_path / "other")
    os.makedirs(tmp_path / "other", exist_ok=True)
    assert told_nothing.plan_for(2, 0, RankFacts(["head", "capped"], ["cpu", "cpu"],
                                                   cpus=cpus))["local_batch_sizes"] == [20, 20]


def test_on_a_gpu_cluster_cpu_ranks_plan_from_their_warm_up_and_their_late_profile_gives_caps():
    """The CPU-only node is profiled after the first plan: the GPU rank's line is its GPU's
    profile, the CPU rank's its own warm-up; the CPU node's profile, once in, joins the GPU
    node's and gives the CPU rank the memory cap it lacked."""
    from tests.helpers import gpu_device

    mixed = planner()
    mixed.set_capabilities([node("g", [cpu_device(), gpu_device(0, alpha=0.001, beta=0.0001, cap=2048)]).to_dict()])
    placement = dict(node_ids=["g", "c"], device_kinds=["gpu", "cpu"])
    fits = [None, {"alpha_s": 0.0, "beta_s_per_sample": 0.001, "floor_s": 0.0}]

    plan = mixed.plan_for(2, 0, RankFacts(**placement, fits=fits))
    assert plan["local_batch_sizes"][0] > plan["local_batch_sizes"][1] > 0  # the GPU is ~10x faster
    assert "rank(s) 1 measured by their own warm-up, the others by their node profiles" in plan["reason"]
    assert mixed.caps == [2048, None]

    mixed.set_capabilities([node("c", [cpu_device(cap=300)]).to_dict()])
    assert mixed.info()["num_nodes"] == 2  # joined, not replaced
    assert mixed.caps == [2048, 300]
    assert mixed.plan_for(2, 0, RankFacts(**placement))["version"] == plan["version"]  # no new first plan for it

    restarted_group = planner()  # e.g. an elastic restart: its CPU rank's node has a profile by now
    restarted_group.set_capabilities([node("g", [cpu_device(), gpu_device(0)]).to_dict(),
                                      node("c", [cpu_device(beta=0.1, cap=300)]).to_dict()])
    again = restarted_group.plan_for(2, 0, RankFacts(**placement, fits=fits))
    assert again["local_batch_sizes"] == plan["local_batch_sizes"] and "rank(s) 1 measured by" in again["reason"]

    without_warm_up = planner()
    without_warm_up.set_capabilities([node("g", [cpu_device(), gpu_device(0)]).to_dict()])
    assert without_warm_up.plan_for(2, 0, RankFacts(**placement))["local_batch_sizes"] == [20, 20]  # no line for rank 1
