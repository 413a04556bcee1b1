"""How long until the first training step: ``hetero-ray train`` against a plain ``TorchTrainer``.

Each side is a fresh command (its own Python, its own local Ray), timed from the moment
it is started until its first training step has finished:

- plain: a ``TorchTrainer`` running simple_cnn on in-memory synthetic images, equal
  shares, the same number of workers and global batch; rank 0 notes when its first
  optimiser step ends;
- hetero_ray: ``hetero-ray train`` with the same model, data, workers and batch, profiling
  on (the default); the first step's end is its row in ``steps.parquet``.

Rounds alternate which side goes first. For hetero_ray the run's files also say where
the time went: the run directory made (``config.json``), the nodes profiled
(``nodes.json``, written again when a later profile comes in: its last write), the worker
group registered (``attempts.json``), the first step.
Target: hetero_ray's first step no more than 3 s after plain's (medians of three rounds).

With ``--gpu-node`` the first node is labelled as a GPU machine (``hetero-ray.io/device=gpu``;
no GPU is needed: its worker trains on the CPU, as on any machine without CUDA) and the
others as CPU-only, and hetero_ray places its workers by those labels
(``--worker-devices gpu,…,cpu,…``): a cluster with GPUs, where the nodes with GPUs are
profiled before the first step and the CPU-only ones after the first plan. Plain Ray Train
runs the same workers on the same cluster. With ``--quota`` the last (CPU-only) node is
also short of CPU: its profile is the slow one.

    python benchmarks/bench_first_step.py [--rounds 3] [--num-workers 4] [--emulate-speeds 1,1,0.5,0.25]
    python benchmarks/bench_first_step.py --nodes 2 --num-workers 2 [--quota 0.33]   # on a two-node cluster
    python benchmarks/bench_first_step.py --nodes 2 --num-workers 2 --gpu-node [--quota 0.33]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL, BATCH = "simple_cnn", 96

PLAIN_SCRIPT = r"""
import json, os, sys, time
started = float(os.environ["BENCH_STARTED"])
import ray, ray.train, ray.train.torch, torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

def loop(config):
    from hetero_ray.builtin.data import load_dataset
    from hetero_ray.builtin.models import build_model, compute_loss
    context = ray.train.get_context()
    data = load_dataset("synthetic_image", num_samples=config["batch"] * 4, eval_samples=64, seed=0)
    model = ray.train.torch.prepare_model(build_model("simple_cnn", data.spec))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    local = config["batch"] // context.get_world_size()
    inputs, targets = data.train.batch(torch.arange(local))
    loss = compute_loss(model(inputs), targets)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    if context.get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump({"first_step_end": time.time()}, f)

if os.environ.get("RAY_ADDRESS"):  # --nodes: the bench's cluster
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
else:
    ray.init(num_cpus=max(os.cpu_count() or 1, int(sys.argv[1])), logging_level="ERROR", log_to_driver=False)
TorchTrainer(loop, train_loop_config={"batch": int(sys.argv[2]), "out": sys.argv[3]},
             scaling_config=ScalingConfig(num_workers=int(sys.argv[1])),
             run_config=RunConfig(name="first-step-plain", storage_path=sys.argv[4])).fit()
