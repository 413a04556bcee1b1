"""Entrypoint for `ray job submit`: the same flags as `hetero-ray train`.

    ray job submit --working-dir . -- python jobs/train.py --model simple_cnn --num-workers 4

Inside a Ray job, RAY_ADDRESS is set, so training joins the cluster the job runs on.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetero_ray.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
