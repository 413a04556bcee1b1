"""Elasticity: a whole node leaves a running job (SIGKILL of its Ray processes).

A real 3-node cluster on this machine (`ray start` head + 2 nodes, one CPU each, so each
node holds one worker), the driver through the CLI with `--num-workers 2-3`. After a
checkpoint, one node vanishes; the run must continue with 2 workers from the last
checkpoint, say so, keep the global batch, and still consume every sample exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from hetero_ray.preflight import latest_checkpoint_dir
from tests.ray_nodes import local_cluster

pytestmark = [pytest.mark.slow]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_losing_a_node_continues_with_fewer_workers(tmp_path):
    with local_cluster(str(tmp_path), worker_cpus=[1, 1]) as (address, nodes):
        env = {**os.environ, "RAY_ADDRESS": "", "HETERO_RAY_PROGRESS_INTERVAL_S": "1"}
        command = [sys.executable, "-m", "hetero_ray", "train", "--address", address, "--num-workers", "2-3",
                   "--model", "simple_cnn", "--num-samples", "1800", "--batch-size", "30", "--epochs", "2",
                   "--checkpoint-every", "10", "--no-profile", "--record-sample-ids", "--policy", "optimal",
                   "--output-dir", str(tmp_path / "runs"), "--experiment-name", "elastic"]
        driver = subprocess.Popen(command, cwd=REPO_ROOT, env=env, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
        run_dir = tmp_path / "runs" / "elastic"
        started = time.monotonic()
        killed_at = None
        while driver.poll() is None and time.monotonic() - started < 300:
            latest = latest_checkpoint_dir(str(run_dir)) if run_dir.exists() else None
            if killed_at is None and latest and int(os.path.basename(latest).split("_")[1]) >= 20:
                nodes[2].kill()  # a worker machine vanishes
                killed_at = time.monotonic()
            time.sleep(0.5)
        output, _ = driver.communicate(timeout=300)
        (tmp_path / "driver.log").write_text(output)
        open("/tmp/elastic_driver.log", "w").write(output)
        print(output[-4000:])
        assert killed_at is not None, "the run ended before a node could be removed"
        assert driver.returncode == 0, output[-3000:]

    attempts = json.loads((run_dir / "attempts.json").read_text())
    assert [a["num_workers"] for a in attempts] == [3, 2], attempts
    resumed_at = attempts[1]["start_global_step"]
    assert resumed_at >= 20 and resumed_at % 10 == 0
    assert f"lost; continuing with 2 workers from step {resumed_at}" in output
    print(f"recovery: the new worker group started {attempts[1]['wall_time'] - attempts[0]['wall_time']:.0f} s "
          f"after the first; node removed {killed_at - started:.0f} s into the run")

    steps = pd.read_parquet(run_dir / "steps.parquet")
    per_step = steps.groupby("global_step")["local_batch_size"].sum()
    assert per_step.index.tolist() == list(range(120)) and (per_step == 30).all()  # same global batch
    assert steps[steps["global_step"] >= resumed_at]["rank"].nunique() == 2
    ids = pd.read_parquet(run_dir / "sample_ids.parquet")
    for epoch, rows in ids.groupby("epoch"):
        assert len(rows) == 1800 and set(rows["sample_index"]) == set(range(1800)), f"epoch {epoch}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["final_eval_metric"] > 0.3