"""


def _env(started: float, address: str | None) -> dict:
    env = dict(os.environ, BENCH_STARTED=repr(started), PYTHONPATH=REPO)
    env.pop("RAY_ADDRESS", None)  # without --nodes each side starts its own local Ray
    if address:
        env["RAY_ADDRESS"] = address
        if os.path.exists(os.path.expanduser("~/.ray/auth_token")):  # as `ray start` found it
            env["RAY_AUTH_MODE"] = "token"
    return env


def plain(workdir: str, num_workers: int, address: str | None = None) -> float:
    out = os.path.join(workdir, "plain.json")
    started = time.time()
    subprocess.run([sys.executable, "-c", PLAIN_SCRIPT, str(num_workers), str(BATCH), out, workdir],
                   env=_env(started, address), check=True, capture_output=True, timeout=600)
    with open(out) as f:
        return json.load(f)["first_step_end"] - started


def hetero(workdir: str, num_workers: int, name: str, emulate_speeds: str | None,
           address: str | None = None, worker_devices: list[str] | None = None) -> dict:
    import pandas as pd

    cli = os.path.join(os.path.dirname(sys.executable), "hetero-ray")
    argv = [cli, "train", "--model", MODEL, "--dataset", "synthetic_image", "--num-samples", str(BATCH * 12),
            "--epochs", "1", "--global-batch-size", str(BATCH), "--num-workers", str(num_workers),
            "--storage-path", workdir, "--name", name]
    if emulate_speeds:
        argv += ["--emulate-speeds", emulate_speeds]
    if address:
        argv += ["--address", address]
    if worker_devices:
        argv += ["--worker-devices", ",".join(worker_devices)]
    started = time.time()
    subprocess.run(argv, env=_env(started, address), check=True, capture_output=True, timeout=600)
    run_dir = os.path.join(workdir, name)
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    first = float(steps[steps["global_step"] == 0]["wall_time"].max())  # the step ends with its slowest rank

    def at(file_name: str) -> float | None:
        path = os.path.join(run_dir, file_name)
        return os.path.getmtime(path) - started if os.path.exists(path) else None

    with open(os.path.join(run_dir, "attempts.json")) as f:
        attempt_started = json.load(f)[0].get("wall_time")
    plans = pd.read_parquet(os.path.join(run_dir, "plans.parquet")).sort_values("plan_version")
    return {"first_step_s": first - started, "run_dir_s": at("config.json"), "profiled_s": at("nodes.json"),
            "group_registered_s": None if attempt_started is None else attempt_started - started,
            "first_plan": f"{[int(b) for b in plans['local_batch_sizes'].iloc[0]]} ({plans['reason'].iloc[0]})"}


def _s(seconds) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)  # medians of three: one run moves with the machine
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--emulate-speeds", help="for hetero_ray, e.g. 1,1,0.5,0.25 (the demo's)")
    parser.add_argument("--nodes", type=int, default=1,
                        help="1: each side starts its own local Ray; more: both run on one cluster of this many "
                             "Ray nodes on this machine, the workers shared out evenly (default %(default)s)")
    parser.add_argument("--quota", type=float,
                        help="with --nodes: cap the last node at this many cores (cgroup v1; the cgroup bench's "
                             "straggler)")
    parser.add_argument("--gpu-node", action="store_true",
                        help="with --nodes: label the first node a GPU machine and the others CPU-only, and place "
                             "hetero_ray's workers by those labels (no GPU needed)")
    parser.add_argument("--json", help="also write the rounds and medians to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.num_workers < 1 or args.nodes < 1:
        parser.error("--rounds, --num-workers and --nodes must be ≥ 1")
    if args.num_workers % args.nodes:
        parser.error("--num-workers must be a multiple of --nodes (the same workers on every node)")
    if args.quota is not None and args.nodes < 2:
        parser.error("--quota caps one node of several: give --nodes 2 or more")
    if args.gpu_node and args.nodes < 2:
        parser.error("--gpu-node labels one node of several: give --nodes 2 or more")
    with contextlib.ExitStack() as stack:
        address = None
        if args.nodes > 1:
            address = stack.enter_context(_cluster(args.nodes, args.num_workers // args.nodes, args.quota,
                                                   args.gpu_node))
        return _rounds(args, address)


@contextlib.contextmanager
def _cluster(nodes: int, cpus: int, quota: float | None, gpu_node: bool = False):
    sys.path.insert(0, REPO)
    from benchmarks.local_cluster import cgroup_unusable_reason, local_cluster, set_cpu_quota

    if quota is not None and cgroup_unusable_reason():
        raise SystemExit(f"--quota: cannot cap a node here: {cgroup_unusable_reason()}")
    with tempfile.TemporaryDirectory(prefix="bench_first_step_nodes_") as log_dir, \
            (_labelled_cluster(log_dir, nodes, cpus, quota) if gpu_node else
             local_cluster(log_dir, [cpus] * (nodes - 1), head_cpus=cpus, cpu_quota_last=quota)) as (address, ray_nodes):
        if quota is not None:
            set_cpu_quota(ray_nodes[-1], quota)
        print(f"cluster at {address}: {nodes} Ray nodes of {cpus} CPU(s)"
              + (", the first labelled a GPU machine, the others CPU-only" if gpu_node else "")
              + (f", the last capped at {quota} core" if quota is not None else ""), flush=True)
        yield address


@contextlib.contextmanager
def _labelled_cluster(log_dir: str, nodes: int, cpus: int, quota: float | None):
    """As local_cluster, with the head labelled a GPU machine and the others CPU-only."""
    from benchmarks.local_cluster import free_port, start_node, stop_nodes, wait_for_nodes, wait_for_port
    from hetero_ray.constants import DEVICE_LABEL

    address = f"127.0.0.1:{free_port()}"
    ray_nodes = []
    try:
        ray_nodes.append(start_node(port=int(address.split(":")[1]), num_cpus=cpus, log_dir=log_dir,
                                    labels={DEVICE_LABEL: "gpu"}))
        wait_for_port(int(address.split(":")[1]), ray_nodes[0])  # the GCS must listen before workers join
        for i in range(nodes - 1):
            ray_nodes.append(start_node(address=address, num_cpus=cpus, log_dir=log_dir, labels={DEVICE_LABEL: "cpu"},
                                        cpu_quota=quota if i == nodes - 2 else None))
        wait_for_nodes(address, len(ray_nodes), ray_nodes)
        yield address, ray_nodes
    finally:
        stop_nodes(ray_nodes)


def _rounds(args, address: str | None) -> int:
    plain_s, hetero_runs = [], []
    per_node = args.num_workers // args.nodes
    devices = ["gpu"] * per_node + ["cpu"] * (args.num_workers - per_node) if args.gpu_node else None
    with tempfile.TemporaryDirectory(prefix="bench_first_step_") as workdir:
        for round_ in range(args.rounds):
            order = ("plain", "hetero") if round_ % 2 == 0 else ("hetero", "plain")
            for side in order:
                if side == "plain":
                    plain_s.append(plain(workdir, args.num_workers, address))
                    print(f"round {round_}: plain Ray Train first step after {plain_s[-1]:5.1f} s", flush=True)
                else:
                    run = hetero(workdir, args.num_workers, f"first-step-{round_}", args.emulate_speeds, address,
                                 devices)
                    hetero_runs.append(run)
                    print(f"round {round_}: hetero-ray train first step after {run['first_step_s']:5.1f} s "
                          f"(run dir {_s(run['run_dir_s'])}, nodes profiled {_s(run['profiled_s'])}, "
                          f"worker group registered {_s(run['group_registered_s'])}; first plan {run['first_plan']})",
                          flush=True)
    gaps = [h["first_step_s"] - p for h, p in zip(hetero_runs, plain_s)]
    where = f"{args.nodes} nodes" if args.nodes > 1 else "local Ray"
    if args.gpu_node:
        where += ", the first labelled GPU"
    plain_median = statistics.median(plain_s)
    hetero_median = statistics.median(h['first_step_s'] for h in hetero_runs)
    print(f"first step, {args.num_workers} workers ({where}), batch {BATCH}: plain median {plain_median:.1f} s, "
          f"hetero-ray train median {hetero_median:.1f} s (÷ {hetero_median / plain_median:.2f}, "
          f"{hetero_median - plain_median:+.1f} s; target ≤ +3 s); "
          f"hetero − plain per round {', '.join(f'{g:+.1f}' for g in gaps)} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"num_workers": args.num_workers, "where": where, "plain_s": plain_s,
                       "hetero_s": [h["first_step_s"] for h in hetero_runs], "gaps_s": gaps,
                       "plain_median_s": plain_median, "hetero_median_s": hetero_median,
                       "gap_of_medians_s": hetero_median - plain_median}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
