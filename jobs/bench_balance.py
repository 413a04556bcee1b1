"""The policies' benchmark as a `ray job submit` entrypoint (the flags of benchmarks/balance.py).

    python jobs/bench_balance.py --speed-change 100:1:0.5 --homogeneous-check --json bench.json

Inside a Ray job, relative --output-dir and --json (and the default runs/bench-<time>) land
under HETERO_RAY_JOB_OUTPUT_DIR or ~/hetero_ray, not in Ray's copy of the working dir
(jobs/job_paths.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.balance import main  # noqa: E402
from jobs.job_paths import resolve_output_paths  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(resolve_output_paths("bench", sys.argv[1:])))
