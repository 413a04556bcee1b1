"""The public API end to end, on a real local Ray with real gloo groups and real DataLoader
worker processes: a user's own model (with BatchNorm), Dataset and loop.

- same math: 3 workers, an uneven split and two mid-epoch plan changes end with the
  weights and BatchNorm statistics of one device (torch's own BatchNorm) on the same
  global batches;
- exactly once: every sample once per epoch, through prepare_data_loader(num_workers=2);
- Ray Train's Result: the user's reported metric in Result.metrics, Result.checkpoint loads;
- nothing lost: a SIGKILL right after a checkpoint, between the plan changes, resumes at
  its exact step under the plan in force, with the user's own checkpoint contents, exactly
  once, and the weights of one device;
- profiled with the user's model: HeteroConfig(profile_model=ProfileModel(...)) probes it
  on every node before the first step; a recipe that fails is said, and training goes on;
- URI storage, and a TorchConfig that reaches the workers' process group.
"""

from __future__ import annotations

import functools
import json
import os
import re

import pandas as pd
import pytest
import torch

from hetero_ray import HeteroConfig, HeteroTrainer, ProfileModel
from tests import api_jobs
from tests.api_runs import (
    BATCH, EPOCHS, NUM_SAMPLES, STEPS, assert_exactly_once, assert_one_device, final_weights, fit,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

def test_a_user_loop_with_batchnorm_under_plan_changes_and_a_sigkill_is_one_device_exactly_once(ray_session, tmp_path):
    """Two mid-epoch plan changes, and rank 1 SIGKILLed right after the checkpoint of step 3
    (the first step of the second plan): the run resumes at step 4 under the plan in force,
    with the user's own checkpoint contents, and ends with one device's weights and
    BatchNorm statistics, every sample once per epoch."""
    run_dir = str(tmp_path / "api-bn")
    hetero = HeteroConfig(global_batch_size=BATCH, policy="static", batch_split=(14, 10, 6), rebalance_interval=1,
                          record_sample_ids=True,
                          plan_changes=({"global_step": 3, "local_batch_sizes": [6, 12, 12]},
                                        {"global_step": 7, "local_batch_sizes": [20, 5, 5]}))
    crash = {"at_step": 4, "after_checkpoint": "checkpoint_000000004", "run_dir": run_dir}
    result = fit(tmp_path, "api-bn", hetero, checkpoint_every=3, crash=crash)

    with open(os.path.join(run_dir, "attempts.json")) as f:
        attempts = json.load(f)
    assert [a["start_global_step"] for a in attempts] == [0, 4], attempts  # right after step 3's checkpoint
    assert result.metrics["restored_from"] == 3  # the user's own checkpoint contents came back
    assert result.metrics["epoch"] == EPOCHS - 1 and "loss" in result.metrics
    assert "loss" in result.metrics_dataframe.columns
    assert_one_device(final_weights(result))
    assert_exactly_once(run_dir)
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    sizes = steps.sort_values("rank").groupby("global_step")["local_batch_size"].agg(list)
    assert sizes[2] == [14, 10, 6] and sizes[3] == [6, 12, 12]
    assert sizes[4] == [4, 8, 8]  # the epoch's short window, same rule; the first step after the restart
    assert sizes[5] == [6, 12, 12] and sizes[7] == [20, 5, 5]
    assert steps["data_time_s"].notna().all() and (steps["busy_time_s"] > 0).all()
    reports = pd.read_parquet(os.path.join(run_dir, "reports.parquet"))
    assert {json.loads(m)["epoch"] for m in reports["metrics"]} == {0, 1}  # a report every 3 steps and epoch
    with open(os.path.join(run_dir, "summary.json")) as f:
        assert json.load(f)["global_steps"] == STEPS


def test_nodes_are_profiled_with_the_users_model_beside_the_workers_start(ray_session, tmp_path):
    """Profiling runs while the worker group starts, and the first plan waits for the
    profiles instead of going without. The recipe's build waits for the workers' start (their
    attempt registered in attempts.json), so the profile is made while they start on any
    machine; made before their start instead, the build would fail and the plan go without."""
    run_dir = os.path.join(str(tmp_path), "api-profiled")
    recipe = ProfileModel(build=functools.partial(api_jobs.model_built_once_the_workers_started, run_dir),
                          make_batch=api_jobs.random_batch, name="pattern-bn")
    hetero = HeteroConfig(global_batch_size=BATCH, profile_model=recipe, profile_batch_sizes=(4, 16),
                          profile_timeout_s=api_jobs.WORKERS_START_WAIT_S + 120)
    result = fit(tmp_path, "api-profiled", hetero)

    with open(os.path.join(run_dir, "nodes.json")) as f:
        document = json.load(f)
    assert document["model"] == "pattern-bn" and document["batch_sizes"] == [4, 16]
    cpu = next(d for d in document["nodes"][0]["devices"] if d["kind"] == "cpu")
    sizes = [row["batch_size"] for row in cpu.get("probe") or []]
    assert sizes[:2] == [4, 16], f"the model was not profiled while the workers started: {cpu.get('error')}"
    # then doublings while the busy time looks flat: how many depends on the machine's timings
    assert all(b == 2 * a for a, b in zip(sizes[1:], sizes[2:])), sizes
    assert cpu["beta_s_per_sample"] > 0 and cpu["max_batch_size"] >= 16
    first = pd.read_parquet(os.path.join(run_dir, "plans.parquet")).iloc[0]
    assert (first["attempt"], first["first_global_step"]) == (0, 0), first
    # The profile was not in when the workers registered their start (it waited for that),
    # yet the plan of the first step is made from it: the first plan did not go without.
    assert first["reason"] == "optimal: split for the profiled cost model", first["reason"]
    assert result.metrics["epoch"] == EPOCHS - 1


def test_a_profile_model_that_fails_is_reported_and_training_starts_with_equal_shares(ray_session, tmp_path):
    from ray.train import RunConfig, ScalingConfig

    lines: list[str] = []
    recipe = ProfileModel(build=api_jobs.make_model, make_batch=api_jobs.broken_batch, name="broken")
    trainer = HeteroTrainer(
        api_jobs.batchnorm_loop, train_loop_config={"num_samples": NUM_SAMPLES, "epochs": 1},
        scaling_config=ScalingConfig(num_workers=3),
        run_config=RunConfig(name="api-broken-profile", storage_path=str(tmp_path)),
        hetero_config=HeteroConfig(global_batch_size=BATCH, profile_model=recipe, profile_batch_sizes=(4, 16)),
        emit=lines.append)
    trainer.fit()

    said = "\n".join(lines)
    # The probe asks for its sizes in its own order (the memory estimate starts at the largest).
    assert re.search(r"ValueError: no batch of (4|16) today", said), said
    first = pd.read_parquet(os.path.join(str(tmp_path), "api-broken-profile", "plans.parquet")).iloc[0]
    assert list(first["local_batch_sizes"]) == [10, 10, 10], first


def test_own_dataloader_without_prepare_data_loader_averages_like_one_device(ray_session, tmp_path):
    """The Ray Train habit (a DistributedSampler, no prepare_data_loader): the ranks' gradients
    are averaged, as DDP averages them, not summed (which gave 2× the gradient on 2 ranks)."""
    from ray.train import RunConfig, ScalingConfig

    from tests import own_loader_jobs

    num_samples, local_batch, epochs = 64, 8, 2
    result = HeteroTrainer(
        own_loader_jobs.own_loader_loop,
        train_loop_config={"num_samples": num_samples, "local_batch_size": local_batch, "epochs": epochs},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="api-own-loader", storage_path=str(tmp_path)),
        hetero_config=HeteroConfig(global_batch_size=2 * local_batch, policy="static"),
    ).fit()

    with result.checkpoint.as_directory() as directory:
        weights = torch.load(os.path.join(directory, "model.pt"), weights_only=True)
    reference = own_loader_jobs.one_device(num_samples, 2 * local_batch, epochs)
    worst = {k: (reference[k].float() - weights[k].float()).abs().max().item() for k in reference}
    assert max(worst.values()) < 1e-5, f"2 workers with their own DataLoader diverged from one device: {worst}"


