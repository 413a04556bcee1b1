"""Capability records: JSON round trip, and what the planner makes of them (each rank's line
and memory cap, :mod:`hetero_ray.planning.capacity`)."""

from __future__ import annotations

import json

import pytest

from hetero_ray.planning.capacity import RankCapacity, core_capacities, rank_capacities, rank_memory_caps
from hetero_ray.planning.policies import make_policy
from hetero_ray.profiling.capability import (
    DeviceCapability, NodeCapability, capabilities_document, nodes_from_document, read_nodes_json, write_nodes_json,
)
from tests.helpers import cpu_device, gpu_device, node


def test_round_trip_through_json_keeps_everything():
    original = node("n1", [cpu_device(), gpu_device(0), gpu_device(1, beta=0.0002)],
                    stage_times_s={"cpu micro-benchmarks": 2.1})
    text = json.dumps(original.to_dict(), allow_nan=False)
    restored = NodeCapability.from_dict(json.loads(text))
    assert restored == original


def test_nan_and_numpy_values_become_json_safe():
    np = pytest.importorskip("numpy")
    device = cpu_device()
    device.fit_r2 = float("nan")
    device.matmul_tflops_fp32 = np.float64(0.2)
    d = node("n1", [device]).to_dict()
    json.dumps(d, allow_nan=False)  # would raise on NaN
    assert d["devices"][0]["fit_r2"] is None
    assert type(d["devices"][0]["matmul_tflops_fp32"]) is float


def test_document_shape_and_file_round_trip(tmp_path):
    nodes = [node("n1", [cpu_device()]), NodeCapability.failed("n2", "NVMLError_GpuIsLost", ip="10.0.0.2")]
    document = capabilities_document(nodes, "simple_cnn", [8, 16, 32, 64])
    assert set(document) == {"nodes", "model", "batch_sizes"}
    for entry in document["nodes"]:
        assert {"node_id", "ip", "hostname", "resources", "labels", "status", "error", "cpu", "devices",
                "profile_time_s"} <= set(entry)
    device = document["nodes"][0]["devices"][0]
    assert {"kind", "name", "index", "matmul_tflops_fp32", "matmul_tflops_bf16", "memory_bandwidth_gbps",
            "h2d_gbps", "memory_total_bytes", "sm_count", "compute_capability", "driver_version", "cuda_version",
            "power_limit_w", "pcie_gen", "pcie_width", "alpha_s", "beta_s_per_sample", "fit_r2",
            "max_batch_size", "probe"} <= set(device)
    assert document["nodes"][1]["status"] == "failed" and document["nodes"][1]["error"] == "NVMLError_GpuIsLost"
    path = tmp_path / "nodes.json"
    write_nodes_json(str(path), nodes, "simple_cnn", [8, 16, 32, 64])
    assert read_nodes_json(str(path)) == nodes
    assert nodes_from_document(json.loads(path.read_text())) == nodes
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def test_invalid_kind_and_status_are_rejected():
    with pytest.raises(ValueError, match="kind"):
        DeviceCapability(kind="tpu", name="x")
    with pytest.raises(ValueError, match="status"):
        NodeCapability(node_id="n", status="maybe")


def dicts(*nodes: NodeCapability) -> list[dict]:
    """As the planner holds them: the node dicts of ``nodes.json``."""
    return [n.to_dict() for n in nodes]


def test_cpu_ranks_get_their_nodes_cpu_probe_and_share_its_ram_cap():
    nodes = dicts(node("fast", [cpu_device(beta=0.001, cap=3000)]), node("slow", [cpu_device(beta=0.003, cap=1000)]))
    caps = rank_capacities(nodes, ["fast", "fast", "slow"])
    assert [c.beta_s_per_sample for c in caps] == [0.001, 0.001, 0.003]
    assert [c.max_batch_size for c in caps] == [1500, 1500, 1000]  # two ranks share "fast"'s RAM
    assert rank_memory_caps(nodes, ["fast", "fast", "slow"]) == [1500, 1500, 1000]


