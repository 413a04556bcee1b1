"""Soak: 5,000 steps of mlp with the metrics store's memory sampled; Parquet audited at the end.

    python jobs/soak.py                                       # the full soak (~3 minutes here)
    python jobs/soak.py --steps 3000 --max-recent-steps 1000 --json soak.json

See benchmarks/soak.py for what is measured. Exit status 1 when the Parquet files are
incomplete or the run failed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.soak import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
