"""Balancer benchmark (`ray job submit` entrypoint; same flags as `hetero-ray bench`).

    python jobs/bench_balance.py --speed-change 100:1:0.5 --homogeneous-check --json bench.json
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetero_ray.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
