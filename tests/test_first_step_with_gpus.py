"""On a cluster with GPUs the first step does not wait for a CPU-only node's profile.

A node labelled as a GPU machine and a CPU-only one join the session cluster (fake GPU
node: no CUDA here, as in tests/test_mixed_devices.py). The model the profiler builds is
held back on the CPU-only node until training has made its first step: a slow profile of
exactly that node, whatever the machine's speed. Before this change every node was
profiled before the workers started, so the first step waited for that profile (and the
held-back build gave up waiting, saying so). Now only the GPU node is profiled first; the
CPU ranks time the model themselves before step 0, and the CPU-only node's profile
arrives later, in the background, and still reaches nodes.json.
"""

from __future__ import annotations

import functools
import json
import os
import time

import pandas as pd
import pytest
import torch

from tests.api_jobs import make_model, random_batch
from tests.test_mixed_devices import gpu_and_cpu_nodes

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HOLD_S = 300.0  # generous: the first step comes within a minute even on a loaded machine
RELEASED, GAVE_UP = "built after the first step", "built without seeing a first step"


def build_after_the_first_step(cpu_node_id: str, first_step_file: str, record_file: str) -> torch.nn.Module:
    """make_model; in a node profiler on ``cpu_node_id``, only once ``first_step_file``
    exists (at most HOLD_S), writing to ``record_file`` which came first."""
    import ray

    context = ray.get_runtime_context()
    if context.get_node_id() == cpu_node_id and "/profiler/" in (context.get_actor_name() or ""):
        deadline = time.monotonic() + HOLD_S
        while not os.path.exists(first_step_file) and time.monotonic() < deadline:
            time.sleep(0.2)
        with open(record_file, "a") as f:
            f.write((RELEASED if os.path.exists(first_step_file) else GAVE_UP) + "\n")
    return make_model()


def _loop(config):
    import hetero_ray.train
    from tests.api_jobs import PatternDataset

    model = hetero_ray.train.prepare_model(make_model())
    loader = hetero_ray.train.prepare_data_loader(PatternDataset(64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for inputs, targets in loader:
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if hetero_ray.train.get_context().get_world_rank() == 0 and not os.path.exists(config["first_step_file"]):
            with open(config["first_step_file"], "w") as f:
                f.write(str(loader.position.global_step))


def test_the_first_step_does_not_wait_for_a_cpu_only_nodes_profile(ray_session, tmp_path):
    from ray.train import RunConfig, ScalingConfig

    from hetero_ray import HeteroConfig, HeteroTrainer, ProfileModel

    first_step_file, record_file = str(tmp_path / "first-step"), str(tmp_path / "cpu-node-build")
    with gpu_and_cpu_nodes(ray_session, tmp_path) as by_label:
        build = functools.partial(build_after_the_first_step, by_label["cpu"], first_step_file, record_file)
        HeteroTrainer(_loop, train_loop_config={"first_step_file": first_step_file},
                      scaling_config=ScalingConfig(num_workers=2),
                      run_config=RunConfig(name="gpu-first", storage_path=str(tmp_path)),
                      hetero_config=HeteroConfig(global_batch_size=16, worker_devices=("gpu", "cpu"),
                                                 profile_model=ProfileModel(build=build, make_batch=random_batch),
                                                 profile_batch_sizes=(2, 4), profile_timeout_s=HOLD_S + 60)).fit()

    with open(record_file) as f:
        assert f.readline().strip() == RELEASED, "the CPU-only node's profile held the first step back"
    plans = pd.read_parquet(os.path.join(tmp_path, "gpu-first", "plans.parquet")).sort_values("plan_version")
    # Both ranks train on a CPU here (the GPU node has no CUDA device): both timed themselves.
    assert "measured by each rank's warm-up" in plans["reason"].iloc[0], plans["reason"].iloc[0]
    with open(os.path.join(tmp_path, "gpu-first", "nodes.json")) as f:
        profiled = {n["node_id"]: n for n in json.load(f)["nodes"]}
    assert {by_label["gpu"], by_label["cpu"]} <= set(profiled), "a profile is missing from nodes.json"
    cpu_node = profiled[by_label["cpu"]]
    assert cpu_node["status"] == "ok" and any(d.get("alpha_s") is not None for d in cpu_node["devices"]), cpu_node
