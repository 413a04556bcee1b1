"""The model-specific probe: the real model's busy time at several batch sizes, the fitted
cost curve, and the largest batch that fits in memory, on one device.

Each timing is the mean of a block of back-to-back steps (copy the batch to the device,
forward, loss, backward) lasting at least :data:`MIN_BLOCK_S` (:data:`GPU_MIN_BLOCK_S` on a
GPU), the sizes visited round-robin; beyond the given sizes it doubles until two doublings
each grew the busy time by more than :data:`PROBE_GROWTH_STOP`. The curve
``t(b) = max(τ, α + β·b)`` is fitted by :func:`hetero_ray.planning.cost_model.fit_curve`,
the balancer's fit. The largest batch: on a GPU, doubling then bisection with out-of-memory
errors caught; on a CPU, computed as
``b_max = (ram_fraction·available_RAM − fixed) / per_sample`` (:func:`ram_bound_batch_size`).
:func:`search_max_batch_size` takes the "run one step at batch b" callable, so tests drive
it with a fake allocator. Why each choice: docs/profiling-and-planning.md#profiling-a-node
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from hetero_ray.planning.cost_model import CurveFit, fit_curve
from hetero_ray.profile_defaults import DEFAULT_PROBE_BATCH_SIZES, DEFAULT_RAM_FRACTION  # noqa: F401 (re-exported)
from hetero_ray.profiling.microbench import torch_threads
from hetero_ray.profiling.recipe import ProfileModel
from hetero_ray.tensors import map_tensors

DEFAULT_REPEATS = 3  # blocks per size: their median rejects one disturbed block
# Untimed steps at each size before its blocks: the first step at a new size pays one-off
# costs (on a GPU the process's first step creates cuDNN/cuBLAS handles and picks kernels:
# hundreds of ms), and a block's length comes from the last of these; from the first alone
# the smallest size's block was one step (on an H100: batch 8 timed at twice its busy time).
WARMUP_STEPS = 2
# Each timing is the mean of back-to-back steps spanning ≥ 0.3 s: a CPU quota throttles in
# 100 ms CFS periods, and a short step can slip through a period at full speed, so the
# median of single steps would miss a throttled node; the mean over three periods does not.
MIN_BLOCK_S = 0.3
# A GPU's step is timed to a synchronise on a device no CPU quota throttles: shorter blocks
# let the budget hold three rounds once doubling has reached thousands of samples, and in
# its launch-bound flat part the GPU's blocks at one size differ by tens of percent, which
# the median of three rounds steadies and one block cannot.
GPU_MIN_BLOCK_S = 0.1
# Stop adding sizes (beyond the two smallest) and repeats past this; one full round always
# runs. It bounds the probe's part of the time before a GPU cluster's first step: a GPU's
# round of ~12 sizes at one 0.1 s block each leaves room for three rounds.
DEFAULT_PROBE_TIME_BUDGET_S = 6.0
# Keep doubling until two doublings in a row grew the busy time by more than this: a line
# through the origin grows 2×, a floor 1×; above 1.5× the line dominates (β·b > α), and two
# sizes on it fix its slope.
PROBE_GROWTH_STOP = 1.5
DEFAULT_SEARCH_TIME_BUDGET_S = 20.0  # GPU max-batch search: report a lower bound past this
MAX_BATCH_SIZE_LIMIT = 65536  # never search (or report) beyond this
BACKWARD_PEAK_FACTOR = 2.0  # backward holds activation gradients beside the saved activations
GPU_TRAINING_STATE_FACTOR = 3  # × parameter bytes reserved during the GPU search
CPU_FIXED_STATE_FACTOR = 4  # × parameter bytes: weights, gradients, two optimiser moments
OOM_MESSAGES = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


@dataclass
class ProbeResult:
    """What probing one model on one device found."""

    model: str
    device: str
    timings: list[tuple[int, float]]  # every measured (batch_size, busy_time_s)
    fit: CurveFit  # with its relative error at each probed size
    max_batch_size: Optional[int]
    max_batch_size_method: Optional[str]  # "oom-search" | "ram-fraction"
    max_batch_size_exhaustive: bool = True  # False: the search ran out of time (a lower bound)
    per_sample_bytes: Optional[float] = None  # CPU: the estimate behind the RAM cap

    def probe_rows(self) -> list[dict]:
        """Median busy time per batch size: ``[{"batch_size", "busy_time_s"}]``."""
        sizes = sorted({b for b, _ in self.timings})
        return [{"batch_size": b, "busy_time_s": statistics.median(t for s, t in self.timings if s == b)}
                for b in sizes]


@dataclass(frozen=True)
class SearchResult:
    max_batch_size: int  # largest batch that ran; 0 if not even ``start`` did
    exhaustive: bool  # False when the time budget or the limit stopped the search early
    tries: int


def fit_probe(timings: Sequence[tuple[int, float]]) -> CurveFit:
    """``t(b) = max(τ, α + β·b)`` through the probe's timings (the balancer's robust fit)."""
    if not timings:
        raise ValueError("no probe timings to fit")
    sizes, times = zip(*timings)
    return fit_curve(sizes, times)


def search_max_batch_size(
    run_batch: Callable[[int], None],
    *,
    start: int = 1,
    known_good: int = 0,
    limit: int = MAX_BATCH_SIZE_LIMIT,
    oom_errors: tuple[type[BaseException], ...] = (MemoryError,),
    on_oom: Callable[[], None] = lambda: None,
    time_budget_s: float = math.inf,
    clock: Callable[[], float] = time.monotonic,
) -> SearchResult:
    """The largest batch size ``b ≤ limit`` for which ``run_batch(b)`` does not run out of memory.

    Doubling from ``max(start, 2·known_good)`` until a size fails, then bisection between
    the last size that ran and the first that failed; assumes "fits" is monotone in ``b``.

    Args:
        run_batch: runs one step at batch ``b``; raises one of ``oom_errors`` when out of memory
            (any other exception propagates).
        known_good: a size already known to fit (e.g. the largest probed); not re-run.
        on_oom: called after each out-of-memory error (e.g. ``torch.cuda.empty_cache``).
        time_budget_s: past this the search stops and reports the largest size that ran
            (``exhaustive=False``).
    """
    if start < 1 or limit < 1:
        raise ValueError(f"start and limit must be ≥ 1, got start={start}, limit={limit}")
    deadline = clock() + time_budget_s
    tries = 0

    def fits(b: int) -> bool:
        nonlocal tries
        tries += 1
        out_of_memory = False
        try:
            run_batch(b)
        except oom_errors:
            out_of_memory = True
        if out_of_memory:
            # Outside the except block: the traceback, and the tensors its frames hold, are
            # gone, so emptying the cache can actually return their memory.
            on_oom()
        return not out_of_memory

    good = min(known_good, limit)
    bad: Optional[int] = None
    b = min(max(start, 2 * good), limit)
    while bad is None:  # doubling
        if b <= good:  # reached the limit
            return SearchResult(good, good >= limit, tries)
        if clock() >= deadline:
            return SearchResult(good, False, tries)
        if fits(b):
            good = b
            b = min(2 * b, limit)
        else:
            bad = b
    while bad - good > 1:  # bisection: good fits, bad does not
        if clock() >= deadline:
            return SearchResult(good, False, tries)
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return SearchResult(good, True, tries)


def ram_bound_batch_size(per_sample_bytes: float, fixed_bytes: float, available_bytes: float,
                         ram_fraction: float = DEFAULT_RAM_FRACTION,
                         limit: int = MAX_BATCH_SIZE_LIMIT) -> int:
    """``b_max = ⌊(ram_fraction·available − fixed) / per_sample⌋``, within ``[0, limit]``."""
    if not 0 < ram_fraction <= 1:
        raise ValueError(f"ram_fraction must be in (0, 1], got {ram_fraction}")
    if not per_sample_bytes > 0:
        raise ValueError(f"per_sample_bytes must be > 0, got {per_sample_bytes}")
    budget = ram_fraction * available_bytes - fixed_bytes
    return int(min(limit, max(0, math.floor(budget / per_sample_bytes))))


class StepRunner:
    """Runs and times the forward+backward step of one model on one device."""

    def __init__(self, model: torch.nn.Module, recipe, device: torch.device):
        self.model = model.to(device).train()
        self.recipe = recipe  # a ProfileModel: its batches and its loss
        self.device = torch.device(device)
        self._host_batch: tuple[int, object] = (0, None)  # (batch size, the batch)

    def busy_time_s(self, batch_size: int) -> float:
        """One step at ``batch_size``: host batch → device, forward, loss, backward."""
        batch = self._host_batch_of(batch_size)
        self.model.zero_grad(set_to_none=True)
        self._sync()
        start = time.perf_counter()
        self._step(map_tensors(batch, lambda t: t.to(self.device, non_blocking=True)))
        self._sync()
        return time.perf_counter() - start

    def _host_batch_of(self, batch_size: int):
        """The host batch of the last size asked for, made again only when the size changes:
        a block's steps at one size reuse it (each still copies it to the device). Making a
        fresh batch per step took longer than the steps themselves at a GPU's large sizes
        (random images on the host), so the probe's time budget went on making data."""
        if self._host_batch[0] != batch_size:
            batch = self.recipe.make_batch(batch_size)
            if self.device.type == "cuda":
                batch = map_tensors(batch, torch.Tensor.pin_memory)
            self._host_batch = (batch_size, batch)
        return self._host_batch[1]

    def run(self, batch_size: int) -> None:
        """One untimed step, the batch made on the device where the recipe allows (the
        memory search: a host batch of tens of thousands of samples would cost seconds to
        make and copy; torch's factory functions inside ``with device`` make it there)."""
        try:
            batch = batch_on_device(self.recipe.make_batch, batch_size, self.device)
            self._step(map_tensors(batch, lambda t: t.to(self.device)))
            self._sync()
        finally:
            self.model.zero_grad(set_to_none=True)

    def _step(self, batch) -> None:
        loss = self.recipe.compute_loss(self.model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"{self.recipe.name}: compute_loss must return a scalar tensor, got "
                             f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
        loss.backward()

    def saved_activation_bytes(self, batch_size: int) -> int:
        """Bytes of the distinct tensors autograd saves for backward in one forward pass,
        plus the batch itself."""
        seen: dict[tuple, int] = {}

        def pack(tensor: torch.Tensor):
            storage = tensor.untyped_storage()
            seen[(storage.data_ptr(), tensor.device.type)] = storage.nbytes()
            return tensor

        batch = map_tensors(self.recipe.make_batch(batch_size), lambda t: t.to(self.device))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = self.recipe.compute_loss(self.model, batch)
        del loss
        inputs: list[torch.Tensor] = []
        map_tensors(batch, inputs.append)
        return sum(seen.values()) + sum(t.numel() * t.element_size() for t in inputs)

    def parameter_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def measure_busy_times(runner: StepRunner, batch_sizes: Sequence[int], *, repeats: int = DEFAULT_REPEATS,
                       warmup: int = WARMUP_STEPS, min_block_s: float = MIN_BLOCK_S,
                       time_budget_s: float = DEFAULT_PROBE_TIME_BUDGET_S,
                       clock: Callable[[], float] = time.monotonic,
                       extend: bool = False, max_batch_size: int = MAX_BATCH_SIZE_LIMIT,
                       oom_errors: tuple[type[BaseException], ...] = (),
                       on_oom: Callable[[], None] = lambda: None) -> list[tuple[int, float]]:
    """``(batch_size, busy_time_s)`` pairs, one per block of back-to-back steps.

    Sizes are warmed up in ascending order (``warmup`` untimed steps each, the last one timed
    to size the blocks); a larger size is dropped when, predicted from the last one's
    per-sample time, its warm-up plus one timed round would overrun the budget (the two
    smallest are always kept, so a heavy model on a slow CPU still gets a line). With
    ``extend``, sizes then double beyond the largest until the last two doublings each grew
    the step by more than :data:`PROBE_GROWTH_STOP`, up to ``max_batch_size``, the budget
    (one more round of every size must fit) or the first of ``oom_errors`` (``on_oom`` is
    called; the size is not kept). Then up to ``repeats``
    rounds over the kept sizes, round-robin; in each, a size runs ``k = ⌈min_block_s / t(b)⌉``
    steps back to back and reports their mean. Stops after any round once over budget.
    """
    if warmup < 1 or repeats < 1:
        raise ValueError(f"warmup and repeats must be ≥ 1, got warmup={warmup}, repeats={repeats}")
    started = clock()
    kept: list[int] = []
    step_s: dict[int, float] = {}
    per_sample_s = 0.0
    for b in sorted(set(batch_sizes)):
        predicted = per_sample_s * (warmup * b + sum(kept) + b)
        if len(kept) >= 2 and clock() - started + predicted > time_budget_s:
            break
        for _ in range(warmup):
            step_s[b] = runner.busy_time_s(b)
        per_sample_s = step_s[b] / b
        kept.append(b)
    while extend and len(kept) >= 2 and 2 * kept[-1] <= max_batch_size and _grown_doublings(kept, step_s) < 2:
        b = 2 * kept[-1]
        # a line above its floor grows at most ~2× per doubling once past the knee (assume 4×
        # to be safe); a round runs every size for at least min_block_s
        guess = {**step_s, b: 4 * step_s[kept[-1]]}
        round_s = sum(max(min_block_s, guess[s]) for s in (*kept, b))
        if clock() - started + (warmup + 1) * guess[b] + round_s > time_budget_s:
            break
        out_of_memory = False
        try:
            for _ in range(warmup):
                step_s[b] = runner.busy_time_s(b)
        except oom_errors:
            out_of_memory = True
        if out_of_memory:
            on_oom()  # outside the except block: the traceback no longer holds the tensors
            break
        kept.append(b)
    timings: list[tuple[int, float]] = []
    for _ in range(repeats):
        for b in kept:
            steps = max(1, math.ceil(min_block_s / max(step_s[b], 1e-9)))
            block = [runner.busy_time_s(b) for _ in range(steps)]
            timings.append((b, sum(block) / steps))
            step_s[b] = timings[-1][1]
        if clock() - started > time_budget_s:
            break
    return timings


def _grown_doublings(kept: Sequence[int], step_s: dict[int, float]) -> int:
    """How many of the last steps between consecutive sizes grew the busy time by more than
    PROBE_GROWTH_STOP per doubling, counted back from the largest size."""
    count = 0
    for small, large in reversed(list(zip(kept, kept[1:]))):
        growth = (step_s[large] / step_s[small]) ** (math.log(2) / math.log(large / small))
        if growth <= PROBE_GROWTH_STOP:
            break
        count += 1
    return count


def probe_model(
    recipe: ProfileModel,
    device: torch.device,
    *,
    batch_sizes: Sequence[int] = DEFAULT_PROBE_BATCH_SIZES,
    repeats: int = DEFAULT_REPEATS,
    num_threads: Optional[int] = None,
    ram_fraction: float = DEFAULT_RAM_FRACTION,
    available_ram_bytes: Optional[int] = None,
    time_budget_s: float = DEFAULT_PROBE_TIME_BUDGET_S,
    search_time_budget_s: float = DEFAULT_SEARCH_TIME_BUDGET_S,
    on_stage: Callable[[str], None] = lambda stage: None,
) -> ProbeResult:
    """Probes the model of ``recipe`` on ``device`` (docs/profiling-and-planning.md#profiling-a-node).

    Args:
        recipe: how to build the model, make its batches and compute its loss (a
            built-in model's: :func:`hetero_ray.builtin.recipe.builtin_recipe`).
        available_ram_bytes: the RAM the CPU cap is a fraction of (default: what psutil
            reports as available now).
    """
    model_name = recipe.name
    device = torch.device(device)
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"probe batch sizes must be positive integers, got {list(batch_sizes)}")
    with torch_threads(num_threads if device.type == "cpu" else None), _on_device(device):
        torch.manual_seed(0)
        runner = StepRunner(recipe.build(), recipe, device)
        on_stage(f"{model_name} forward+backward at batch {','.join(map(str, sizes))}, doubling while flat")
        if device.type == "cuda":
            timings = measure_busy_times(_GpuProbeRunner(runner), sizes, repeats=repeats,
                                         min_block_s=GPU_MIN_BLOCK_S, time_budget_s=time_budget_s, extend=True,
                                         oom_errors=(torch.cuda.OutOfMemoryError,), on_oom=torch.cuda.empty_cache)
            fit = fit_probe(timings)
            on_stage(f"{model_name} largest batch")
            result = _gpu_max_batch(runner, known_good=max(b for b, _ in timings), time_budget_s=search_time_budget_s)
            return ProbeResult(model_name, str(device), timings, fit, result.max_batch_size, "oom-search",
                               result.exhaustive)
        # CPU: running out of RAM kills the process, so the cap bounds the doubling up front
        per_sample = _per_sample_bytes(runner, sizes)
        if available_ram_bytes is None:
            import psutil

            available_ram_bytes = psutil.virtual_memory().available
        cap = ram_bound_batch_size(per_sample, CPU_FIXED_STATE_FACTOR * runner.parameter_bytes(),
                                   available_ram_bytes, ram_fraction)
        timings = measure_busy_times(runner, sizes, repeats=repeats, time_budget_s=time_budget_s, extend=True,
                                     max_batch_size=max(cap, sizes[-1]))
        fit = fit_probe(timings)
        return ProbeResult(model_name, str(device), timings, fit, cap, "ram-fraction", True, per_sample)


