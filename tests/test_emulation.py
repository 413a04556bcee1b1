"""Emulated device speeds: the pad stretches a rank's work, never the host's scheduling."""

from __future__ import annotations

import time

import pytest
import torch

from hetero_ray.training.timing import emulation
from tests.helpers import FakeClocks
from hetero_ray.training.timing.emulation import SpeedChange, SpeedEmulator, SpeedSchedule, cpu_work_clock, fit_to_cores


@pytest.fixture
def clocks(monkeypatch):
    fake = FakeClocks()
    monkeypatch.setattr(emulation, "time", fake)
    return fake


def started(clocks: FakeClocks, speed: float) -> SpeedEmulator:
    """An emulator on the fake clocks, at the start of a step at ``speed``."""
    emulator = SpeedEmulator(work_clock=lambda: clocks.work)
    emulator.begin_step(speed, clocks.perf_counter())
    return emulator


def test_a_rank_at_speed_v_takes_work_over_v(clocks):
    emulator = started(clocks, 0.25)
    clocks.compute(0.010)
    emulator.pad()
    assert clocks.wall - 100.0 == pytest.approx(0.040)
    assert emulator.padded_s == pytest.approx(0.030)


def test_pads_before_each_bucket_add_up_to_the_slower_device(clocks):
    emulator = started(clocks, 0.5)
    for _ in range(3):  # three buckets, 5 ms of work before each
        clocks.compute(0.005)
        emulator.pad()
    assert clocks.wall - 100.0 == pytest.approx(0.030)
    assert emulator.padded_s == pytest.approx(0.015)


def test_time_the_host_gave_to_others_is_not_multiplied(clocks):
    # 10 ms of work and 30 ms preempted: a device at speed 0.5 needs 20 ms, already past.
    # Counting wall time as work would have padded to (10 + 30) / 0.5 = 80 ms.
    emulator = started(clocks, 0.5)
    clocks.compute(0.010)
    clocks.preempted(0.030)
    emulator.pad()
    assert clocks.slept == [] and emulator.padded_s == 0.0


def test_preemption_is_absorbed_by_the_pad_when_it_fits(clocks):
    emulator = started(clocks, 0.25)
    clocks.compute(0.010)
    clocks.preempted(0.015)
    emulator.pad()
    assert clocks.wall - 100.0 == pytest.approx(0.040)  # as if never preempted


def test_full_speed_never_pads(clocks):
    emulator = started(clocks, 1.0)
    clocks.compute(0.010)
    emulator.pad()
    assert clocks.slept == []


def test_on_an_asynchronous_device_work_is_wall_time_after_draining_the_queue(clocks):
    drained = []
    emulator = SpeedEmulator(synchronize=lambda: drained.append(True), work_clock=lambda: 0.0)
    emulator.begin_step(0.5, clocks.perf_counter())
    clocks.preempted(0.010)  # the GPU worked while the host waited: all of it counts
    emulator.pad()
    assert drained and clocks.wall - 100.0 == pytest.approx(0.020)
    clocks.preempted(0.010)
    emulator.pad()  # the second bucket: work so far is wall minus what was padded
    assert clocks.wall - 100.0 == pytest.approx(0.040)


def test_the_cpu_work_clock_counts_compute_not_sleep():
    clock = cpu_work_clock()
    start = clock()
    time.sleep(0.05)
    slept = clock() - start
    assert slept < 0.01
    start = clock()
    deadline = time.monotonic() + 60  # generous: a busy machine gives this loop a small slice of a core
    while clock() - start < 0.02:  # computing moves the clock, at whatever share of a core
        assert time.monotonic() < deadline, "a minute of computing did not move the CPU work clock by 20 ms"


def test_speed_schedule_applies_changes_from_their_step():
    schedule = SpeedSchedule([1.0, 0.5], [SpeedChange(100, 1, 0.25), SpeedChange(50, 0, 0.8)])
    assert [schedule.speed(0, s) for s in (0, 49, 50)] == [1.0, 1.0, 0.8]
    assert [schedule.speed(1, s) for s in (99, 100, 500)] == [0.5, 0.25, 0.25]
    assert schedule.speed(5, 0) == 1.0  # a rank beyond the list runs at full speed


def test_speeds_that_fit_the_cores_are_kept():
    schedule = SpeedSchedule([1.0, 0.5])
    assert fit_to_cores(schedule, ["a", "a"], [2, 2]) == 1.0  # 1.5 cores asked of 0.8 · 2


def test_speeds_that_do_not_fit_are_scaled_together():
    schedule = SpeedSchedule([1.0, 1.0, 0.5, 0.25])
    scale = fit_to_cores(schedule, ["a"] * 4, [2] * 4)
    assert scale == pytest.approx(0.8 * 2 / 2.75)
    schedule.scale = scale
    assert schedule.speed(0, 0) / schedule.speed(3, 0) == pytest.approx(4.0)  # the ratios stay


