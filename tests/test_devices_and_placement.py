"""Mixed GPU/CPU workers: the device each worker picks, and where workers may be placed.

Fake nodes stand in for GPU machines (none here): the decisions are pure functions.
"""

from __future__ import annotations

import pytest

from hetero_ray.builtin.config import TrainConfig
from hetero_ray.constants import DEVICE_LABEL
from hetero_ray.runtime.cluster import (
    Connection, NodeResources, dashboard_note, placeable_workers, unmatched_selectors,
)
from hetero_ray.runtime.progress import attempt_nodes, restart_message, waiting_line
from hetero_ray.training.rank.devices import choose_device
from tests.helpers import built_in_job_trainer


@pytest.mark.parametrize("mode,label,local_rank,gpus,kind,index,hide", [
    ("gpu", None, 0, 1, "gpu", None, False),    # Ray assigned the GPU
    ("cpu", None, 0, 4, "cpu", None, True),     # CPU job on a GPU machine: hide the GPUs
    ("cpu", None, 0, 0, "cpu", None, False),
    ("mixed", "gpu", 0, 2, "gpu", 0, False),
    ("mixed", "gpu", 1, 2, "gpu", 1, False),    # second worker on a 2-GPU node: the second GPU
    ("mixed", "cpu", 0, 2, "cpu", None, True),  # CPU worker on a machine with GPUs must not grab one
    ("mixed", None, 0, 0, "cpu", None, False),  # unlabelled node: CPU
])
def test_choose_device(mode, label, local_rank, gpus, kind, index, hide):
    choice = choose_device(mode, label, local_rank, gpus)
    assert (choice.kind, choice.cuda_index, choice.hide_gpus) == (kind, index, hide)
    assert choice.warning is None


def test_gpu_label_without_cuda_falls_back_to_cpu_and_says_so():
    choice = choose_device("mixed", "gpu", 0, 0)
    assert choice.kind == "cpu" and "no CUDA device" in choice.warning
    choice = choose_device("mixed", "gpu", 3, 2)
    assert choice.kind == "cpu" and choice.hide_gpus and "only 2 GPU" in choice.warning


def test_worker_devices_become_label_selectors():
    config = TrainConfig(num_workers=3, global_batch_size=48, worker_devices=["gpu", "gpu", "cpu"], name="x")
    assert config.cluster.mixed_devices
    assert config.cluster.label_selectors() == [{DEVICE_LABEL: "gpu"}, {DEVICE_LABEL: "gpu"}, {DEVICE_LABEL: "cpu"}]


def test_selectors_no_node_satisfies_are_reported():
    nodes = [NodeResources("a", "10.0.0.1", 8, 1, {DEVICE_LABEL: "gpu"}),
             NodeResources("b", "10.0.0.2", 16, 0, {DEVICE_LABEL: "cpu"})]
    assert unmatched_selectors(nodes, [{DEVICE_LABEL: "gpu"}, {DEVICE_LABEL: "cpu"}]) == []
    assert unmatched_selectors(nodes, [{DEVICE_LABEL: "tpu"}]) == [{DEVICE_LABEL: "tpu"}]
    assert placeable_workers(nodes, cpus_per_worker=4, gpus_per_worker=0) == 6
    assert placeable_workers(nodes, cpus_per_worker=4, gpus_per_worker=1) == 1


def test_restart_message_names_lost_nodes_and_the_resume_step():
    message = restart_message({"attempt": 0, "num_workers": 4, "start_global_step": 0},
                              {"attempt": 1, "num_workers": 3, "start_global_step": 1200},
                              {"node-aaaaaaaa", "node-bbbbbbbb"}, {"node-aaaaaaaa"})
    assert message == ("node node-bbb lost; continuing with 3 workers from step 1200 "
                       "(was 4; same global batch, plan recomputed)")


def test_the_wait_before_the_first_step_says_what_it_waits_for():
    """The workers' start until every worker of the newest attempt registered (a worker of
    the attempt before does not count), then the loop's own start up to its first step."""
    attempts = [{"attempt": 0}, {"attempt": 1}]
    assert attempt_nodes([], {}) is None and attempt_nodes(attempts, {}) is None
    assert attempt_nodes(attempts, {0: {"attempt": 1, "node_id": "a"}, 1: {"attempt": 0, "node_id": "b"}}) is None
    assert attempt_nodes(attempts, {0: {"attempt": 1, "node_id": "a"}, 1: {"attempt": 1, "node_id": "b"}}) \
        == (1, {"a", "b"})
    assert waiting_line(False, 12) == "[hetero_ray] waiting for the workers to start (12s)…"
    assert waiting_line(True, 75) == "[hetero_ray] waiting for the first step (1m15s)…"


def test_a_cluster_without_a_dashboard_is_said_with_what_it_costs_and_the_fix():
    assert dashboard_note(Connection("127.0.0.1:6379", False, "http://127.0.0.1:8265")) is None
    note = dashboard_note(Connection("127.0.0.1:6379", False, None))
    assert "runs no dashboard" in note and "waits 12 s" in note and "--include-dashboard=true" in note
    assert dashboard_note(Connection("ray://10.0.0.5:10001", False, None, via_client=True)) is None


def test_the_built_in_jobs_worker_devices_place_each_worker_by_its_label(monkeypatch, tmp_path):
    """`hetero-ray train --worker-devices gpu,cpu` builds the TorchTrainer HeteroTrainer runs
    with one label selector per worker, in the workers' settings as mixed devices (built as
    the driver builds it, not run: that placement on labelled nodes trains is
    tests/test_mixed_devices.py's fit through the API, which the built-in job goes through)."""
    trainer, worker_settings = built_in_job_trainer(monkeypatch, tmp_path, "mixed", "--num-workers", "2",
                                                    "--worker-devices", "gpu,cpu")
    assert worker_settings["device_mode"] == "mixed"
    assert trainer.scaling_config.label_selector == [{DEVICE_LABEL: "gpu"}, {DEVICE_LABEL: "cpu"}]
    assert not trainer.scaling_config.use_gpu  # Ray reserves GPUs only when every worker has one
