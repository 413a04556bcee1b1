"""The in-training resource sampler: what it fills, when it reads, and that it never blocks."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from hetero_ray.profiling.gpu import SAMPLE_FIELDS, NoGpuReader
from hetero_ray.runs.records import STEPS, to_table
from hetero_ray.training.timing.resource_sampler import ResourceSampler
from tests.fakes import FakeGpuReader

GPU_COLUMNS = ("gpu_util", "gpu_mem_used_bytes", "gpu_mem_peak_bytes", "gpu_mem_total_bytes", "gpu_temp_c",
               "gpu_power_w")


def wait_for(predicate, timeout_s=60.0):  # generous: the reader thread may wait for a core on a busy machine
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def busy_cpu(cpu_s: float) -> None:
    """Computes until this process has used ``cpu_s`` more CPU time (well above the clock
    tick that process CPU times are counted in)."""
    start = time.process_time()
    while time.process_time() - start < cpu_s:
        torch.randn(200, 200) @ torch.randn(200, 200)


def test_cpu_rank_fills_process_fields_and_leaves_gpu_fields_out():
    with ResourceSampler(torch.device("cpu"), gpu_reader=FakeGpuReader(), interval_steps=5) as sampler:
        sampler.maybe_sample(0)
        assert wait_for(lambda: sampler.samples_taken >= 1)
        busy_cpu(0.05)  # between the readings: the second one must see it
        sampler.maybe_sample(5)
        assert wait_for(lambda: sampler.samples_taken >= 2)
        readings = sampler.maybe_sample(6)
    # (cpu_quota_cores only where this process runs under a cgroup CPU quota)
    assert set(readings) - {"cpu_quota_cores"} == {"cpu_util", "rss_bytes", "cpu_util_from_step"}
    assert readings["cpu_util_from_step"] == 0, "the second reading covers the steps from the first one's on"
    assert readings["rss_bytes"] > 10 * 1024**2
    assert readings["cpu_util"] > 0
    # In the steps table the GPU columns are null, not zero.
    row = {"global_step": 6, "rank": 0, **readings}
    table = to_table(STEPS, [row]).to_pylist()[0]
    assert all(table[c] is None for c in GPU_COLUMNS)
    assert table["rss_bytes"] == readings["rss_bytes"]


def test_gpu_rank_takes_nvml_readings_from_the_reader():
    reader = FakeGpuReader(torch_to_reader={0: 2}, count=4)
    sampler = ResourceSampler(torch.device("cuda", 0), gpu_reader=reader, interval_steps=10)
    try:
        readings = sampler.sample_now()
    finally:
        sampler.close()
    assert set(SAMPLE_FIELDS) <= set(readings)
    assert readings["gpu_mem_total_bytes"] == 40 * 1024**3 and 0 <= readings["gpu_util"] <= 100
    if not torch.cuda.is_available():
        # torch cannot report a peak for a device it does not have: left out, not made up.
        assert "gpu_mem_peak_bytes" not in readings
    else:
        assert readings["gpu_mem_peak_bytes"] >= 0


def test_gpu_rank_without_readable_gpus_fills_only_process_fields():
    sampler = ResourceSampler(torch.device("cuda", 0), gpu_reader=NoGpuReader("NVML unavailable"), interval_steps=1)
    try:
        readings = sampler.sample_now()
    finally:
        sampler.close()
    assert not set(SAMPLE_FIELDS) & set(readings)
    assert {"cpu_util", "rss_bytes"} <= set(readings)


def test_reads_once_per_interval():
    reader = FakeGpuReader()
    sampler = ResourceSampler(torch.device("cpu"), gpu_reader=reader, interval_steps=10)
    try:
        for step in range(35):
            sampler.maybe_sample(step)
            time.sleep(0.002)
        assert wait_for(lambda: sampler.samples_taken == 4)  # steps 0, 10, 20, 30
        time.sleep(0.1)
        assert sampler.samples_taken == 4
        sampler.maybe_sample(0)  # a restart from an earlier step reads again
        assert wait_for(lambda: sampler.samples_taken == 5)
    finally:
        sampler.close()


class StuckReader(FakeGpuReader):
    """NVML stuck (a GPU being reset) until ``release`` is set, or for a minute at most."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def sample(self, index):
        self.entered.set()
        if not self.release.wait(60):
            self.release.set()  # one stuck reading is the test; the later ones need not wait
        return super().sample(index)


