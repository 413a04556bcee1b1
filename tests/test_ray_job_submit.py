"""`ray job submit` of jobs/train.py and of an example to a real two-node cluster started
by cluster_configs/.

The cluster is independent of the session's Ray (no `ray_session`): a head started by
cluster_configs/start_head.sh on this machine and a second node started by
cluster_configs/start_worker.sh, each `ray start --block` in its own process group with
its own short temp dir (`ray start` writes ray_current_cluster there; in /tmp/ray it would
send later plain ray.init() calls to this soon-dead cluster). The head script generates a
token in the temp dir (not ~/.ray/auth_token), so the test also shows that the scripts'
token authentication holds: no token, no API. Everything is killed afterwards, also on
failure; `ray stop` is never used (it would stop every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pandas as pd
import psutil
import pytest

from benchmarks.local_cluster import listening
from hetero_ray.constants import DEVICE_LABEL
from tests.helpers import assert_loads, free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO_ROOT, "cluster_configs")
RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")
NODE_START_TIMEOUT_S = 90
JOB_TIMEOUT_S = 300  # ~45 s on an idle 2-core machine; generous for a shared, loaded one
CPUS_PER_NODE = 2
STOP_GRACE_S = 2  # `ray start` drains up to 30 s on SIGTERM; a test cluster need not


class Node:
    """A `start_*.sh --block` process: the script execs `ray start`, so its process group
    holds the node's raylet, GCS, dashboard and workers."""

    def __init__(self, name: str, argv: list[str], env: dict, log_dir: str):
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, cwd=REPO_ROOT)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            pytest.fail(f"the {self.name} node exited with {self.process.returncode}:\n{self.log()}")

    def group_alive(self) -> bool:
        """Whether anything but zombies is left in the node's process group."""
        pgid = self.process.pid
        for process in psutil.process_iter(["status"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                    return True
        return False


def _stop(nodes: list[Node]) -> None:
    """SIGTERM to each `ray start --block` (it stops its processes in order), a few seconds
    for that, then SIGKILL to whatever is left in the process groups. A node that ran
    workers drains for up to 30 s on SIGTERM; a test cluster need not wait for that."""
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            node.process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(n.process.poll() is None for n in nodes):
        time.sleep(0.2)
    deadline = time.monotonic() + 20
    while True:
        alive = [n for n in nodes if n.group_alive()]
        if not alive or time.monotonic() > deadline:
            break
        for node in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.process.pid, signal.SIGKILL)
        time.sleep(0.2)
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(5)
    if alive:
        print(f"processes of {[n.name for n in alive]} survived SIGKILL", file=sys.stderr)


@pytest.fixture(scope="module")
def script_cluster():
    """Head + one worker node from the cluster_configs scripts, 2 CPUs each, on loopback."""
    temp_dir = tempfile.mkdtemp(prefix="hrjob")  # short: Ray's Unix sockets live under it
    token_path = os.path.join(temp_dir, "auth_token")
    gcs_port, dashboard_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    env.update({
        # Without the venv on PATH: the scripts must put the Python that runs Ray first, or
        # the job's `python jobs/train.py` finds no Python with Ray.
        "PATH": os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                if os.path.abspath(p) != os.path.dirname(RAY_CLI)),
        "HETERO_RAY_RAY_BIN": RAY_CLI,
        "HETERO_RAY_NODE_ENV": os.path.join(temp_dir, "no-node.env"),
        "HETERO_RAY_NUM_CPUS": str(CPUS_PER_NODE),
        "HETERO_RAY_DEVICE": "cpu",  # even on a GPU machine: the run below is CPU-only
        "RAY_AUTH_TOKEN_PATH": token_path,
        # Other Ray clusters run on this machine (the session's, other test runs). Ray
        # Train's PlacementGroupCleaner looks the dashboard up through RAY_ADDRESS and,
        # without it, refuses to pick one of several local clusters.
        "RAY_ADDRESS": f"127.0.0.1:{gcs_port}",
    })
    small = ["--object-store-memory=100000000"]
    nodes: list[Node] = []
    started = time.monotonic()
    try:
        head_env = dict(env, HETERO_RAY_PORT=str(gcs_port), HETERO_RAY_DASHBOARD_PORT=str(dashboard_port),
                        HETERO_RAY_CLIENT_PORT=str(free_port()), HETERO_RAY_METRICS_PORT=str(free_port()))
        nodes.append(Node("head", ["bash", os.path.join(CONFIGS, "start_head.sh"), "--block",
                                   "--temp-dir", os.path.join(temp_dir, "h"), "--",
                                   f"--dashboard-agent-listen-port={free_port()}", *small], head_env, temp_dir))
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while not listening(gcs_port):
            nodes[0].check_alive()
            if time.monotonic() > deadline:
                pytest.fail(f"the head's GCS did not listen on {gcs_port}:\n{nodes[0].log()}")
            time.sleep(0.3)
        worker_env = dict(env, HETERO_RAY_METRICS_PORT=str(free_port()))
        nodes.append(Node("worker", ["bash", os.path.join(CONFIGS, "start_worker.sh"), "--block",
                                     "--temp-dir", os.path.join(temp_dir, "w"), f"127.0.0.1:{gcs_port}", "--",
                                     f"--dashboard-agent-listen-port={free_port()}", *small], worker_env, temp_dir))
        cluster = {"dashboard": f"http://127.0.0.1:{dashboard_port}", "token_path": token_path, "temp_dir": temp_dir}
        while True:
            for node in nodes:
                node.check_alive()
            if time.monotonic() > deadline:
                pytest.fail("the two nodes did not both register:\n" + "\n".join(n.log() for n in nodes))
            with contextlib.suppress(OSError, ValueError, KeyError):
                alive = [n for n in _nodes(cluster) if n["state"] == "ALIVE"]
                if len(alive) == 2:
                    break
            time.sleep(0.5)
        print(f"\ncluster of 2 nodes up in {time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        _stop(nodes)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _get(cluster: dict, path: str, token: str | None) -> dict:
    request = urllib.request.Request(cluster["dashboard"] + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _token(cluster: dict) -> str:
    with open(cluster["token_path"]) as f:
        return f.read().strip()


def _nodes(cluster: dict) -> list[dict]:
    return _get(cluster, "/api/v0/nodes?detail=1", _token(cluster))["data"]["result"]["result"]


def _ray_cli(cluster: dict, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    """The `ray` CLI as a job submitter runs it: RAY_AUTH_MODE=token and the head's token."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=cluster["token_path"])
    return subprocess.run([RAY_CLI, *args], env=env, capture_output=True, text=True, timeout=timeout_s,
                          cwd=REPO_ROOT)


def test_nodes_carry_the_device_label_and_the_api_needs_the_token(script_cluster):
    # start_head.sh made the token: 256 random bits that only the owner can read.
    assert re.fullmatch(r"[0-9a-f]{64}", _token(script_cluster))
    assert stat.S_IMODE(os.stat(script_cluster["token_path"]).st_mode) == 0o600
    nodes = _nodes(script_cluster)
    assert [n["labels"].get(DEVICE_LABEL) for n in nodes] == ["cpu", "cpu"]
    assert sorted(n["resources_total"]["CPU"] for n in nodes) == [CPUS_PER_NODE, CPUS_PER_NODE]
    with pytest.raises(urllib.error.HTTPError) as no_token:
        _get(script_cluster, "/api/v0/nodes", token=None)
    assert no_token.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as wrong_token:
        _get(script_cluster, "/api/v0/nodes", token="0" * 64)
    assert wrong_token.value.code == 403


def test_ray_job_submit_trains_and_writes_the_run_directory(script_cluster, tmp_path):
    output_dir = str(tmp_path / "runs")
    job_id = f"hetero-ray-test-{os.getpid()}-{int(time.time())}"
    # Progress every 0.5 s and workers slowed to 1/20 of their speed, so that the short
    # run lasts long enough to print step lines through `ray job logs`.
    runtime_env = {"env_vars": {"HETERO_RAY_PROGRESS_INTERVAL_S": "0.5"}}
    started = time.monotonic()
    submit = _ray_cli(
        script_cluster, "job", "submit", "--address", script_cluster["dashboard"], "--submission-id", job_id,
        "--working-dir", REPO_ROOT, "--runtime-env-json", json.dumps(runtime_env), "--",
        "python", "jobs/train.py", "--model", "mlp", "--num-workers", "2", "--worker-devices", "cpu,cpu",
        "--num-samples", "512", "--global-batch-size", "32", "--epochs", "1", "--no-profile",
        "--emulate-speeds", "0.05,0.05", "--storage-path", output_dir, "--name", "submitted",
        timeout_s=JOB_TIMEOUT_S)
    job_s = time.monotonic() - started
    print(f"ray job submit: {job_s:.1f} s (submit, upload, run, tail)")
    assert submit.returncode == 0, submit.stdout[-5000:] + submit.stderr[-3000:]
    run_dir = os.path.join(output_dir, "submitted")
    assert f"results: {run_dir}" in submit.stdout  # the job says where its results went

    job = _get(script_cluster, f"/api/jobs/{job_id}", _token(script_cluster))
    assert job["status"] == "SUCCEEDED", job
    assert job["entrypoint"].startswith("python jobs/train.py")
    logs = _ray_cli(script_cluster, "job", "logs", "--address", script_cluster["dashboard"], job_id, timeout_s=60)
    assert logs.returncode == 0, logs.stderr
    step_lines = [line for line in logs.stdout.splitlines() if line.startswith("[hetero_ray] step ")]
    assert step_lines, logs.stdout[-3000:]
    assert all("/16 (epoch 0)" in line for line in step_lines), step_lines

    # The driver ran on the head, which is this machine: the run directory is here.
    for name in ("summary.json", "steps.parquet", "model_final.pt"):
        assert os.path.getsize(os.path.join(run_dir, name)) > 0, name
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary, "empty summary.json"
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    assert sorted(steps["rank"].unique()) == [0, 1] and steps["global_step"].max() == 15


def test_an_example_runs_as_a_ray_job(script_cluster, tmp_path):
    """What each example's docstring promises: `ray job submit --working-dir . -- python
    examples/X.py` trains (a HeteroTrainer inside the job's driver) and leaves its run.
    One example shows the job path, and is that example's training test: own_model on
    emulated speeds, 2 DataLoader processes a rank, its checkpoint loading into its model.
    The other examples train in tests/test_examples.py, on the session's Ray."""
    import torch

    from examples.own_model import make_model
    from hetero_ray.runs.checkpoints import latest_checkpoint_dir

    example = "own_model"
    flags = ["--num-workers", "2", "--global-batch-size", "48", "--epochs", "2", "--emulate-speeds", "1,0.5",
             "--storage-path", str(tmp_path / "runs"), "--name", example, "--num-samples", "200"]
    submit = _ray_cli(script_cluster, "job", "submit", "--address", script_cluster["dashboard"],
                      "--working-dir", REPO_ROOT, "--", "python", f"examples/{example}.py", *flags,
                      timeout_s=JOB_TIMEOUT_S)
    assert submit.returncode == 0, submit.stdout[-5000:] + submit.stderr[-3000:]
    run_dir = tmp_path / "runs" / example
    assert f"run files: {run_dir}" in submit.stdout and "final metrics: {" in submit.stdout, submit.stdout[-3000:]
    assert "'epoch': 1" in submit.stdout and "'global_steps': 10" in submit.stdout, submit.stdout[-3000:]
    with open(run_dir / "summary.json") as f:
        summary = json.load(f)
    assert summary["status"] == "finished", summary
    assert summary["global_steps"] == 10  # 2 epochs of ceil(200 / 48) = 5 steps
    state = torch.load(os.path.join(latest_checkpoint_dir(str(run_dir)), "state.pt"), weights_only=True)
    assert_loads(make_model(), state["model"])
