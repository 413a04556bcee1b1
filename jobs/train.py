"""Entrypoint for `ray job submit`: the same flags as `hetero-ray train`.

    ray job submit --working-dir . -- python jobs/train.py --model simple_cnn --num-workers 4

Inside a Ray job, RAY_ADDRESS is set, so training joins the cluster the job runs on, and a
relative --storage-path (the default `runs` too) lands under HETERO_RAY_JOB_OUTPUT_DIR or
~/hetero_ray, not in Ray's copy of the working dir, which Ray deletes (jobs/job_paths.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetero_ray.cli.main import main  # noqa: E402
from jobs.job_paths import resolve_output_paths  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *resolve_output_paths("train", sys.argv[1:])]))
