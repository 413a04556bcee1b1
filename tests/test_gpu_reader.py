"""The GPU interface: the fake's paths (inventory, sampling, errors), no GPU, and real NVML
whenever this machine has a GPU."""

from __future__ import annotations

import pytest

from hetero_ray.builtin.recipe import builtin_recipe
from hetero_ray.profiling import inventory
from hetero_ray.profiling.gpu import (
    INVENTORY_FIELDS, SAMPLE_FIELDS, GpuReader, NoGpuReader, NvmlGpuReader, gpu_reader,
)
from hetero_ray.profiling.node_profiler import NodeProfiler
from hetero_ray.profiling.profile_config import ProfileConfig
from tests.fakes import FakeGpuReader

GIB = 1024**3


def _has_real_gpu() -> bool:
    return NvmlGpuReader().device_count() > 0


def test_fake_inventory_has_every_documented_field_with_a100_values():
    reader = FakeGpuReader(count=2)
    assert isinstance(reader, GpuReader)
    assert reader.device_count() == 2 and reader.unavailable_reason is None
    facts = reader.inventory(1)
    assert set(INVENTORY_FIELDS) <= set(facts)
    assert facts["name"] == "NVIDIA A100-SXM4-40GB"
    assert facts["memory_total_bytes"] == 40 * GIB and facts["sm_count"] == 108
    assert facts["compute_capability"] == "8.0" and facts["pcie_gen"] == 4 and facts["pcie_width"] == 16
    assert reader.inventory(0)["uuid"] != facts["uuid"]


def test_fake_samples_are_plausible_and_move():
    reader = FakeGpuReader()
    samples = [reader.sample(0) for _ in range(10)]
    for s in samples:
        assert set(s) == set(SAMPLE_FIELDS)
        assert 0 <= s["gpu_util"] <= 100
        assert 0 < s["gpu_mem_used_bytes"] <= s["gpu_mem_total_bytes"] == 40 * GIB
        assert 30 < s["gpu_temp_c"] < 90 and 50 < s["gpu_power_w"] <= 400
    assert len({s["gpu_util"] for s in samples}) > 1
    assert reader.samples_taken == 10