def test_a_slow_reading_never_blocks_the_step():
    reader = StuckReader()
    sampler = ResourceSampler(torch.device("cuda", 0), gpu_reader=reader, interval_steps=1)
    try:
        sampler.maybe_sample(0)
        assert reader.entered.wait(60), "the reader thread never started a reading"
        for step in range(1, 50):  # 49 more "steps" while that reading is stuck
            sampler.maybe_sample(step)
        assert sampler.samples_taken == 0, "a step waited for the stuck reading"
    finally:
        reader.release.set()
        sampler.close()


def test_interval_zero_disables_everything():
    before = threading.active_count()
    sampler = ResourceSampler(torch.device("cpu"), gpu_reader=FakeGpuReader(), interval_steps=0)
    assert threading.active_count() == before
    assert sampler.maybe_sample(0) == {} and sampler.sample_now() == {}
    sampler.close()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_invalid_interval_is_rejected(bad):
    with pytest.raises(ValueError, match="profile-interval"):
        ResourceSampler(torch.device("cpu"), interval_steps=bad)


def test_close_stops_the_thread():
    sampler = ResourceSampler(torch.device("cpu"), interval_steps=1)
    thread = sampler._thread
    assert thread.is_alive() and thread.daemon
    sampler.close()
    assert not thread.is_alive()


# --- the per-rank gauges the loop feeds with the same rows


class FakeGauge:
    def __init__(self, name, description, tag_keys):
        self.name, self.tag_keys = name, tag_keys
        self.values: list[tuple[float, dict]] = []

    def set(self, value, tags=None):
        assert set(tags) == set(self.tag_keys)
        self.values.append((value, tags))


def make_gauges(clock):
    from hetero_ray.metrics.gauges import RankGauges

    made = {}

    def factory(name, description, tag_keys):
        made[name] = FakeGauge(name, description, tag_keys)
        return made[name]

    return RankGauges("exp", min_interval_s=1.0, gauge_factory=factory, clock=clock), made


def test_gauges_export_the_ranks_figures_tagged_by_experiment_and_rank():
    now = [0.0]
    gauges, made = make_gauges(lambda: now[0])
    assert set(made) == {"hetero_ray_samples_per_s", "hetero_ray_busy_time_s", "hetero_ray_local_batch_size",
                         "hetero_ray_gpu_util"}
    assert gauges.update({"rank": 2, "node_id": "abc", "local_batch_size": 24, "busy_time_s": 0.06, "gpu_util": 80.0})
    assert made["hetero_ray_samples_per_s"].values == [(pytest.approx(400.0), {"experiment": "exp", "rank": "2",
                                                                                 "node_id": "abc"})]
    assert made["hetero_ray_local_batch_size"].values[0][0] == 24
    assert made["hetero_ray_gpu_util"].values[0][0] == 80.0


def test_gauges_are_rate_limited_and_skip_missing_readings():
    now = [0.0]
    gauges, made = make_gauges(lambda: now[0])
    row = {"rank": 0, "local_batch_size": 32, "busy_time_s": 0.05, "gpu_util": float("nan")}
    assert gauges.update(row)
    now[0] = 0.5
    assert not gauges.update(row)  # within the interval: one time check, nothing exported
    now[0] = 1.2
    assert gauges.update(row)
    assert len(made["hetero_ray_busy_time_s"].values) == 2
    assert made["hetero_ray_gpu_util"].values == []  # no GPU reading: no point, not a zero
    assert gauges.update({"rank": 0, "local_batch_size": 32, "busy_time_s": 0.0}, force=True)
    assert len(made["hetero_ray_samples_per_s"].values) == 2  # no throughput from a zero busy time


def test_a_reading_says_from_which_step_it_covers_and_the_quota_it_ran_under(monkeypatch):
    import hetero_ray.training.timing.resource_sampler as resource_sampler

    monkeypatch.setattr(resource_sampler, "cpu_quota_cores", lambda: 0.5)  # the cgroup files: tests/test_cgroup.py
    with ResourceSampler(torch.device("cpu"), interval_steps=10) as sampler:
        sampler.maybe_sample(40)  # a restarted run: its first reading covers steps of unknown origin
        assert wait_for(lambda: sampler.samples_taken >= 1)
        first = sampler.maybe_sample(41)
        sampler.maybe_sample(50)
        assert wait_for(lambda: sampler.samples_taken >= 2)
        second = sampler.maybe_sample(51)
        sampler.maybe_sample(20)  # back in steps (another restart): the chain starts again
        assert wait_for(lambda: sampler.samples_taken >= 3)
        third = sampler.maybe_sample(21)
    assert "cpu_util_from_step" not in first and first["cpu_quota_cores"] == 0.5
    assert second["cpu_util_from_step"] == 40
    assert "cpu_util_from_step" not in third
