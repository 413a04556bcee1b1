"""Mixed GPU and CPU workers in one job, placed by node labels (fake GPU node here).

Two extra nodes join the session cluster once for the module: one labelled as a GPU
machine, one as CPU-only. `HeteroConfig(worker_devices=...)` must put one worker on each,
talk gloo between them, and the "GPU" worker — which finds no CUDA device on this machine —
must train on the CPU rather than fail. The device decision itself, and the selectors the
built-in job's `--worker-devices gpu,cpu` hands to the same trainer, are unit-tested in
tests/test_devices_and_placement.py.

On such a cluster the first step does not wait for a CPU-only node's profile: the model
the profiler builds is held back on the CPU-only node until training has made its first
step (a slow profile of exactly that node, whatever the machine's speed). Only the GPU
node is profiled first; the CPU ranks time the model themselves before step 0, and the
CPU-only node's profile arrives later, in the background, and still reaches nodes.json.
"""

from __future__ import annotations

import functools
import json
import os
import time

import pandas as pd
import pytest
import torch

from benchmarks.local_cluster import start_node, stop_nodes, wait_for_nodes
from hetero_ray.constants import DEVICE_LABEL, GPU_MODEL_LABEL
from tests.api_jobs import make_model, random_batch

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HOLD_S = 300.0  # generous: the first step comes within a minute even on a loaded machine
RELEASED, GAVE_UP = "built after the first step", "built without seeing a first step"


@pytest.fixture(scope="module")
def by_label(ray_session, tmp_path_factory):
    """A node labelled as a GPU machine and one as CPU-only join the session cluster, once
    for the module's fits (a node costs seconds); their node ids by label."""
    address = ray_session.get_runtime_context().gcs_address
    log_dir = str(tmp_path_factory.mktemp("nodes"))
    nodes = []
    try:
        nodes.append(start_node(address=address, num_cpus=1, log_dir=log_dir,
                                labels={DEVICE_LABEL: "gpu", GPU_MODEL_LABEL: "fake-a100"}))
        nodes.append(start_node(address=address, num_cpus=1, log_dir=log_dir, labels={DEVICE_LABEL: "cpu"}))
        wait_for_nodes(address, 3, nodes)
        yield {n["Labels"].get(DEVICE_LABEL): n["NodeID"] for n in ray_session.nodes()
               if n["Alive"] and n["Labels"].get(DEVICE_LABEL)}
    finally:
        stop_nodes(nodes)


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
    """A user's loop that marks its first step in a file (the steps table says where each rank ran)."""
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


def test_the_api_places_workers_by_label_and_starts_before_a_cpu_only_nodes_profile(by_label, tmp_path):
    """HeteroConfig(worker_devices=("gpu", "cpu")): one worker on each labelled node, each on
    its device kind (the fake GPU node has no CUDA device here: its worker says so and uses
    the CPU), gloo between them — and the first step before the CPU-only node's profile."""
    from ray.train import RunConfig, ScalingConfig

    from hetero_ray import HeteroConfig, HeteroTrainer, ProfileModel

    first_step_file, record_file = str(tmp_path / "first-step"), str(tmp_path / "cpu-node-build")
    build = functools.partial(build_after_the_first_step, by_label["cpu"], first_step_file, record_file)
    HeteroTrainer(_loop, train_loop_config={"first_step_file": first_step_file},
                  scaling_config=ScalingConfig(num_workers=2),
                  run_config=RunConfig(name="gpu-first", storage_path=str(tmp_path)),
                  hetero_config=HeteroConfig(global_batch_size=16, worker_devices=("gpu", "cpu"),
                                             profile_model=ProfileModel(build=build, make_batch=random_batch),
                                             profile_batch_sizes=(2, 4), profile_timeout_s=HOLD_S + 60)).fit()

    steps = pd.read_parquet(os.path.join(tmp_path, "gpu-first", "steps.parquet"))
    placed = steps.groupby("rank")["node_id"].unique().to_dict()
    assert {rank: list(ids) for rank, ids in placed.items()} == {0: [by_label["gpu"]], 1: [by_label["cpu"]]}
    assert steps["global_step"].nunique() == 4
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


def test_worker_devices_are_checked_against_the_scaling_config():
    from ray.train import ScalingConfig

    from hetero_ray import HeteroConfig, HeteroTrainer
    from hetero_ray.errors import ConfigError

    hetero = HeteroConfig(global_batch_size=16, worker_devices=("gpu", "cpu"))
    cases = [
        (ScalingConfig(num_workers=2, use_gpu=True), "leave ScalingConfig\\(use_gpu=False\\)"),
        (ScalingConfig(num_workers=3), "HeteroConfig.worker_devices has 2 values .*3"),
        (ScalingConfig(num_workers=(1, 2)), "must be a number, not a \\(min, max\\) range"),
    ]
    for scaling, message in cases:
        with pytest.raises(ConfigError, match=message):
            HeteroTrainer(_loop, scaling_config=scaling, hetero_config=hetero)
    with pytest.raises(ConfigError, match="must give each worker gpu or cpu"):
        HeteroConfig(global_batch_size=16, worker_devices=("gpu", "tpu"))
