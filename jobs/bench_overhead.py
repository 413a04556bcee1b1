"""Spine benchmark: hetero_ray vs plain Ray Train, and proportional vs static shares.

    python jobs/bench_overhead.py [--model simple_cnn] [--batch-size 128] [--steps 150] [--json out.json]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.overhead import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
