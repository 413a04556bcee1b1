"""A driver stopped while the nodes are profiled before the first step (as with GPUs), run
as its own process by tests/test_interrupted_runs.py: ``python -m tests.stop_while_profiling RUN_DIR``,
on the cluster RAY_ADDRESS names (a local Ray of its own without it).

It runs the lifecycle every run shares (runtime/lifecycle.py) with profiling before the
first step and a model whose build takes seconds, so a signal lands in profiling. It exits
``128 + signal`` on RunInterrupted, as the CLI does, after printing which of the run's
named actors are still alive.
"""

from __future__ import annotations

import json
import os
import sys
import time

from hetero_ray.runtime.auth import prepare_auth_env

prepare_auth_env(None)  # RAY_ADDRESS's cluster asks for the token, when it has one; Ray reads this on import

import ray  # noqa: E402

from hetero_ray import ProfileModel  # noqa: E402
from hetero_ray.constants import RAY_NAMESPACE  # noqa: E402
from hetero_ray.errors import RunInterrupted  # noqa: E402
from hetero_ray.runs import run_files  # noqa: E402
from hetero_ray.profiling.profile_config import ProfileConfig  # noqa: E402
from hetero_ray.runtime.lifecycle import ProfilingSpec, RunSpec, run_lifecycle  # noqa: E402
from tests.api_jobs import make_model, random_batch  # noqa: E402

NAME = "stopped-while-profiling"
BUILD_S = 30.0  # the profiler builds the model this long: the stop lands in profiling on any machine


def slow_model():
    time.sleep(BUILD_S)
    return make_model()


def main(run_dir: str) -> int:
    ray.init(namespace=RAY_NAMESPACE, logging_level="ERROR")  # RAY_ADDRESS's cluster: the test's session
    os.makedirs(run_dir)
    run_files.write_json(os.path.join(run_dir, run_files.CONFIG_FILE), {"name": NAME})
    spec = RunSpec(
        experiment_name=NAME, run_dir=run_dir,
        planner_settings=dict(global_batch_size=8, policy="static", rebalance_interval=20),
        summary_base={"experiment_name": NAME, "policy": "static", "num_workers": 2, "global_batch_size": 8},
        interruption=lambda signum, summary: RunInterrupted(f"interrupted at {summary['global_steps']}", signum,
                                                            resumable=False),
        profiling=ProfilingSpec(ProfileConfig(model=ProfileModel(build=slow_model, make_batch=random_batch),
                                              batch_sizes=(2, 4), cpus_per_worker=1.0, timeout_s=120.0),
                                uses_gpus=True),
    )

    def no_training(first_plan_wait_s: float):
        raise AssertionError("the stop came during profiling: training must not start")

    try:
        run_lifecycle(spec, no_training)
    except RunInterrupted as stop:
        print(json.dumps({"alive": _run_actors_alive()}), flush=True)
        return 128 + stop.signum
    return 0


def _run_actors_alive(wait_s: float = 15.0) -> list[str]:
    """The run's named actors (store, planner, profilers) still alive, once the kills landed."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if NAME in a["name"]]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
