"""The model probe's arithmetic: the α/β fit from noisy timings, and the memory-cap searches.

The fit is driven through the probe's own measuring path (:func:`measure_busy_times` with
a fake step runner whose "busy time" is a known line plus noise); the GPU-style search
through a fake caching allocator that fails above its capacity and only gives memory back
when its cache is emptied, as torch's does.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hetero_ray.builtin.data import spec_for
from hetero_ray.builtin.models import build_model
from hetero_ray.builtin.recipe import builtin_recipe
from hetero_ray.profiling.model_probe import (
    CPU_FIXED_STATE_FACTOR, DEFAULT_PROBE_BATCH_SIZES, ProbeResult, StepRunner, fit_probe, measure_busy_times,
    probe_model, ram_bound_batch_size, search_max_batch_size,
)
from hetero_ray.profiling.recipe import ProfileModel


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class LineRunner:
    """A step whose busy time is ``α + β·b`` with Gaussian noise and rare slow outliers."""

    def __init__(self, alpha, beta, noise, seed, clock=None, outlier_every=0):
        self.alpha, self.beta, self.noise = alpha, beta, noise
        self.rng = np.random.default_rng(seed)
        self.clock = clock
        self.calls = 0
        self.outlier_every = outlier_every

    def busy_time_s(self, b: int) -> float:
        self.calls += 1
        t = (self.alpha + self.beta * b) * (1 + self.noise * self.rng.standard_normal())
        if self.outlier_every and self.calls % self.outlier_every == 0:
            t *= 20  # a GC pause or a preempted core
        if self.clock is not None:
            self.clock.now += t
        return t


@pytest.mark.parametrize("seed", range(20))
def test_fit_recovers_alpha_and_beta_from_noisy_timings(seed):
    rng = np.random.default_rng(1000 + seed)
    alpha, beta = rng.uniform(0.001, 0.02), rng.uniform(0.0002, 0.005)
    runner = LineRunner(alpha, beta, noise=0.03, seed=seed)
    timings = measure_busy_times(runner, DEFAULT_PROBE_BATCH_SIZES, repeats=5, min_block_s=0.0,
                                 time_budget_s=math.inf)
    fit = fit_probe(timings)
    assert fit.slope_trusted
    assert fit.beta_s_per_sample == pytest.approx(beta, rel=0.08)
    # α is the intercept: judged against the time scale of the smallest step.
    assert abs(fit.alpha_s - alpha) <= 0.1 * (alpha + beta * DEFAULT_PROBE_BATCH_SIZES[0])
    assert fit.r2 > 0.95


def test_block_means_average_out_and_outliers_are_rejected():
    runner = LineRunner(0.004, 0.001, noise=0.02, seed=7, outlier_every=13)
    timings = measure_busy_times(runner, (8, 16, 32, 64), repeats=5, min_block_s=0.0, time_budget_s=math.inf)
    fit = fit_probe(timings)
    assert fit.beta_s_per_sample == pytest.approx(0.001, rel=0.1)
    assert fit.alpha_s == pytest.approx(0.004, abs=0.002)


def test_each_timing_is_the_mean_of_a_block_lasting_min_block_s():
    clock = FakeClock()
    runner = LineRunner(0.0, 0.001, noise=0.0, seed=0, clock=clock)
    timings = measure_busy_times(runner, (8, 64), repeats=2, min_block_s=0.3, time_budget_s=math.inf, clock=clock)
    assert [b for b, _ in timings] == [8, 64, 8, 64]
    assert timings[0][1] == pytest.approx(0.008)
    # warm-up 2 steps per size, then per round ⌈0.3/0.008⌉ = 38 and ⌈0.3/0.064⌉ = 5 steps
    assert runner.calls == 2 * 2 + 2 * (38 + 5)


class FirstStepSlowRunner(LineRunner):
    """The process's first step pays one-off costs (a GPU's library handles, kernel choice)."""

    def busy_time_s(self, b: int) -> float:
        t = super().busy_time_s(b)
        if self.calls == 1:
            self.clock.now += 0.5
            t += 0.5
        return t


def test_a_slow_first_step_does_not_shorten_the_first_sizes_block():
    clock = FakeClock()
    runner = FirstStepSlowRunner(0.0, 0.001, noise=0.0, seed=0, clock=clock)
    timings = measure_busy_times(runner, (8, 64), repeats=1, min_block_s=0.3, time_budget_s=math.inf, clock=clock)
    # sized from the one-off step, batch 8's block would be a single step (⌈0.3/0.508⌉)
    assert runner.calls == 2 * 2 + 38 + 5
    assert timings[0] == (8, pytest.approx(0.008))


def test_a_slow_device_drops_the_large_sizes_to_stay_in_budget():
    clock = FakeClock()
    runner = LineRunner(0.0, 0.05, noise=0.0, seed=0, clock=clock)  # 50 ms/sample: a heavy model on one core
    timings = measure_busy_times(runner, (8, 16, 32, 64), repeats=3, min_block_s=0.0, time_budget_s=5.0, clock=clock)
    sizes = sorted({b for b, _ in timings})
    assert sizes == [8, 16]  # the two smallest are always kept; 32 would overrun
    assert clock.now < 5.0 + 2 * 16 * 0.05 + 1e-9  # at most one round past the budget


def test_probe_result_rows_are_medians_per_size():
    result = ProbeResult("m", "cpu", [(8, 1.0), (8, 3.0), (8, 2.0), (16, 4.0)], fit_probe([(8, 1.0), (16, 2.0)]),
                         None, None)
    assert result.probe_rows() == [{"batch_size": 8, "busy_time_s": 2.0}, {"batch_size": 16, "busy_time_s": 4.0}]


# --- memory-cap search, GPU style


class FakeOutOfMemory(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError."""


