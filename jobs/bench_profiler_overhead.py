"""Benchmark: the in-training profiler's cost per step, on vs off (target ratio ≤ 1.02).

    python jobs/bench_profiler_overhead.py [--model simple_cnn] [--rounds 3] [--steps 150] [--json out.json]
    python jobs/bench_profiler_overhead.py --in-process      # the training step alone, no Ray
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.profiler_overhead import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
