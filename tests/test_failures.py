"""Invariant 4 (nothing is lost), through real failures on real Ray.

Every scenario trains the same job (same seed, data and global batch) and is held to the
same standard as an uninterrupted run of it, trained once for the module:

- the run completes and resumes exactly at the last registered checkpoint;
- every global step appears once in steps.parquet, every sample once per epoch in
  sample_ids.parquet;
- the final model equals the uninterrupted run's (same math, whatever happened), and so
  does its final accuracy.

Scenarios: the metrics-store actor killed, then a training worker SIGKILLed, in one run;
the planner killed once the balancer's plan is in force (training goes on through both
actors' deaths); the driver stopped by Ctrl-C three times and resumed by the `--resume`
command it printed; a whole node lost with elastic training (a real 3-node cluster of
`ray start` processes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
import ray
import torch

from benchmarks.local_cluster import local_cluster
from hetero_ray.constants import METRICS_STORE_ROLE, PLANNER_ROLE
from hetero_ray.runs.checkpoints import latest_checkpoint_dir
from hetero_ray.runtime.actors import get_actor
from tests.helpers import assert_stopped_run, printed_resume_command

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_SAMPLES, BATCH_SIZE, EPOCHS = 1200, 40, 2
TOTAL_STEPS = EPOCHS * NUM_SAMPLES // BATCH_SIZE  # 60
# The job every scenario runs: mlp (deterministic), slowed by emulation so failures land
# mid-run, a checkpoint every 10 steps.
JOB = dict(model="mlp", num_samples=NUM_SAMPLES, eval_samples=256, global_batch_size=BATCH_SIZE, epochs=EPOCHS, seed=0,
           lr=0.1, checkpoint_every=10, record_sample_ids=True)
CLI_JOB = ["--model", "mlp", "--num-samples", str(NUM_SAMPLES), "--eval-samples", "256", "--global-batch-size", str(BATCH_SIZE),
           "--epochs", str(EPOCHS), "--seed", "0", "--lr", "0.1", "--checkpoint-every", "10",
           "--record-sample-ids", "--no-profile"]
# Same ranks and split as the reference: only float noise (~1e-6). Another number of ranks
# sums gradients in another order; training amplifies those 1e-7 differences to ~1e-3 in
# some weights over 60 steps (the per-step losses agree to 1e-4: same math, not a bug).
WEIGHTS_TOLERANCE = 1e-4
REFERENCE_WORKERS = 2
WEIGHTS_TOLERANCE_OTHER_WORLD_SIZE = 2e-2


@pytest.fixture(scope="module")
def reference(ray_session, tmp_path_factory):
    """The uninterrupted run: its final weights and accuracy are what every scenario must reach."""
    from hetero_ray.builtin.config import TrainConfig
    from hetero_ray.builtin.driver import run_training

    config = TrainConfig(num_workers=REFERENCE_WORKERS, policy="static", profile=False, max_failures=0,
                         storage_path=str(tmp_path_factory.mktemp("reference")), name="reference", **JOB)
    result = run_training(config)
    return {"weights": torch.load(os.path.join(result.run_dir, "model_final.pt"), weights_only=True),
            "accuracy": result.summary["final_eval_metric"]}


def assert_nothing_lost(run_dir: str, reference: dict, min_restarts: int = 0) -> dict:
    """The standard of the module docstring; returns the attempts."""
    with open(os.path.join(run_dir, "attempts.json")) as f:
        attempts = json.load(f)
    assert len(attempts) >= 1 + min_restarts, attempts
    for later in attempts[1:]:
        assert later["start_global_step"] % 10 == 0, f"resumed off a checkpoint step: {attempts}"
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    per_step = steps.groupby("global_step")["local_batch_size"].sum()
    assert per_step.index.tolist() == list(range(TOTAL_STEPS)), "a global step is missing or repeated"
    assert (per_step == BATCH_SIZE).all(), "the global batch changed"
    assert not steps.duplicated(["global_step", "rank"]).any()
    ids = pd.read_parquet(os.path.join(run_dir, "sample_ids.parquet"))
    for epoch, rows in ids.groupby("epoch"):
        assert len(rows) == NUM_SAMPLES and set(rows["sample_index"]) == set(range(NUM_SAMPLES)), f"epoch {epoch}"
    weights = torch.load(os.path.join(run_dir, "model_final.pt"), weights_only=True)
    worst = max((weights[k] - reference["weights"][k]).abs().max().item() for k in weights)
    # a step with a rank left out (share 0) sums its gradient over fewer ranks, as another
    # world size does (an optimal plan leaves the slow rank out when it costs more than it adds)
    same_ranks = all(a["num_workers"] == REFERENCE_WORKERS for a in attempts) and (steps["local_batch_size"] > 0).all()
    tolerance = WEIGHTS_TOLERANCE if same_ranks else WEIGHTS_TOLERANCE_OTHER_WORLD_SIZE
    assert worst < tolerance, f"final weights differ from the uninterrupted run's by {worst}"
    train_dir = os.path.dirname(latest_checkpoint_dir(run_dir))
    for name in sorted(n for n in os.listdir(train_dir) if n.startswith("checkpoint_0")):
        with open(os.path.join(train_dir, name, "position.json")) as f:  # what --resume describes
            assert json.load(f)["position"]["global_step"] == int(name.split("_")[1]), name
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["status"] == "finished"
    assert abs(summary["final_eval_metric"] - reference["accuracy"]) <= 0.01
    return attempts


def in_background(experiment: str, past_step: int, action) -> tuple[threading.Thread, dict]:
    """Runs ``action(store, seen)`` once training (seen through its metrics store) passed a
    step. ``seen`` holds ``step`` only if the action finished; an action that failed leaves
    ``error`` instead (a kill that could not find its target must not pass for a kill)."""
    seen: dict = {}
    restarting = (ValueError, KeyError, ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError)

    def watch():
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                store = get_actor(experiment, METRICS_STORE_ROLE)
                progress = ray.get(store.progress.remote(), timeout=5)
            except restarting:  # not started yet, or restarting
                time.sleep(0.2)
                continue
            if (progress.get("global_step") or 0) >= past_step:
                seen.update(step=progress["global_step"], time=time.time())
                try:
                    action(store, seen)
                    return
                except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                    seen.pop("step", None)  # the store was restarting: ask again
                except Exception as e:  # noqa: BLE001 - reported to the test through seen
                    seen.pop("step", None)
                    seen["error"] = f"{type(e).__name__}: {e}"
                    return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


def crash_planner(experiment: str) -> dict:
    """Kills the run's planner as a crash would (Ray restarts it) and returns the restarted
    planner's info. ray.kill returns before the actor is gone: a call made at once can still
    reach the dying one, so ask until the restarted actor answers (or the deadline passes)."""
    from hetero_ray.runtime.actors import ACTOR_START_TIMEOUT_S  # a restart is a start: minutes when loaded

    ray.kill(get_actor(experiment, PLANNER_ROLE), no_restart=False)
    deadline = time.monotonic() + ACTOR_START_TIMEOUT_S
    while True:
        try:
            info = ray.get(get_actor(experiment, PLANNER_ROLE).info.remote(), timeout=ACTOR_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            info = {"restored_from": None}
        if info["restored_from"] or time.monotonic() > deadline:
            return info
        time.sleep(0.2)


def run_in_process(fast_config, name: str, **overrides):
    from hetero_ray.builtin.driver import run_training

    values = dict(JOB, num_workers=2, emulate_speeds=[0.25, 0.25], max_failures=2, name=name)
    values.update(overrides)
    return run_training(fast_config(**values))


def test_sigkill_of_a_worker_and_a_killed_metrics_store(reference, fast_config):
    """The metrics store is killed at step 15 (rows it held in memory must survive: its
    write-ahead log) and training goes on; rank 1 is SIGKILLed at step 25 and the worker group
    restarts from the checkpoint registered at the kill. Exactly one restart: the worker's."""
    def kill_store(store, seen):
        ray.kill(store, no_restart=False)

    def kill_rank_1(store, seen):
        run_dir = ray.get(store.info.remote(), timeout=5)["run_dir"]
        worker = ray.get(store.workers.remote(), timeout=5)[1]
        seen["registered"] = latest_checkpoint_dir(run_dir)  # what the restart must not fall behind
        os.kill(worker["pid"], signal.SIGKILL)

    store_watcher, store_seen = in_background("sigkill", 15, kill_store)
    watcher, seen = in_background("sigkill", 25, kill_rank_1)
    result = run_in_process(fast_config, "sigkill")
    store_watcher.join(timeout=1)
    watcher.join(timeout=1)
    assert "step" in store_seen, f"the store was never killed: {store_seen}"
    assert "step" in seen, f"the worker was never killed: {seen}"
    assert store_seen["step"] < seen["step"], (store_seen, seen)
    attempts = assert_nothing_lost(result.run_dir, reference, min_restarts=1)
    assert len(attempts) == 2, f"the store's death must not restart training, the worker's once: {attempts}"
    assert seen["registered"], "no checkpoint was registered when rank 1 was killed"
    registered = int(os.path.basename(seen["registered"]).split("_")[1])
    # From the checkpoint registered at the kill (or the next, had Ray registered it in the
    # instant between that read and the kill): never an older one, never from scratch.
    assert registered <= attempts[1]["start_global_step"] <= registered + 10, (registered, attempts)
    # The epoch the restart cut counts all its samples over all its training time: at
    # least the time of every step it kept, those before the restart included.
    epochs = pd.read_parquet(os.path.join(result.run_dir, "epochs.parquet"))
    steps = pd.read_parquet(os.path.join(result.run_dir, "steps.parquet"))
    cut = epochs[epochs["epoch"] == 0].iloc[-1]
    trained_s = steps[(steps["epoch"] == 0) & (steps["rank"] == 0)]["step_time_s"].sum()
    assert cut["samples"] == NUM_SAMPLES and cut["epoch_time_s"] >= trained_s, (cut.to_dict(), trained_s)
    print(f"\nworker SIGKILL at step {seen['step']}: new worker group {attempts[1]['wall_time'] - seen['time']:.1f} s "
          f"later, resumed at step {attempts[1]['start_global_step']}")