class FakeCachingAllocator:
    """Device memory of ``capacity`` bytes: a step at batch b needs ``fixed + b·per_sample``.

    Like torch's caching allocator, freed blocks stay reserved until ``empty_cache``: a
    failed large step leaves its partial allocation cached, so a later, smaller step only
    fits once the cache was emptied.
    """

    def __init__(self, capacity, per_sample, fixed=0):
        self.capacity, self.per_sample, self.fixed = capacity, per_sample, fixed
        self.cached = 0
        self.runs: list[int] = []
        self.empty_cache_calls = 0

    def run(self, b: int) -> None:
        self.runs.append(b)
        need = self.fixed + b * self.per_sample
        if need + self.cached > self.capacity:
            self.cached = self.capacity - self.fixed  # what it got before failing stays cached
            raise FakeOutOfMemory(f"CUDA out of memory. Tried to allocate {need} bytes")
        self.cached = 0

    def empty_cache(self) -> None:
        self.empty_cache_calls += 1
        self.cached = 0

    def largest_fitting(self) -> int:
        return (self.capacity - self.fixed) // self.per_sample


@pytest.mark.parametrize("seed", range(25))
def test_gpu_search_finds_the_largest_batch_that_fits(seed):
    rng = np.random.default_rng(seed)
    allocator = FakeCachingAllocator(capacity=int(rng.integers(10**6, 10**9)), per_sample=int(rng.integers(1000, 10**6)),
                                     fixed=int(rng.integers(0, 10**5)))
    expected = min(allocator.largest_fitting(), 65536)
    known_good = min(64, expected)
    result = search_max_batch_size(allocator.run, known_good=known_good, oom_errors=(FakeOutOfMemory,),
                                   on_oom=allocator.empty_cache)
    assert result.max_batch_size == expected
    assert result.exhaustive
    assert allocator.empty_cache_calls == sum(1 for b in allocator.runs if b > expected)
    assert result.tries <= 2 * math.ceil(math.log2(65536)) + 2


def test_gpu_search_needs_the_cache_emptied_after_each_failure():
    allocator = FakeCachingAllocator(capacity=1000, per_sample=10)
    without = search_max_batch_size(allocator.run, oom_errors=(FakeOutOfMemory,))
    assert without.max_batch_size < 100  # the cached block poisons every later try
    allocator = FakeCachingAllocator(capacity=1000, per_sample=10)
    assert search_max_batch_size(allocator.run, oom_errors=(FakeOutOfMemory,),
                                 on_oom=allocator.empty_cache).max_batch_size == 100


def test_gpu_search_edges():
    nothing = FakeCachingAllocator(capacity=5, per_sample=10)
    assert search_max_batch_size(nothing.run, oom_errors=(FakeOutOfMemory,), on_oom=nothing.empty_cache).max_batch_size == 0
    everything = FakeCachingAllocator(capacity=10**12, per_sample=1)
    result = search_max_batch_size(everything.run, oom_errors=(FakeOutOfMemory,), limit=1000)
    assert (result.max_batch_size, result.exhaustive) == (1000, True)
    with pytest.raises(ValueError, match="start"):
        search_max_batch_size(everything.run, start=0)