def test_the_most_crowded_node_sets_the_scale_and_gpu_ranks_need_no_core():
    schedule = SpeedSchedule([1.0, 1.0, 1.0, 1.0])
    # node a: two CPU ranks on 4 cores (fits); node b: two CPU ranks on 1 core; rank 3 is a GPU
    scale = fit_to_cores(schedule, ["a", "a", "b", "b"], [4, 4, 1, None])
    assert scale == pytest.approx(0.8)  # node b: one CPU rank on 1 core, 0.8 usable


def test_a_speed_change_that_asks_for_more_is_planned_for_from_the_start():
    schedule = SpeedSchedule([0.5, 0.5], [SpeedChange(100, 1, 1.0)])
    assert fit_to_cores(schedule, ["a", "a"], [1, 1]) == pytest.approx(0.8 / 1.5)


def test_a_ranks_warm_up_measures_its_emulated_speed_and_leaves_torchs_random_state(clocks, monkeypatch):
    from hetero_ray.profiling import model_probe
    from hetero_ray.profiling.recipe import ProfileModel
    from hetero_ray.training.timing import warmup
    from hetero_ray.training.timing.warmup import measure_rank

    # The step's timer and the pad's sleep on the fake clocks too: a step of exactly 0.5 ms
    # of work a sample, however busy the machine (a real sleep overshoots under load).
    monkeypatch.setattr(model_probe, "time", clocks)
    monkeypatch.setattr(warmup, "time", clocks)

    def half_a_ms_a_sample(model, batch):
        inputs, batch_size = batch
        clocks.compute(0.0005 * batch_size)
        return model(inputs).sum()

    recipe = ProfileModel(build=lambda: torch.nn.Linear(1, 1), make_batch=lambda b: (torch.rand(b, 1), b),
                          compute_loss=half_a_ms_a_sample)
    cpu = torch.device("cpu")
    work = dict(work_clock=lambda: clocks.work)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    full = measure_rank(recipe, cpu, [8, 32], SpeedEmulator(**work), 1.0, time_budget_s=0.5)
    assert torch.equal(torch.rand(3), expected), "the warm-up moved the user's random state"
    quarter = measure_rank(recipe, cpu, [8, 32], SpeedEmulator(**work), 0.25, time_budget_s=0.5)
    assert full["beta_s_per_sample"] == pytest.approx(0.0005, rel=1e-6)
    assert quarter["beta_s_per_sample"] == pytest.approx(4 * full["beta_s_per_sample"], rel=1e-6)
    assert clocks.slept, "a quarter speed was reached without the pad"

    def broken(batch_size):
        raise ValueError("no data")

    assert measure_rank(ProfileModel(build=recipe.build, make_batch=broken), cpu, [8, 32], SpeedEmulator(**work),
                        1.0) is None


def test_the_warm_up_times_the_emulated_device_not_the_hosts_preemption(clocks, monkeypatch):
    """Another process takes the core for 4× each step's work. Timed by the wall clock, a rank
    at speed 0.5 (no pad: past its target) and one at 0.25 (its pad absorbs most of the wait)
    both measured 2.5 ms a sample, and the first plan could not tell them apart; timed as
    the emulated device spends it (SpeedEmulator.busy_s) they are 1 and 2 ms."""
    from hetero_ray.profiling import model_probe
    from hetero_ray.profiling.recipe import ProfileModel
    from hetero_ray.training.timing import warmup
    from hetero_ray.training.timing.warmup import measure_rank

    monkeypatch.setattr(model_probe, "time", clocks)
    monkeypatch.setattr(warmup, "time", clocks)

    def preempted_step(model, batch):
        inputs, batch_size = batch
        clocks.compute(0.0005 * batch_size)
        clocks.preempted(0.002 * batch_size)
        return model(inputs).sum()

    recipe = ProfileModel(build=lambda: torch.nn.Linear(1, 1), make_batch=lambda b: (torch.rand(b, 1), b),
                          compute_loss=preempted_step)
    work = dict(work_clock=lambda: clocks.work)
    half = measure_rank(recipe, torch.device("cpu"), [8, 32], SpeedEmulator(**work), 0.5, time_budget_s=0.5)
    quarter = measure_rank(recipe, torch.device("cpu"), [8, 32], SpeedEmulator(**work), 0.25, time_budget_s=0.5)
    assert half["beta_s_per_sample"] == pytest.approx(0.001, rel=1e-6)
    assert quarter["beta_s_per_sample"] == pytest.approx(0.002, rel=1e-6)


def test_busy_time_at_full_speed_is_the_work_at_most_the_wall(clocks):
    emulator = started(clocks, 1.0)
    clocks.compute(0.010)
    clocks.preempted(0.005)
    assert emulator.busy_s() == pytest.approx(0.010)
    gpu = SpeedEmulator(synchronize=lambda: None, work_clock=lambda: 0.0)
    gpu.begin_step(0.5, clocks.perf_counter())
    clocks.compute(0.004)
    gpu.pad()  # to 8 ms of wall
    assert gpu.busy_s() == pytest.approx(0.008)