def test_a_planner_killed_once_balanced_restores_its_estimates_and_serves_the_plan_in_force(reference, fast_config):
    """Killed after a balanced plan and a registered checkpoint: the restarted planner takes
    its estimates from the checkpoint and the worker group it serves from its state file,
    serves the plan in force (versions only increase, every step ran the sizes its plan
    version has in plans.parquet, the balance stays) and goes on deciding."""
    def kill_planner_once_balanced(store, seen):
        # "After a checkpoint": Ray Train registers one a moment after its step, later on a
        # loaded machine; wait for the registration and the balancer's plan in force (what
        # must survive the crash), not for a step count.
        run_dir = ray.get(store.info.remote(), timeout=5)["run_dir"]
        deadline = time.monotonic() + 120
        while True:
            plans = ray.get(store.plans.remote(), timeout=5)
            if latest_checkpoint_dir(run_dir) is not None and any(p["plan_version"] >= 1 for p in plans):
                break
            assert time.monotonic() < deadline, "no checkpoint and balanced plan within 120 s"
            time.sleep(0.2)
        seen["in_force"] = max(plans, key=lambda p: p["plan_version"])
        seen["killed_after_step"] = ray.get(store.progress.remote(), timeout=5)["global_step"]
        seen["info"] = crash_planner("planner-kill")
        # Every step the old planner decided on reached the store with it (one batch to both).
        seen["back_after_step"] = ray.get(store.progress.remote(), timeout=30)["global_step"]

    # Slow enough that the restarted planner sees steps to decide on: at full speed the plan
    # leaves the slow rank out, the run outpaced the checkpoint's registration, and the rest of
    # it (~2 s) was shorter than a restart under load.
    watcher, seen = in_background("planner-kill", 5, kill_planner_once_balanced)
    result = run_in_process(fast_config, "planner-kill", policy="optimal", batch_split=[20, 20],
                            emulate_speeds=[0.05, 0.0125], rebalance_interval=5)
    watcher.join(timeout=60)
    assert "info" in seen, f"the planner was not killed (or did not come back): {seen}"
    restored = seen["info"]["restored_from"]
    assert any("checkpoint_" in path for path in restored), seen["info"]
    assert any(path.endswith("planner_state.json") for path in restored), seen["info"]
    assert seen["info"]["attempt"] == 0 and seen["info"]["end_global_step"] == TOTAL_STEPS, seen["info"]
    assert seen["in_force"]["plan_version"] >= 1, "no balanced plan before the kill: nothing was tested"
    attempts = assert_nothing_lost(result.run_dir, reference)
    assert len(attempts) == 1, "training must not restart because the planner died"
    decisions = pd.read_parquet(os.path.join(result.run_dir, "decisions.parquet"))
    assert (decisions["global_step"] > seen["back_after_step"]).any(), \
        f"no decision after the planner came back at step {seen['back_after_step']}: {decisions['global_step'].tolist()}"

    steps = pd.read_parquet(os.path.join(result.run_dir, "steps.parquet"))
    plans = pd.read_parquet(os.path.join(result.run_dir, "plans.parquet"))
    assert plans["plan_version"].is_unique, f"a plan version was handed out twice:\n{plans}"
    sizes = {int(p.plan_version): list(p.local_batch_sizes) for p in plans.itertuples()}
    ran = [sizes[int(r.plan_version)][int(r.rank)] for r in steps.itertuples()]
    assert ran == steps["local_batch_size"].tolist(), "steps.parquet and plans.parquet disagree"
    versions = steps.groupby("global_step")["plan_version"].agg(["min", "max"])
    assert (versions["min"] == versions["max"]).all() and versions["min"].is_monotonic_increasing
    after = versions.loc[versions.index > seen["killed_after_step"], "min"]
    assert after.index.max() - after.index.min() >= 10, "the kill came too late to see the restarted planner"
    assert (after >= seen["in_force"]["plan_version"]).all(), "the plan fell back after the restart"
    # Every plan after the restart is one the balancer decided (a rollback may restore equal
    # shares, with its own decision row); none is the restarted planner's own first plan.
    decided = {int(d.plan_version): list(d.local_batch_sizes) for d in decisions.itertuples() if d.adopted}
    for version in set(after) - {seen["in_force"]["plan_version"]}:
        assert decided.get(version) == sizes[version], f"plan v{version} {sizes[version]} was not decided by the balancer"


