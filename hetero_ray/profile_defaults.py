"""Profiling defaults, importable without torch (the CLI shows them in --help)."""

DEFAULT_PROBE_BATCH_SIZES = (8, 16, 32, 64)  # a factor 8 apart: the slope is well determined
DEFAULT_RAM_FRACTION = 0.5  # of available RAM one CPU worker's batch may take
# For the whole cluster: actor start (~2–5 s), ~10 s of micro-benchmarks, and the model probe
# (a few batch sizes and the largest batch that fits), which grows with the model and is
# slowest on a CPU node. A node not done by then is reported failed and starts on typical
# shares, so too short a limit costs a healthy node its measured first plan, while too long
# a one costs time only when a node is broken (the first plan waits for it).
DEFAULT_PROFILE_TIMEOUT_S = 120.0
DEFAULT_MICROBENCH_S = 1.0  # per micro-benchmark


def probe_batch_sizes_around(global_batch_size: int, num_workers: int) -> list[int]:
    """Probe sizes around the mean local batch ``b = B/n``: b/4, b/2, b, 2b (distinct, ≥ 1),
    where the first plans' shares will lie."""
    mean = max(1, round(global_batch_size / num_workers))
    return sorted({max(1, mean // 4), max(1, mean // 2), mean, 2 * mean})