def _uri_holds_step_zero(run_remote) -> bool:
    for part in (run_remote / "parts" / "steps").glob("part-*.parquet"):
        try:
            if 0 in pd.read_parquet(part)["global_step"].values:
                return True
        except Exception:  # noqa: BLE001 - a part still being copied: look again
            continue
    return False


_RUN_PROCESS_TITLES = ("ray::TrainController", "ray::RayTrainWorker", "ray::MetricsStore", "ray::PlannerActor")


def _wait_until_the_crashed_run_is_gone(name: str, timeout_s: float) -> None:
    """Until no Ray Train controller and none of the run's own actors (store, planner) live,
    and none of their processes runs: a killed driver's actors in this test's cluster die a
    moment after it, and Ray calls an actor dead before its process has ended (the old store
    then still copied tables, and the old controller still registered a checkpoint, while
    the resume took the tables back). No other run lives in this cluster meanwhile."""
    import time

    import psutil
    from ray.util.state import list_actors

    from hetero_ray.runtime.actors import EXPERIMENT_ROLES, get_actor

    def alive() -> list[str]:
        found = [f"{a.class_name} {a.actor_id}" for a in
                 list_actors(filters=[("class_name", "=", "TrainController"), ("state", "=", "ALIVE")])]
        for role in EXPERIMENT_ROLES:
            try:
                get_actor(name, role)
                found.append(role)
            except ValueError:
                pass
        for process in psutil.process_iter(["cmdline"]):
            title = " ".join(process.info["cmdline"] or [])
            if title.startswith(_RUN_PROCESS_TITLES):
                found.append(f"process {process.pid} {title[:40]}")
        return found

    deadline = time.monotonic() + timeout_s
    while left := alive():
        assert time.monotonic() < deadline, f"the killed driver's actors still live after {timeout_s} s: {left}"
        time.sleep(0.5)


