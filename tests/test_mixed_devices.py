"""Mixed GPU and CPU workers in one job, placed by node labels (fake GPU node here).

Two extra nodes join the session cluster: one labelled as a GPU machine, one as CPU-only.
`--worker-devices gpu,cpu` must put one worker on each, talk gloo between them, and the
"GPU" worker — which finds no CUDA device on this machine — must say so and train on the
CPU rather than fail. The device decision itself is unit-tested in
tests/test_devices_and_placement.py.
"""

from __future__ import annotations

import contextlib
import os

import pandas as pd
import pytest

from benchmarks.local_cluster import start_node, wait_for_nodes
from hetero_ray.constants import DEVICE_LABEL, GPU_MODEL_LABEL

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@contextlib.contextmanager
def gpu_and_cpu_nodes(ray_session, tmp_path):
    """A node labelled as a GPU machine and one as CPU-only join the session cluster for
    the block; yields their node ids by label."""
    address = ray_session.get_runtime_context().gcs_address
    nodes = []
    try:
        nodes.append(start_node(address=address, num_cpus=1, log_dir=str(tmp_path),
                                labels={DEVICE_LABEL: "gpu", GPU_MODEL_LABEL: "fake-a100"}))
        nodes.append(start_node(address=address, num_cpus=1, log_dir=str(tmp_path), labels={DEVICE_LABEL: "cpu"}))
        wait_for_nodes(address, 3, nodes)
        yield {n["Labels"].get(DEVICE_LABEL): n["NodeID"] for n in ray_session.nodes()
               if n["Alive"] and n["Labels"].get(DEVICE_LABEL)}
    finally:
        for node in nodes:
            node.stop()


def test_worker_devices_place_workers_by_node_label(ray_session, fast_config, tmp_path):
    from hetero_ray.builtin.driver import run_training

    with gpu_and_cpu_nodes(ray_session, tmp_path) as by_label:
        result = run_training(fast_config(model="mlp", num_workers=2, num_samples=256, batch_size=32,
                                          max_steps=8, worker_devices=["gpu", "cpu"], experiment_name="mixed"))

    steps = pd.read_parquet(os.path.join(result.run_dir, "steps.parquet"))
    assert set(steps["node_id"]) == {by_label["gpu"], by_label["cpu"]}, "a worker ran outside its labelled node"
    assert steps.groupby("rank")["node_id"].nunique().eq(1).all()
    assert result.summary["global_steps"] == 8 and result.summary["status"] == "finished"


def _device_loop(config):
    """A user's loop: the steps table says where each rank ran."""
    import torch

    import hetero_ray.train

    model = hetero_ray.train.prepare_model(torch.nn.Linear(4, 2))
    loader = hetero_ray.train.prepare_data_loader(torch.utils.data.TensorDataset(torch.randn(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for (inputs,) in loader:
        loss = model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_the_api_places_gpu_and_cpu_workers_by_node_label(ray_session, tmp_path):
    """HeteroConfig(worker_devices=("gpu", "cpu")): one worker on each labelled node, each on
    its device kind (the fake GPU node has no CUDA device here: its worker says so and uses
    the CPU), gloo between them."""
    from ray.train import RunConfig, ScalingConfig

    from hetero_ray import HeteroConfig, HeteroTrainer

    with gpu_and_cpu_nodes(ray_session, tmp_path) as by_label:
        HeteroTrainer(_device_loop, scaling_config=ScalingConfig(num_workers=2),
                      run_config=RunConfig(name="api-mixed", storage_path=str(tmp_path)),
                      hetero_config=HeteroConfig(global_batch_size=16, policy="static",
                                                 worker_devices=("gpu", "cpu"))).fit()

    steps = pd.read_parquet(os.path.join(tmp_path, "api-mixed", "steps.parquet"))
    placed = steps.groupby("rank")["node_id"].unique().to_dict()
    assert {rank: list(ids) for rank, ids in placed.items()} == {0: [by_label["gpu"]], 1: [by_label["cpu"]]}
    assert steps["global_step"].nunique() == 4


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
            HeteroTrainer(_device_loop, scaling_config=scaling, hetero_config=hetero)
    with pytest.raises(ConfigError, match="must give each worker gpu or cpu"):
        HeteroConfig(global_batch_size=16, worker_devices=("gpu", "tpu"))
