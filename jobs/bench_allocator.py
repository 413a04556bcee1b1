"""Benchmark: CPU training steps with glibc's default allocator thresholds and with
hetero_ray's (freed activations kept for the next step): time, page faults, jitter, RSS.

    python jobs/bench_allocator.py [--batch-sizes 64,192] [--steps 60] [--rounds 3] [--json out.json]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.allocator import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