def _steps_held(folder) -> dict[str, list[int]]:
    """Per file of the steps table under ``folder``: the global steps it holds (a failure's evidence)."""
    held = {}
    for path in sorted([*folder.glob("steps.parquet"), *folder.glob("parts/steps/*")]):
        try:
            held[str(path.relative_to(folder))] = sorted(set(pd.read_parquet(path)["global_step"].tolist()))
        except Exception as e:  # noqa: BLE001 - evidence, not a check
            held[str(path.relative_to(folder))] = [f"unreadable: {e}"]
    return held


def test_uri_storage_keeps_the_tables_beside_each_checkpoint_through_a_driver_crash(session_ray_address, tmp_path):
    """The tables follow each checkpoint to the URI: a driver SIGKILLed mid-run, then fit()
    under the same name on another machine (another output_dir), ends with every step of
    the run once in the URI's tables — not just the steps after the resume.

    A file:// URI takes the path every pyarrow.fs URI (s3://, gs://) takes: Ray Train
    checkpoints to the URI, the tables are written locally and copied there; the Ray Train
    run is named after the experiment. The resumed run's TorchConfig (not Ray Train's
    default way of meeting, init_method="env") sets up the workers' group."""
    import signal
    import subprocess
    import sys
    import time

    from ray.train.torch import TorchConfig

    from tests import uri_driver

    remote, uri = tmp_path / "bucket", f"file://{tmp_path / 'bucket'}"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    driver = subprocess.Popen([sys.executable, "-m", "tests.uri_driver", uri, str(tmp_path / "first")], cwd=repo,
                              env={**os.environ, "RAY_ADDRESS": session_ray_address}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    run_remote = remote / uri_driver.NAME
    try:
        deadline = time.monotonic() + 240
        # A checkpoint's tables are copied file by file: wait until the copy holds the first
        # steps' rows, not merely until its folder appeared (on a loaded machine the kill
        # then landed mid-copy, before the step rows were there).
        while not (list(run_remote.glob("checkpoint_*")) and _uri_holds_step_zero(run_remote)):
            assert driver.poll() is None, "the first driver ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint with its step rows reached the URI in 240 s"
            time.sleep(0.2)
        time.sleep(1.0)  # a little past the checkpoint: steps the resume will train again
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
    # The killed driver's Ray Train controller lives in this test's cluster and dies a moment
    # after it, still writing its snapshot (storage.RunStorage.continues_a_run: the race, tested
    # in test_remote_copy.py). Here: the resume once it and the run's actors are gone.
    _wait_until_the_crashed_run_is_gone(uri_driver.NAME, timeout_s=120)
    at_the_uri = _steps_held(run_remote)
    checkpoints = sorted(p.name for p in run_remote.glob("checkpoint_*"))
    total = uri_driver.EPOCHS * uri_driver.NUM_SAMPLES // uri_driver.BATCH
    assert f"checkpoint_{total:09d}" not in checkpoints, f"the first driver finished before the kill: {checkpoints}"

    result = uri_driver.trainer(uri, str(tmp_path / "elsewhere"),
                                torch_config=TorchConfig(backend="gloo", init_method="tcp")).fit()

    assert result.metrics["process_group"] == "gloo via tcp"
    assert result.path.rstrip("/").endswith(f"bucket/{uri_driver.NAME}")
    assert result.checkpoint.path.startswith(str(run_remote / "checkpoint_"))
    for name in ("steps.parquet", "plans.parquet", "summary.json"):
        assert (run_remote / name).exists(), name
        assert (tmp_path / "elsewhere" / uri_driver.NAME / name).exists(), name

    steps = pd.read_parquet(run_remote / "steps.parquet")
    assert sorted(steps["global_step"].unique()) == list(range(total)), (
        f"steps before the crash were lost: after the resume {sorted(steps['global_step'].unique())}; at the URI "
        f"after the crash {at_the_uri} beside {checkpoints}; the crashed driver's own folder "
        f"{_steps_held(tmp_path / 'first' / uri_driver.NAME)}; the resume started at step "
        f"{steps[steps['attempt'] == steps['attempt'].max()]['global_step'].min()}")
    assert not steps.duplicated(["global_step", "rank"]).any()
    assert steps["attempt"].nunique() == 2  # the crashed driver's attempt, and the resumed one
