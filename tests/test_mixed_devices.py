"""Mixed GPU and CPU workers in one job, placed by node labels (fake GPU node here).

Two extra nodes join the session cluster: one labelled as a GPU machine, one as CPU-only.
`--worker-devices gpu,cpu` must put one worker on each, talk gloo between them, and the
"GPU" worker — which finds no CUDA device on this machine — must say so and train on the
CPU rather than fail. The device decision itself is unit-tested in
tests/test_devices_and_placement.py.
"""

from __future__ import annotations

import os

import pandas as pd
import pytest

from benchmarks.local_cluster import start_node, wait_for_nodes
from hetero_ray.constants import DEVICE_LABEL, GPU_MODEL_LABEL

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_worker_devices_place_workers_by_node_label(ray_session, fast_config, tmp_path):
    address = ray_session.get_runtime_context().gcs_address
    nodes = []
    try:
        nodes.append(start_node(address=address, num_cpus=1, log_dir=str(tmp_path),
                                labels={DEVICE_LABEL: "gpu", GPU_MODEL_LABEL: "fake-a100"}))
        nodes.append(start_node(address=address, num_cpus=1, log_dir=str(tmp_path), labels={DEVICE_LABEL: "cpu"}))
        wait_for_nodes(address, 3, nodes)
        by_label = {n["Labels"].get(DEVICE_LABEL): n["NodeID"] for n in ray_session.nodes()
                    if n["Alive"] and n["Labels"].get(DEVICE_LABEL)}

        from hetero_ray.runtime.driver import run_training

        result = run_training(fast_config(model="mlp", num_workers=2, num_samples=256, batch_size=32,
                                          max_steps=8, worker_devices=["gpu", "cpu"], experiment_name="mixed"))
    finally:
        for node in nodes:
            node.stop()

    steps = pd.read_parquet(os.path.join(result.run_dir, "steps.parquet"))
    assert set(steps["node_id"]) == {by_label["gpu"], by_label["cpu"]}, "a worker ran outside its labelled node"
    assert steps.groupby("rank")["node_id"].nunique().eq(1).all()
    assert result.summary["global_steps"] == 8 and result.summary["status"] == "finished"