def _per_sample_bytes(runner: StepRunner, sizes: Sequence[int]) -> float:
    """Peak training bytes per sample: saved-activation growth between two sizes × the
    backward factor (the input is among the saved tensors' growth, counted once)."""
    small, large = sizes[0], max(sizes[-1], 2 * sizes[0])
    growth = (runner.saved_activation_bytes(large) - runner.saved_activation_bytes(small)) / (large - small)
    return max(BACKWARD_PEAK_FACTOR * growth, 1.0)


def _gpu_max_batch(runner: StepRunner, known_good: int, time_budget_s: float) -> SearchResult:
    reserve = torch.empty(GPU_TRAINING_STATE_FACTOR * runner.parameter_bytes(), dtype=torch.uint8,
                          device=runner.device)

    def run(batch_size: int) -> None:
        with _allocation_failures_as_oom():
            runner.run(batch_size)

    try:
        return search_max_batch_size(
            run, known_good=known_good, oom_errors=(torch.cuda.OutOfMemoryError,),
            on_oom=torch.cuda.empty_cache, time_budget_s=time_budget_s,
        )
    finally:
        del reserve
        runner.model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _allocation_failures_as_oom():
    """cuBLAS/cuDNN report a failed workspace allocation as a plain RuntimeError: raise it
    as the out-of-memory error it is."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, torch.cuda.OutOfMemoryError) or not _allocation_failure(e):
            raise
        raise torch.cuda.OutOfMemoryError(str(e)) from None


def _allocation_failure(error: RuntimeError) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or any(marker in str(error) for marker in OOM_MESSAGES)


class _GpuProbeRunner:
    """A runner's timed step with allocation failures raised as out of memory (the doubling
    probe stops there)."""

    def __init__(self, runner: StepRunner):
        self._runner = runner

    def busy_time_s(self, batch_size: int) -> float:
        with _allocation_failures_as_oom():
            return self._runner.busy_time_s(batch_size)


class _on_device:
    """``torch.cuda.device(device)`` for a GPU, nothing for a CPU."""

    def __init__(self, device: torch.device):
        self._context = torch.cuda.device(device) if device.type == "cuda" else None

    def __enter__(self):
        if self._context is not None:
            self._context.__enter__()

    def __exit__(self, *exc):
        if self._context is not None:
            return self._context.__exit__(*exc)
        return False


def batch_on_device(make_batch, batch_size: int, device: torch.device):
    """``make_batch(batch_size)`` made on ``device`` by torch's factory functions, or on the
    host where the recipe cannot be (a CPU ``torch.Generator`` of its own refuses another
    device): the caller copies it."""
    try:
        with device:
            return make_batch(batch_size)
    except RuntimeError as e:
        if _allocation_failure(e):  # the memory search's answer, not a recipe made for the host
            raise
        return make_batch(batch_size)