def test_driver_stopped_and_resumed(reference, tmp_path, session_ray_address):
    """Ctrl-C three times quickly, as an impatient person sends it through a terminal to the
    driver's process group, after the checkpoint at step 20, to a driver on a running
    cluster (the session's): the run says it was interrupted (tests/test_interrupted_runs.py's
    standard; the Ctrl-Cs after the first are noted, not obeyed), and the ``--resume``
    command it prints continues it to the uninterrupted run's weights. (Ctrl-C once to a
    driver with a local Ray of its own: test_interrupted_runs.py's HeteroTrainer case.)"""
    env = {**os.environ, "RAY_ADDRESS": session_ray_address, "HETERO_RAY_PROGRESS_INTERVAL_S": "1"}
    # ~0.1 s a step (mlp's ~2 ms at 0.02): the 40 steps after the checkpoint outlast the Ctrl-C's way in
    args = ["train", *CLI_JOB, "--num-workers", "2", "--emulate-speeds", "0.02,0.02", "--policy", "static",
            "--storage-path", str(tmp_path), "--name", "stopped"]
    run_dir = tmp_path / "stopped"
    driver = subprocess.Popen([sys.executable, "-m", "hetero_ray", *args], cwd=REPO_ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        latest = latest_checkpoint_dir(str(run_dir)) if run_dir.exists() else None
        if latest and int(os.path.basename(latest).split("_")[1]) >= 20:
            break
        time.sleep(0.5)
    assert driver.poll() is None, "the first run finished before it could be stopped:\n" + driver.stdout.read()
    stopped_at = time.time()
    for _ in range(3):
        os.killpg(driver.pid, signal.SIGINT)  # Ctrl-C
        time.sleep(0.1)
    first_output, _ = driver.communicate(timeout=120)
    assert_stopped_run(first_output, driver.returncode, args, str(run_dir), signal.SIGINT, TOTAL_STEPS)

    # as printed; the rest at full speed (the speeds may change at a resume: they only pad the steps)
    resume = printed_resume_command(first_output)
    resumed = subprocess.run([sys.executable, *resume[1:], "--emulate-speeds", "1,1"], cwd=REPO_ROOT, env=env,
                             text=True, capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from the checkpoint at global step" in resumed.stdout
    attempts = assert_nothing_lost(str(run_dir), reference, min_restarts=1)
    assert attempts[1]["start_global_step"] >= 20
    print(f"\ndriver stopped; --resume's worker group started {attempts[1]['wall_time'] - stopped_at:.1f} s after "
          f"the stop, at step {attempts[1]['start_global_step']}")


def test_node_lost_with_elastic_training(reference, tmp_path):
    """3 nodes of one CPU each hold one worker each; one node vanishes after a checkpoint."""
    with local_cluster(str(tmp_path), worker_cpus=[1, 1]) as (address, nodes):
        env = {**os.environ, "RAY_ADDRESS": "", "HETERO_RAY_PROGRESS_INTERVAL_S": "1"}
        command = [sys.executable, "-m", "hetero_ray", "train", "--address", address, *CLI_JOB,
                   "--num-workers", "2-3", "--emulate-speeds", "0.25,0.25,0.25", "--policy", "optimal",
                   "--storage-path", str(tmp_path / "runs"), "--name", "elastic"]
        driver = subprocess.Popen(command, cwd=REPO_ROOT, env=env, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
        run_dir = tmp_path / "runs" / "elastic"
        killed_at = None
        deadline = time.monotonic() + 300
        while driver.poll() is None and time.monotonic() < deadline:
            latest = latest_checkpoint_dir(str(run_dir)) if run_dir.exists() else None
            if killed_at is None and latest and int(os.path.basename(latest).split("_")[1]) >= 20:
                nodes[2].kill()  # a worker machine vanishes
                killed_at = time.time()
            time.sleep(0.5)
        output, _ = driver.communicate(timeout=300)
        (tmp_path / "driver.log").write_text(output)
        assert killed_at is not None, "the run ended before a node could be removed"
        assert driver.returncode == 0, output[-3000:]

    attempts = assert_nothing_lost(str(run_dir), reference, min_restarts=1)
    assert [a["num_workers"] for a in attempts] == [3, 2], attempts
    resumed_at = attempts[1]["start_global_step"]
    assert f"lost; continuing with 2 workers from step {resumed_at}" in output
    # the head runs a dashboard, through which Ray Train's placement-group cleaner sees the
    # controller: it stops with the run rather than after 12 s of looking for one
    assert "Failed to stop PlacementGroupCleaner" not in output and "runs no dashboard" not in output, output[-3000:]
    print(f"\nnode lost: the 2-worker group started {attempts[1]['wall_time'] - killed_at:.1f} s after the node "
          f"vanished, at step {resumed_at}")