def test_gpu_search_lets_other_errors_through():
    def broken(b):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        search_max_batch_size(broken, oom_errors=(FakeOutOfMemory,))


def test_gpu_search_stops_at_its_time_budget_with_a_lower_bound():
    clock = FakeClock()
    allocator = FakeCachingAllocator(capacity=10**9, per_sample=1000)

    def slow_run(b):
        clock.now += 1.0
        allocator.run(b)

    result = search_max_batch_size(slow_run, known_good=64, oom_errors=(FakeOutOfMemory,),
                                   on_oom=allocator.empty_cache, time_budget_s=3.0, clock=clock)
    assert not result.exhaustive
    assert result.max_batch_size == 512  # 128, 256, 512 ran; then the budget was spent
    assert result.max_batch_size <= allocator.largest_fitting()


# --- memory cap, CPU style: a fraction of the available RAM


def test_ram_bound_is_the_fraction_of_available_ram_over_the_per_sample_bytes():
    gib = 1024**3
    assert ram_bound_batch_size(per_sample_bytes=1024**2, fixed_bytes=gib, available_bytes=16 * gib,
                                ram_fraction=0.5) == 7 * 1024
    assert ram_bound_batch_size(1024**2, gib, 16 * gib, ram_fraction=0.25) == 3 * 1024
    assert ram_bound_batch_size(1024**2, 10 * gib, 16 * gib, 0.5) == 0  # the model state alone is too big
    assert ram_bound_batch_size(1, 0, 10**12, 1.0) == 65536  # never beyond the search limit
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="ram_fraction"):
            ram_bound_batch_size(1024, 0, gib, bad)
    with pytest.raises(ValueError, match="per_sample_bytes"):
        ram_bound_batch_size(0, 0, gib)


def test_ram_fraction_cap_of_a_real_model_matches_a_fake_allocator_of_that_size():
    """The CPU probe's cap, given a RAM size, is what an allocator of ram_fraction·RAM admits."""
    gib = 1024**3
    small = probe_model(builtin_recipe("mlp"), "cpu", batch_sizes=(8, 16), repeats=1, num_threads=1, ram_fraction=0.5,
                        available_ram_bytes=gib, time_budget_s=1.0)
    assert small.max_batch_size_method == "ram-fraction"
    assert small.per_sample_bytes > 3 * 32 * 32 * 4  # at least the input image itself
    parameter_bytes = sum(p.numel() * p.element_size() for p in build_model("mlp", spec_for("mlp")).parameters())
    allocator = FakeCachingAllocator(capacity=gib // 2, per_sample=math.ceil(small.per_sample_bytes),
                                     fixed=CPU_FIXED_STATE_FACTOR * parameter_bytes)
    searched = search_max_batch_size(allocator.run, oom_errors=(FakeOutOfMemory,), on_oom=allocator.empty_cache)
    assert abs(searched.max_batch_size - small.max_batch_size) <= 1
    large = probe_model(builtin_recipe("mlp"), "cpu", batch_sizes=(8, 16), repeats=1, num_threads=1, ram_fraction=0.5,
                        available_ram_bytes=2 * gib, time_budget_s=1.0)
    assert large.max_batch_size == pytest.approx(2 * small.max_batch_size, rel=0.05)


def test_real_probe_on_cpu_gives_a_positive_curve():
    result = probe_model(builtin_recipe("simple_cnn"), "cpu", batch_sizes=(4, 16), repeats=2, num_threads=1, time_budget_s=3.0)
    assert result.fit.predict_s(1) > 0 and result.fit.beta_s_per_sample >= 0
    sizes = [row["batch_size"] for row in result.probe_rows()]
    # the given sizes, then doublings while the step stayed flat
    assert sizes[:2] == [4, 16] and all(b == 2 * a for a, b in zip(sizes[1:], sizes[2:]))
    assert result.fit.batch_sizes == tuple(sizes) and len(result.fit.rel_errors) == len(sizes)
    assert result.max_batch_size and result.max_batch_size > 16


