"""Micro-benchmarks of one device, each time-boxed to about ``duration_s`` (default 1 s).

- dense matmul throughput: ``2·n³`` flops per ``n×n`` product; fp32 on a CPU, fp32 (TF32
  off: the true fp32 figure), bf16 and fp16 on a GPU;
- memory bandwidth: a large tensor copied within device memory, ``2·nbytes`` per copy
  (read + write), in GB/s (10⁹ bytes);
- host↔device copy bandwidth on a GPU: pinned host memory to the device and back.

Each loop warms up first, then runs in chunks (a GPU synchronises once per chunk, not per
operation) until the time box is spent; the figure is work done / wall time. Wall time is
the point: a CPU capped by a cgroup quota, or shared with other processes, measures slower,
which is what its training worker will see.

On a CPU the benchmarks use ``num_threads`` threads — what a training worker with that
many CPUs uses — and restore the process's thread count afterwards.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, Optional

import torch

DEFAULT_DURATION_S = 1.0  # per benchmark; long enough to span ten 100 ms cgroup periods
WARMUP_FRACTION = 0.2  # of the time box, spent before measuring (allocator, caches, clocks)
MIN_CHUNK_S = 0.02  # GPU: synchronise at most every 20 ms, so launch overhead stays hidden
CPU_MATMUL_SIZE_SMALL = 512  # ≤ 2 threads: ~5 ms per product at ~50 GFLOP/s
CPU_MATMUL_SIZE_LARGE = 1024  # more threads: enough work to keep them all busy
GPU_MATMUL_SIZES = (8192, 4096, 2048)  # largest that fits; 8192 saturates an H100
CPU_COPY_BYTES = 128 * 1024**2  # well beyond any last-level cache
GPU_COPY_BYTES = 1024**3
HOST_DEVICE_COPY_BYTES = 256 * 1024**2
GB = 1e9


@contextlib.contextmanager
def torch_threads(num_threads: Optional[int]) -> Iterator[None]:
    """Runs the block with ``torch.set_num_threads(num_threads)``; restores the old count."""
    if num_threads is None:
        yield
        return
    if num_threads < 1:
        raise ValueError(f"num_threads must be ≥ 1, got {num_threads}")
    previous = torch.get_num_threads()
    torch.set_num_threads(int(num_threads))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def timed_loop(operation: Callable[[], None], duration_s: float,
               synchronize: Optional[Callable[[], None]] = None) -> tuple[int, float]:
    """Runs ``operation`` repeatedly for about ``duration_s`` (after a warm-up).

    Returns:
        ``(operations, seconds)`` of the measured part; at least one operation.
    """
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    sync = synchronize or (lambda: None)
    # Warm-up, which also sizes the chunk: operations per MIN_CHUNK_S.
    start = time.perf_counter()
    count = 0
    while True:
        operation()
        count += 1
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= WARMUP_FRACTION * duration_s:
            break
    chunk = max(1, int(MIN_CHUNK_S / (elapsed / count))) if synchronize is not None else 1
    done = 0
    start = time.perf_counter()
    while True:
        for _ in range(chunk):
            operation()
        sync()
        done += chunk
        elapsed = time.perf_counter() - start
        if elapsed >= duration_s:
            return done, elapsed


def matmul_tflops(device: torch.device, dtype: torch.dtype = torch.float32, *,
                  num_threads: Optional[int] = None, duration_s: float = DEFAULT_DURATION_S,
                  size: Optional[int] = None) -> float:
    """Dense ``n×n`` matmul throughput in TFLOP/s (``2·n³`` flops per product)."""
    device = torch.device(device)
    with torch_threads(num_threads if device.type == "cpu" else None), _true_fp32(device):
        if device.type == "cuda":
            sizes = (size,) if size else GPU_MATMUL_SIZES
        else:
            sizes = (size or (CPU_MATMUL_SIZE_SMALL if (num_threads or torch.get_num_threads()) <= 2
                              else CPU_MATMUL_SIZE_LARGE),)
        for n in sizes:
            try:
                timing = _time_matmul(device, dtype, n, duration_s)
            except torch.cuda.OutOfMemoryError:
                timing = None  # try the next, smaller size once the cache is emptied
            _free(device)
            if timing is not None:
                count, seconds = timing
                return 2.0 * n**3 * count / seconds / 1e12
    raise RuntimeError(f"no matmul size in {sizes} fits on {device}")


def memory_bandwidth_gbps(device: torch.device, *, num_threads: Optional[int] = None,
                          duration_s: float = DEFAULT_DURATION_S, nbytes: Optional[int] = None) -> float:
    """Copy bandwidth within device memory, GB/s, counting read + write (``2·nbytes``)."""
    device = torch.device(device)
    nbytes = nbytes or (GPU_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES)
    with torch_threads(num_threads if device.type == "cpu" else None):
        count, seconds, moved_per_copy = _time_copy(device, nbytes, duration_s)
    _free(device)
    return moved_per_copy * count / seconds / GB


def host_device_gbps(device: torch.device, direction: str = "h2d", *,
                     duration_s: float = DEFAULT_DURATION_S, nbytes: int = HOST_DEVICE_COPY_BYTES) -> float:
    """Pinned host ↔ GPU copy bandwidth, GB/s (``direction`` "h2d" or "d2h")."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"host↔device bandwidth needs a CUDA device, got {device}")
    if direction not in ("h2d", "d2h"):
        raise ValueError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
    count, seconds = _time_host_device(device, direction, nbytes, duration_s)
    _free(device)
    return float(nbytes // 4 * 4) * count / seconds / GB


def run_microbenchmarks(device: torch.device, *, num_threads: Optional[int] = None,
                        duration_s: float = DEFAULT_DURATION_S,
                        on_stage: Callable[[str], None] = lambda stage: None) -> dict:
    """Every benchmark that applies to ``device``; keys are :class:`DeviceCapability` fields.

    A benchmark that fails leaves its key out and adds its reason under ``"error"``; the
    others still run.
    """
    device = torch.device(device)
    results: dict = {}
    errors: list[str] = []

    def measure(key: str, stage: str, fn: Callable[[], float]) -> None:
        on_stage(stage)
        try:
            results[key] = fn()
        except Exception as e:  # noqa: BLE001 - reported with the device, others go on
            errors.append(f"{stage}: {type(e).__name__}: {e}")

    measure("matmul_tflops_fp32", "matmul fp32",
            lambda: matmul_tflops(device, torch.float32, num_threads=num_threads, duration_s=duration_s))
    if device.type == "cuda":
        with torch.cuda.device(device):
            if torch.cuda.is_bf16_supported():
                measure("matmul_tflops_bf16", "matmul bf16",
                        lambda: matmul_tflops(device, torch.bfloat16, duration_s=duration_s / 2))
            measure("matmul_tflops_fp16", "matmul fp16",
                    lambda: matmul_tflops(device, torch.float16, duration_s=duration_s / 2))
    measure("memory_bandwidth_gbps", "memory bandwidth",
            lambda: memory_bandwidth_gbps(device, num_threads=num_threads, duration_s=duration_s))
    if device.type == "cuda":
        measure("h2d_gbps", "host→device copy", lambda: host_device_gbps(device, "h2d", duration_s=duration_s / 2))
        measure("d2h_gbps", "device→host copy", lambda: host_device_gbps(device, "d2h", duration_s=duration_s / 2))
    if errors:
        results["error"] = "; ".join(errors)
    return results


def _time_matmul(device: torch.device, dtype: torch.dtype, n: int, duration_s: float) -> tuple[int, float]:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    return timed_loop(lambda: torch.mm(a, b, out=out), duration_s, _synchronizer(device))


def _time_copy(device: torch.device, nbytes: int, duration_s: float) -> tuple[int, float, float]:
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    count, seconds = timed_loop(lambda: dst.copy_(src), duration_s, _synchronizer(device))
    return count, seconds, 2.0 * src.numel() * src.element_size()  # read + write


def _time_host_device(device: torch.device, direction: str, nbytes: int, duration_s: float) -> tuple[int, float]:
    host = torch.ones(nbytes // 4, dtype=torch.float32).pin_memory()
    gpu = torch.empty(host.shape, dtype=host.dtype, device=device)
    if direction == "h2d":
        return timed_loop(lambda: gpu.copy_(host, non_blocking=True), duration_s, _synchronizer(device))
    return timed_loop(lambda: host.copy_(gpu, non_blocking=True), duration_s, _synchronizer(device))


def _synchronizer(device: torch.device) -> Optional[Callable[[], None]]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _true_fp32(device: torch.device) -> Iterator[None]:
    """fp32 matmuls without TF32 on GPUs (otherwise "fp32" would report TF32 tensor cores)."""
    if device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    attribute = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    previous = getattr(matmul, attribute)
    setattr(matmul, attribute, "ieee" if attribute == "fp32_precision" else False)
    try:
        yield
    finally:
        setattr(matmul, attribute, previous)