def test_gpu_ranks_take_the_nodes_gpus_in_index_order():
    gpus = dicts(node("g", [cpu_device(), gpu_device(1, beta=0.0002), gpu_device(0, beta=0.0001)]))
    caps = rank_capacities(gpus, ["g", "g", "g"], ["gpu", "gpu", "cpu"])
    assert [c.beta_s_per_sample for c in caps] == [0.0001, 0.0002, 0.001]
    assert caps[0].max_batch_size == 2048  # GPU memory is per device: not divided
    assert caps[2].max_batch_size == 4000  # the node's only CPU rank: all of its RAM
    # A third GPU rank on a node with two GPUs has nothing to measure by.
    assert rank_capacities(gpus, ["g", "g", "g"], ["gpu", "gpu", "gpu"])[2] is None
    # Without kinds, a node with a probed GPU means GPU ranks.
    assert rank_capacities(gpus, ["g"])[0].beta_s_per_sample == 0.0001
    assert rank_memory_caps(gpus, ["g", "g"]) == [2048, 2048]


def test_failed_unknown_or_unprobed_nodes_give_none():
    failed = node("f", [cpu_device()], status="failed", error="timed out")
    unprobed = node("u", [DeviceCapability(kind="cpu", name="x", matmul_tflops_fp32=0.1)])
    caps = rank_capacities(dicts(failed, unprobed, node("ok", [cpu_device()])), ["f", "u", "missing", "ok"])
    assert caps[:3] == [None, None, None]
    assert isinstance(caps[3], RankCapacity)


def test_memory_caps_need_no_probe_and_skip_what_is_not_a_profile():
    nodes = [
        {"node_id": "a", "status": "ok", "devices": [{"kind": "gpu", "index": 0, "max_batch_size": 512},
                                                    {"kind": "cpu", "index": 0, "max_batch_size": 96}]},
        {"node_id": "b", "status": "failed", "devices": [{"kind": "cpu", "max_batch_size": 64}]},
        {"node_id": "c", "status": "ok", "devices": [{"kind": "cpu", "max_batch_size": None}]},
        "not a node",
    ]
    # "a"'s GPU was not probed: its ranks are CPU ranks, sharing its RAM.
    assert rank_memory_caps(nodes, ["a", "a", "b", "c", "d"]) == [48, 48, None, None, None]
    assert rank_memory_caps(None, ["a"]) == [None]
    with pytest.raises(ValueError, match="device kind"):
        rank_memory_caps(nodes, ["a"], ["tpu"])


def test_a_node_a_third_as_fast_gets_about_a_quarter_of_the_batch():
    """End to end: profiled capability → the first plan of a policy that follows it."""
    nodes = dicts(node("fast", [cpu_device(alpha=0.0, beta=0.001)]), node("slow", [cpu_device(alpha=0.0, beta=0.003)]))
    for name in ("proportional", "dynamic", "optimal"):
        plan = make_policy(name).initial_plan(64, 2, rank_capacities(nodes, ["fast", "slow"]))
        assert plan.local_batch_sizes == (48, 16), name


def test_caps_bound_the_first_plan():
    nodes = dicts(node("fast", [cpu_device(alpha=0.0, beta=0.001, cap=40)]), node("slow", [cpu_device(beta=0.003)]))
    capacities = rank_capacities(nodes, ["fast", "slow"])
    policy = make_policy("proportional", caps=[c.max_batch_size for c in capacities])
    sizes = policy.initial_plan(64, 2, capacities).local_batch_sizes
    assert sizes[0] == 40 and sum(sizes) == 64


def test_the_ranks_of_a_capped_node_share_its_quota():
    """A rank's cores are its threads, but a node's ranks share its cgroup quota."""
    cpus = [{"threads": 1, "quota_cores": None}, {"threads": 1, "quota_cores": 0.5},
            {"threads": 1, "quota_cores": 0.5}, {"threads": 2, "quota_cores": 4.0}]
    lines = core_capacities(["free", "capped", "capped", "roomy"], ["cpu"] * 4, cpus)
    assert [round(1 / c.beta_s_per_sample, 3) for c in lines] == [1.0, 0.25, 0.25, 2.0]
    assert all(c.alpha_s == 0 and c.max_batch_size is None for c in lines)
    plan = make_policy("optimal").initial_plan(70, 4, lines)
    assert plan.local_batch_sizes == (20, 5, 5, 40)  # by cores: 1 : 0.25 : 0.25 : 2


def test_no_core_lines_for_a_gpu_rank_or_unknown_cores():
    free = {"threads": 1, "quota_cores": None}
    assert core_capacities(["a", "b"], ["cpu", "gpu"], [free, free]) is None
    assert core_capacities(["a", "b"], ["cpu", "cpu"], [free, {"threads": None}]) is None
    with pytest.raises(ValueError, match="2 device kinds and 1 CPU counts for 2 ranks"):
        core_capacities(["a", "b"], ["cpu", "cpu"], [free])
