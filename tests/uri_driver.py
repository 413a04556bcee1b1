"""A HeteroTrainer driver on file:// storage, run as its own process by tests/test_api_e2e.py
(``python -m tests.uri_driver STORAGE_URI OUTPUT_DIR``) so that the test can SIGKILL it mid-run.

The job is api_jobs.batchnorm_loop with a checkpoint every 2 steps, slowed by emulated
speeds so that a kill lands between checkpoints.
"""

from __future__ import annotations

import sys

from ray.train import RunConfig, ScalingConfig

from hetero_ray import HeteroConfig, HeteroTrainer
from tests import api_jobs

NAME = "api-uri-crash"
NUM_SAMPLES, BATCH, EPOCHS = 160, 16, 2  # 20 global steps
LOOP_CONFIG = {"num_samples": NUM_SAMPLES, "epochs": EPOCHS, "loader_workers": 0, "checkpoint_every": 2}


def trainer(storage_uri: str, output_dir: str, speeds=None, torch_config=None) -> HeteroTrainer:
    return HeteroTrainer(
        api_jobs.batchnorm_loop, train_loop_config=LOOP_CONFIG, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=NAME, storage_path=storage_uri),
        hetero_config=HeteroConfig(global_batch_size=BATCH, policy="static", output_dir=output_dir,
                                   emulate_speeds=speeds, record_sample_ids=True),
        torch_config=torch_config,
    )


if __name__ == "__main__":
    trainer(sys.argv[1], sys.argv[2], speeds=(0.01, 0.01)).fit()
