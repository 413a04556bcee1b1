"""Entrypoint for `ray job submit`: the same flags as `hetero-ray profile`.

    ray job submit --working-dir . -- python jobs/profile_cluster.py --model simple_cnn --json nodes.json

Inside a Ray job, RAY_ADDRESS is set, so profiling covers the cluster the job runs on, and a
relative --json lands under HETERO_RAY_JOB_OUTPUT_DIR or ~/hetero_ray (jobs/job_paths.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetero_ray.cli.main import main  # noqa: E402
from jobs.job_paths import resolve_output_paths  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["profile", *resolve_output_paths("profile", sys.argv[1:])]))