def test_fake_overrides_errors_and_index_mapping():
    reader = FakeGpuReader(inventory={"name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GIB},
                           sample={"gpu_util": 12.0}, torch_to_reader={0: 3})
    assert reader.inventory(0)["name"] == "NVIDIA H100 80GB HBM3"
    assert reader.sample(0)["gpu_mem_total_bytes"] == 80 * GIB
    assert reader.sample(0)["gpu_util"] < 20
    assert reader.index_for_torch_device(0) == 3 and reader.index_for_torch_device(1) == 1
    with pytest.raises(IndexError):
        reader.sample(1)
    broken = FakeGpuReader(fail_with=RuntimeError("NVMLError_GpuIsLost: GPU is lost"))
    with pytest.raises(RuntimeError, match="GPU is lost"):
        broken.sample(0)
    listed = inventory.gpu_inventory(broken)  # listed with its error, not dropped
    assert listed == [{"index": 0, "name": "GPU 0", "error": "RuntimeError: NVMLError_GpuIsLost: GPU is lost"}]


def test_no_gpu_reader_has_nothing_and_says_why():
    reader = NoGpuReader("NVML unavailable: no driver")
    assert isinstance(reader, GpuReader)
    assert reader.device_count() == 0
    assert inventory.gpu_inventory(reader) == []
    with pytest.raises(IndexError, match="no driver"):
        reader.sample(0)
    with pytest.raises(IndexError):
        reader.inventory(0)


@pytest.mark.skipif(_has_real_gpu(), reason="this machine has a GPU: the real NVML test below runs instead")
def test_nvml_without_a_gpu_reports_none_with_the_reason():
    reader = NvmlGpuReader()
    assert reader.device_count() == 0
    assert reader.unavailable_reason  # e.g. "NVML unavailable: NVMLError_LibraryNotFound: ..."
    chosen = gpu_reader()
    assert isinstance(chosen, NoGpuReader) and chosen.unavailable_reason == reader.unavailable_reason


@pytest.mark.skipif(not _has_real_gpu(), reason="no GPU on this machine (NVML finds none)")
def test_real_nvml_inventory_and_sample():
    reader = gpu_reader()
    assert isinstance(reader, NvmlGpuReader) and reader.device_count() >= 1
    facts = reader.inventory(0)
    assert facts["name"] and facts["memory_total_bytes"] > GIB
    assert "compute_capability" in facts and "driver_version" in facts
    sample = reader.sample(0)
    assert 0 <= sample["gpu_util"] <= 100
    assert 0 < sample["gpu_mem_used_bytes"] <= sample["gpu_mem_total_bytes"]
    import torch

    if torch.cuda.is_available():
        assert facts["sm_count"] == torch.cuda.get_device_properties(0).multi_processor_count
        assert 0 <= reader.index_for_torch_device(0) < reader.device_count()


def test_node_profiler_with_fake_gpus_reports_them_and_why_they_were_not_benchmarked():
    """On a machine without CUDA, a node whose NVML shows GPUs is reported failed, not invented."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the fake's GPUs would be confused with the real ones")
    node = {"node_id": "f" * 56, "ip": "10.0.0.9", "hostname": "gpu-box", "resources": {"CPU": 8.0, "GPU": 2.0},
            "labels": {}}
    capability = NodeProfiler(ProfileConfig(microbench_s=0.05), gpu_reader=FakeGpuReader(count=2), node=node).run()
    gpus = [d for d in capability.devices if d.kind == "gpu"]
    assert [g.name for g in gpus] == ["NVIDIA A100-SXM4-40GB"] * 2
    assert gpus[0].sm_count == 108 and gpus[0].memory_total_bytes == 40 * GIB
    assert all(g.matmul_tflops_fp32 is None for g in gpus)  # never measured here, so empty
    assert capability.status == "failed" and "not visible to torch" in capability.error
    cpu = capability.device("cpu")
    assert cpu.matmul_tflops_fp32 > 0  # the CPU was still measured


def test_node_profiler_fails_a_node_whose_declared_gpus_cannot_be_read():
    node = {"node_id": "e" * 56, "ip": "10.0.0.8", "resources": {"CPU": 2.0, "GPU": 1.0}}
    capability = NodeProfiler(ProfileConfig(microbench_s=0.05),
                              gpu_reader=NoGpuReader("NVML unavailable: NVMLError_DriverNotLoaded"), node=node).run()
    assert capability.status == "failed"
    assert "declares 1 GPU" in capability.error and "DriverNotLoaded" in capability.error
    assert capability.device("cpu").memory_bandwidth_gbps > 0


def test_a_cpu_only_node_on_a_gpu_machine_is_profiled_as_cpu_only():
    """`ray start --num-gpus=0` with `CUDA_VISIBLE_DEVICES=` beside a GPU node on one machine:
    NVML still lists the machine's GPU, torch sees none and Ray gives the node none. The node
    is CPU-only — not failed, and its CPU carries the model probe the planner needs (on a real
    H100 machine this node was reported failed and `hetero-ray plan` found no CPU curve)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the fake's GPUs would be confused with the real ones")
    node = {"node_id": "c" * 56, "ip": "10.0.0.7", "resources": {"CPU": 2.0}, "labels": {}}
    config = ProfileConfig(microbench_s=0.05, model=builtin_recipe("mlp"), batch_sizes=(4, 8))
    capability = NodeProfiler(config, gpu_reader=FakeGpuReader(count=1), node=node).run()
    assert capability.ok, capability.error
    assert [d.kind for d in capability.devices] == ["cpu"]
    assert capability.device("cpu").probe, "the CPU of a CPU-only node is probed with the model"