def test_a_block_reuses_one_host_batch_per_size():
    """Making data is not the step: a block's steps reuse the size's batch, so the probe's
    budget goes on steps (a GPU's large sizes took longer to make than to train)."""
    made = []
    recipe = builtin_recipe("mlp")

    def make_batch(b):
        made.append(b)
        return recipe.make_batch(b)

    counting = ProfileModel(build=recipe.build, make_batch=make_batch, compute_loss=recipe.compute_loss, name="mlp")
    runner = StepRunner(counting.build(), counting, torch.device("cpu"))
    timings = measure_busy_times(runner, (8, 16), repeats=2, min_block_s=0.05, time_budget_s=math.inf)
    assert len(timings) == 4 and all(t > 0 for _, t in timings)
    # once per size while warming up, once per size in each of the two rounds
    assert made == [8, 16, 8, 16, 8, 16]


# --- doubling beyond the given sizes while the step is flat


class FloorRunner(LineRunner):
    """A big GPU: ``max(τ, α + β·b)`` — flat up to a knee, a line beyond; out of memory above ``capacity``."""

    def __init__(self, floor, alpha, beta, noise=0.0, seed=0, clock=None, capacity=None):
        super().__init__(alpha, beta, noise, seed, clock)
        self.floor, self.capacity = floor, capacity

    def busy_time_s(self, b: int) -> float:
        if self.capacity is not None and b > self.capacity:
            raise FakeOutOfMemory(f"{b} samples do not fit")
        self.calls += 1
        t = max(self.floor, self.alpha + self.beta * b) * (1 + self.noise * self.rng.standard_normal())
        if self.clock is not None:
            self.clock.now += t
        return t


def test_a_flat_device_is_probed_by_doubling_until_two_doublings_grew():
    floor, knee = 0.007, 700
    beta = floor / knee
    runner = FloorRunner(floor, 0.0, beta, noise=0.02, seed=1)
    timings = measure_busy_times(runner, (8, 16, 32, 64), repeats=3, min_block_s=0.0, time_budget_s=math.inf,
                                 extend=True)
    sizes = sorted({b for b, _ in timings})
    assert sizes == [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]  # 1024→2048→4096 grew ~2× each
    fit = fit_probe(timings)
    assert fit.shape == "floor+line" and fit.max_rel_error < 0.10
    assert fit.knee_batch_size == pytest.approx(knee, rel=0.15)
    # the fixed sizes alone could only see the floor
    fixed = fit_probe(measure_busy_times(FloorRunner(floor, 0.0, beta, noise=0.02, seed=1), (8, 16, 32, 64),
                                         repeats=3, min_block_s=0.0, time_budget_s=math.inf))
    assert fixed.shape == "flat"


def test_a_line_is_not_extended():
    runner = LineRunner(0.001, 0.001, noise=0.0, seed=0)
    timings = measure_busy_times(runner, (8, 16, 32, 64), repeats=1, min_block_s=0.0, time_budget_s=math.inf,
                                 extend=True)
    assert sorted({b for b, _ in timings}) == [8, 16, 32, 64]


def test_doubling_stops_at_the_memory_cap_the_budget_or_out_of_memory():
    flat = dict(floor=0.007, alpha=0.0, beta=1e-9)
    capped = measure_busy_times(FloorRunner(**flat), (8, 16), repeats=1, min_block_s=0.0, time_budget_s=math.inf,
                                extend=True, max_batch_size=100)
    assert sorted({b for b, _ in capped}) == [8, 16, 32, 64]
    ooms = []
    runner = FloorRunner(**flat, capacity=300)
    timings = measure_busy_times(runner, (8, 16), repeats=1, min_block_s=0.0, time_budget_s=math.inf,
                                 extend=True, oom_errors=(FakeOutOfMemory,), on_oom=lambda: ooms.append(1))
    assert sorted({b for b, _ in timings}) == [8, 16, 32, 64, 128, 256] and ooms == [1]
    clock = FakeClock()
    timings = measure_busy_times(FloorRunner(**flat, clock=clock), (8, 16), repeats=1, min_block_s=0.3,
                                 time_budget_s=2.0, extend=True, clock=clock)
    sizes = sorted({b for b, _ in timings})
    assert 2 < len(sizes) < 8  # a round of every size costs ≥ 0.3 s each: the budget holds a few
    assert clock.now <= 2.0 + 1e-9
