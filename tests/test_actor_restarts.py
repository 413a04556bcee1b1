"""What a restarted actor of a run must still know (real actors on the shared local Ray).

The planner is killed right after the worker group started — before any checkpoint
could carry its estimates — and then fed the group's step records the way the workers send
them, with rank 0's part played here: at every rebalance point it fetches the planner's
plan, and the records that follow run under it.
"""

from __future__ import annotations

import os
import time

import pytest
import ray

from hetero_ray.planning.rank_facts import RankFacts
from hetero_ray.planning.simulation import SimulatedCluster
from hetero_ray.runtime import actors
from tests.helpers import cpu_device, node

pytestmark = pytest.mark.ray

B, INTERVAL, STEPS = 40, 5, 60
CAPS = [24, None]  # rank 0's device holds 24 samples at most; the balance point is 32/8
END = 30  # the run ends at step 30: no plan for point 30 or later
# Profiled as equally fast (the first plan is 20/20), rank 0's node with the cap above.
NODES = [node("a", [cpu_device(beta=0.001, cap=CAPS[0])]).to_dict(),
         node("b", [cpu_device(beta=0.001, cap=None)]).to_dict()]
PLACEMENT = dict(node_ids=["a", "b"], device_kinds=["cpu", "cpu"])


def start_run_actors(name: str, run_dir: str) -> tuple:
    node_id = ray.get_runtime_context().get_node_id()
    store = actors.start_metrics_store(name, run_dir, node_id)
    planner = actors.start_planner(name, run_dir, node_id, global_batch_size=B, policy="optimal",
                                   rebalance_interval=INTERVAL)
    return store, planner


def _pid(actor_instance) -> int:
    return os.getpid()


def crash(actor) -> None:
    """Kills the actor's process as a crash would, and waits for Ray's replacement (a new
    process importing torch: minutes on a loaded machine, so the wait is a start's)."""
    before = ray.get(actor.__ray_call__.remote(_pid), timeout=30)
    ray.kill(actor, no_restart=False)
    wait_s = actors.ACTOR_START_TIMEOUT_S
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if ray.get(actor.__ray_call__.remote(_pid), timeout=wait_s) != before:  # calls wait for the restart
                return
        except ray.exceptions.GetTimeoutError:
            pass
        assert time.monotonic() < deadline, f"the actor did not come back within {wait_s:.0f} s"
        time.sleep(0.1)


def _decisions_sent(planner_instance) -> list[dict]:
    """Runs inside the planner: its earlier calls to the store are processed first (one
    caller's calls to an actor run in order), so these are all the rows it sent."""
    return ray.get(planner_instance._store.decisions.remote())


def feed_like_the_workers(planner, attempt: int) -> list[dict]:
    """The steps of the group; returns the plans rank 0 got from the planner."""
    sim = SimulatedCluster(alphas=[0.005, 0.005], betas=[0.001, 0.004], noise=0.03, seed=0)
    plans = []
    for step in range(STEPS):
        if step % INTERVAL == 0:
            plans.append(ray.get(planner.plan_for.remote(2, step, RankFacts(**PLACEMENT)), timeout=30))
        plan = plans[-1]
        sizes = plan["local_batch_sizes"]
        rows = [{"rank": r, "global_step": step, "local_batch_size": b, "busy_time_s": float(t),
                 "plan_version": plan["version"], "attempt": attempt}
                for r, (b, t) in enumerate(zip(sizes, sim.busy_times_s(sizes, step)))]
        ray.get(planner.add_steps.remote(rows), timeout=30)
    return plans


def test_a_restarted_planner_keeps_the_plan_the_caps_and_the_end_step(ray_session, tmp_path):
    name = "planner-restart"
    run_dir = tmp_path / name
    run_dir.mkdir()
    store, planner = start_run_actors(name, str(run_dir))
    try:
        ray.get(planner.set_capabilities.remote(NODES), timeout=30)
        attempt = ray.get(store.begin_attempt.remote(0, 2), timeout=30)
        first = ray.get(planner.plan_for.remote(2, 0, RankFacts(**PLACEMENT)), timeout=30)
        assert first["local_batch_sizes"] == [20, 20], first
        ray.get(planner.begin_attempt.remote(attempt, 2, 0, end_global_step=END), timeout=30)

        crash(planner)
        info = ray.get(planner.info.remote(), timeout=30)
        assert (info["attempt"], info["caps"], info["end_global_step"]) == (attempt, CAPS, END), info
        # the reply also carries each rank's memory cap (the micro-batch size); the plan is the rest
        plan = {k: v for k, v in first.items() if k != "memory_caps"}
        assert info["plan"] == plan and info["next_version"] == 1, info
        assert info["memory_caps"] == first["memory_caps"] == CAPS, info

        plans = feed_like_the_workers(planner, attempt)
        ray.get(planner.close.remote(), timeout=30)
        decisions = ray.get(planner.__ray_call__.remote(_decisions_sent), timeout=30)
    finally:
        for actor in (planner, store):
            actors.kill_actor(actor)
    assert any(p["version"] >= 1 for p in plans), "the planner never moved work: nothing was tested"
    assert all(p["local_batch_sizes"][0] <= CAPS[0] for p in plans), f"a share above the cap: {plans}"
    assert decisions and all(d["global_step"] + 1 < END for d in decisions), \
        f"decided for a point the run never reaches: {[d['global_step'] for d in decisions]}"
