"""Profiling defaults, importable without torch (the CLI shows them in --help)."""

DEFAULT_PROBE_BATCH_SIZES = (8, 16, 32, 64)  # a factor 8 apart: the slope is well determined
DEFAULT_RAM_FRACTION = 0.5  # of available RAM one CPU worker's batch may take
DEFAULT_PROFILE_TIMEOUT_S = 60.0  # per cluster: actor start (~2–5 s) + ~10 s of benchmarks, with room
DEFAULT_MICROBENCH_S = 1.0  # per micro-benchmark
