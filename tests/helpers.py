"""Builders shared by several test modules: run directories and step tables as a training
run leaves them, and the capability records the profiler writes.

Helpers live here, not in a test module, so that no test module imports another.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import signal
import socket
import sys

import numpy as np
import pandas as pd

from hetero_ray.metrics.store import MetricsStore
from hetero_ray.planning.estimates import Estimates, RankEstimate
from hetero_ray.profiling.capability import CpuInfo, DeviceCapability, NodeCapability
from hetero_ray.runs import run_files
from hetero_ray.runs.records import DATA_LOADER_SOURCE, STEP_COLUMNS


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_loads(model, weights: dict) -> None:
    """``weights`` load strictly into ``model`` (every key, every shape) and change it: a
    checkpoint that fits the model and holds what training made."""
    import torch

    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(weights)  # strict: every key, every shape
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items()), "the checkpoint changed nothing"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (a gloo group's rendezvous, a server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_gloo_ranks(work, world_size: int, *args) -> list:
    """``work(rank, world_size, *args)`` on every rank of one real gloo group, a process
    each; returns what each rank's call returned, in rank order. ``work`` must be a
    module-level function (the ranks are spawned processes, which import it).

    Each rank sees the environment Ray Train gives a worker (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: Accelerate reads them) and one torch thread
    (the ranks share the machine's cores). A rank that raises ends the run with its
    traceback; the others are stopped.
    """
    import tempfile

    import torch
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="gloo_ranks_") as out_dir:
        mp.spawn(_gloo_rank, args=(work, world_size, free_port(), out_dir, args), nprocs=world_size, join=True)
        return [torch.load(os.path.join(out_dir, f"rank{rank}.pt"), weights_only=False) for rank in range(world_size)]


def _gloo_rank(rank: int, work, world_size: int, port: int, out_dir: str, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        result = work(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        # Every rank done before any tears the group down: rank 0, which hosts the group's
        # store, once aborted in its teardown while a peer was still connected (SIGABRT,
        # "terminate called without an active exception"). Not in `finally`: a rank that
        # raised would leave the others waiting here.
        dist.barrier()
    finally:
        dist.destroy_process_group()


# ---- profiles -----------------------------------------------------------------------------

# A real profile: resnet18 on an H100, probed at 8…64 (tests/data).
H100_PROFILE = os.path.join(REPO_ROOT, "tests", "data", "h100_resnet18_nodes.json")


def h100_document() -> dict:
    return json.loads(open(H100_PROFILE).read())


def with_cpu_probe(document: dict, beta_s_per_sample: float = 5e-4) -> dict:
    """The H100 profile with its node's CPU probed as a line (what the real run lacked)."""
    document = copy.deepcopy(document)
    cpu = next(d for d in document["nodes"][0]["devices"] if d["kind"] == "cpu")
    cpu.update(alpha_s=0.001, beta_s_per_sample=beta_s_per_sample, floor_s=0.0, fit_shape="line",
               max_batch_size=4000, probe=[{"batch_size": b, "busy_time_s": 0.001 + beta_s_per_sample * b}
                                           for b in (8, 16, 32, 64)])
    return document


# ---- planning and the records --------------------------------------------------------------

def estimates_for(alphas, betas, sizes, fresh=None, rel_se=0.0) -> "Estimates":
    """A policy's snapshot of ranks on lines ``α + β·b`` at these shares, each fitted from 20 steps."""
    n = len(alphas)
    fresh = [True] * n if fresh is None else fresh
    rows = [
        RankEstimate(rank=r, alpha_s=alphas[r], beta_s_per_sample=betas[r],
                     samples_per_s=sizes[r] / (alphas[r] + betas[r] * sizes[r]), num_points=20, last_step=99,
                     fresh=fresh[r], local_batch_size=sizes[r], busy_time_s=alphas[r] + betas[r] * sizes[r],
                     busy_time_rel_se=rel_se, num_batch_sizes=1, num_rejected=0, slope_fitted=True)
        for r in range(n)
    ]
    return Estimates.from_rank_estimates(rows, global_step=100)


def step_rows(cluster, step: int, plan: dict, attempt: int) -> list[dict]:
    """The planner's rows of one step of a simulated cluster (planning/simulation.py) under ``plan``."""
    sizes = plan["local_batch_sizes"]
    return [{"rank": r, "global_step": step, "local_batch_size": b, "busy_time_s": float(t),
             "plan_version": plan["version"], "attempt": attempt}
            for r, (b, t) in enumerate(zip(sizes, cluster.busy_times_s(sizes, step)))]


def step_row(global_step: int, rank: int, attempt: int = 0, batch: int = 8, busy: float = 0.01,
             step_time: float = 0.02, wall: float = None) -> dict:
    """A metrics-store row of one rank's step, every timing column present."""
    row = {c: 0.0 for c in STEP_COLUMNS if c.endswith("_s")}
    row.update(epoch=0, step=global_step, global_step=global_step, rank=rank, node_id=f"node{rank}",
               attempt=attempt, local_batch_size=batch, global_batch_size=2 * batch, plan_version=0,
               busy_time_s=busy, step_time_s=step_time, wait_time_s=step_time - busy, loss=1.0, lr=0.1,
               wall_time=1000.0 + global_step * step_time if wall is None else wall)
    return row


# ---- runs ---------------------------------------------------------------------------------

# The built-in job that uneven, balanced and bf16 runs on several ranks are held to
# (conftest's one_worker_run trains it once on one worker): 3 epochs of ceil(600 / 48) = 13
# steps, the last a short window of 24.
ONE_DEVICE_JOB = dict(model="mlp", num_samples=600, global_batch_size=48, epochs=3, seed=5, lr=0.1)

# A policy of a user's own, as a CLI user writes it: a file `--policy-module` imports.
USER_POLICY_MODULE = "my_policies"
USER_POLICY_SOURCE = '''
from hetero_ray.planning import Plan, StaticPolicy, register_policy


@register_policy
class BackLoadedPolicy(StaticPolicy):
    """The last rank holds half the global batch, the others share the rest; never changes."""

    name = "back_loaded"

    def initial_plan(self, global_batch_size, num_workers, capacities=None, caps=None):
        self._check_room(global_batch_size, num_workers)
        last = global_batch_size // 2 if num_workers > 1 else global_batch_size
        rest, others = global_batch_size - last, max(num_workers - 1, 1)
        first = [rest // others + (r < rest % others) for r in range(num_workers - 1)]
        return Plan(0, (*first, last), "back_loaded: half on the last rank")
'''


def user_policy_file(folder, monkeypatch) -> str:
    """The user's policy file written to ``folder``; the registry and the module cache are
    restored after the test (``monkeypatch``), so no other test sees ``back_loaded``."""
    from hetero_ray.planning import policies

    monkeypatch.setattr(policies, "_REGISTERED", dict(policies._REGISTERED))
    # Absent now and after the test: the set records it absent, the delete empties it for this test.
    monkeypatch.setitem(sys.modules, USER_POLICY_MODULE, None)
    monkeypatch.delitem(sys.modules, USER_POLICY_MODULE)
    path = os.path.join(str(folder), f"{USER_POLICY_MODULE}.py")
    with open(path, "w") as f:
        f.write(USER_POLICY_SOURCE)
    return path


def make_steps(num_steps: int = 20, batches=(6, 2), busy=(0.06, 0.04), first_step: int = 0,
               attempt: int = 0, start_wall: float = 1000.0, gpu: bool = False) -> pd.DataFrame:
    """Step rows of a small run: rank i has local batch ``batches[i]`` and busy time ``busy[i]``."""
    rows = []
    for g in range(first_step, first_step + num_steps):
        step_time = max(busy) + 0.01
        for rank, (b, t) in enumerate(zip(batches, busy)):
            row = {c: np.nan for c in STEP_COLUMNS}
            row.update(epoch=g // 10, step=g % 10, global_step=g, rank=rank, node_id=f"node-{rank}", attempt=attempt,
                       local_batch_size=b, global_batch_size=sum(batches), plan_version=0,
                       data_source=DATA_LOADER_SOURCE, data_time_s=0.001,
                       forward_time_s=t / 3, backward_time_s=t * 2 / 3 - 0.001, pad_time_s=0.0,
                       optimizer_time_s=0.002, busy_time_s=t, wait_time_s=step_time - t - 0.002,
                       step_time_s=step_time, loss=2.0 - g * 0.01, lr=0.1,
                       wall_time=start_wall + (g + 1) * step_time, probe_batch_size=0)
            if gpu:
                row.update(gpu_util=50.0 + rank, gpu_mem_used_bytes=2e9, gpu_mem_peak_bytes=3e9,
                           gpu_mem_total_bytes=16e9, gpu_temp_c=60.0, gpu_power_w=150.0)
            rows.append(row)
    return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


def write_run(run_dir, num_steps: int = 40, policy: str = "static", batches=(6, 2), busy=(0.06, 0.04),
              finish: bool = True, decisions: bool = False, reason: str = "initial plan") -> str:
    """A run directory written by the real writer (MetricsStore), like a training run leaves it."""
    run_dir = str(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    run_files.write_json(os.path.join(run_dir, run_files.CONFIG_FILE), {
        "name": os.path.basename(run_dir), "policy": policy, "num_workers": len(batches),
        "global_batch_size": sum(batches), "epochs": num_steps // 10, "num_samples": 10 * sum(batches),
        "dataset": "synthetic_image", "model": "mlp"})
    store = MetricsStore(run_dir, os.path.basename(run_dir), parquet_flush_interval_s=3600)
    store.begin_attempt(0, num_workers=len(batches))
    store.add_plan({"plan_version": 0, "first_global_step": 0, "epoch": 0, "step": 0, "attempt": 0,
                    "num_workers": len(batches), "global_batch_size": sum(batches),
                    "local_batch_sizes": list(batches), "reason": reason, "wall_time": 1000.0})
    steps = make_steps(num_steps, batches, busy)
    store.add(steps=steps.to_dict("records"))
    for epoch in range(num_steps // 10):
        store.add_epoch({"epoch": epoch, "global_step": epoch * 10 + 9, "attempt": 0, "train_loss": 2 - epoch * 0.1,
                         "eval_loss": 2.1 - epoch * 0.1, "eval_metric": 0.3 + 0.1 * epoch, "eval_metric_name": "accuracy",
                         "samples": 10 * sum(batches), "epoch_time_s": 1.0, "samples_per_s": 100.0,
                         "wall_time": 1000.0 + (epoch + 1) * 10 * 0.07})
    if decisions:
        for g in range(10, num_steps, 10):
            store.add_decision({"global_step": g, "policy": policy, "adopted": g == 20, "reason": reason,
                                "plan_version": 0, "local_batch_sizes": list(batches), "predicted_step_time_s": 0.06,
                                "current_predicted_step_time_s": 0.07, "predicted_gain": 0.14,
                                "achieved_step_time_s": 0.068, "wall_time": 1000.0 + g * 0.07})
    if finish:
        store.finalize()
        run_files.write_json(os.path.join(run_dir, run_files.SUMMARY_FILE), {
            "experiment_name": os.path.basename(run_dir), "status": "finished", "steady_samples_per_s": 110.0})
    else:
        store.flush()
    return run_dir


# ---- capability records ---------------------------------------------------------------------

def cpu_device(alpha=0.002, beta=0.001, cap=4000, **kw) -> DeviceCapability:
    return DeviceCapability(kind="cpu", name="Intel Xeon", matmul_tflops_fp32=0.15, memory_bandwidth_gbps=12.0,
                            alpha_s=alpha, beta_s_per_sample=beta, fit_r2=0.99, max_batch_size=cap,
                            max_batch_size_method="ram-fraction",
                            probe=[{"batch_size": 8, "busy_time_s": alpha + 8 * beta}], **kw)


def gpu_device(index, alpha=0.001, beta=0.0001, cap=2048) -> DeviceCapability:
    return DeviceCapability(kind="gpu", name="NVIDIA A100-SXM4-40GB", index=index, matmul_tflops_fp32=19.1,
                            matmul_tflops_bf16=280.0, memory_bandwidth_gbps=1400.0, h2d_gbps=24.0,
                            memory_total_bytes=40 * 1024**3, sm_count=108, compute_capability="8.0",
                            alpha_s=alpha, beta_s_per_sample=beta, fit_r2=0.999, max_batch_size=cap,
                            max_batch_size_method="oom-search")


def node(node_id, devices, **kw) -> NodeCapability:
    return NodeCapability(node_id=node_id, ip="10.0.0.1", hostname="h", resources={"CPU": 2.0},
                          labels={"zone": "a"}, cpu=CpuInfo("Intel Xeon", 2, 4, 24 * 1024**3), devices=devices,
                          profile_time_s=4.2, **kw)


class FakeClocks:
    """Wall and work clocks a test advances by hand, in place of the ``time`` module of the
    emulators; ``sleep`` moves the wall clock only."""

    def __init__(self, wall: float = 100.0, work: float = 7.0):
        self.wall = wall
        self.work = work
        self.slept: list[float] = []

    def perf_counter(self) -> float:
        return self.wall

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.wall += seconds

    def compute(self, seconds: float) -> None:
        self.wall += seconds
        self.work += seconds

    def preempted(self, seconds: float) -> None:
        self.wall += seconds  # another process had the core: time passes, no work is done


def printed_resume_command(output: str) -> list[str]:
    """The command a stopped ``hetero-ray train`` printed after "Continue it with:"."""
    lines = output.splitlines()
    marker = next(i for i, line in enumerate(lines) if line.endswith("Continue it with:"))
    return shlex.split(lines[marker + 1])


def assert_stopped_run(output: str, returncode: int, args: list[str], run_dir: str, signum: int,
                       total_steps: int) -> list[int]:
    """What a stopped ``hetero-ray train`` leaves (tests/test_interrupted_runs.py's module
    docstring); returns the steps recorded."""
    assert returncode == 128 + signum, output[-3000:]
    name = signal.Signals(signum).name
    assert f"hetero-ray train: interrupted by {name}" in output, output[-3000:]
    assert printed_resume_command(output) == ["python", "-m", "hetero_ray", *args, "--resume"]
    with open(os.path.join(run_dir, run_files.SUMMARY_FILE)) as f:
        summary = json.load(f)
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == name, summary
    steps = run_files.read_table(run_dir, "steps")
    recorded = sorted(steps["global_step"].unique())
    assert recorded == list(range(len(recorded))) and 0 < len(recorded) < total_steps, recorded
    assert summary["global_steps"] == len(recorded)
    assert not os.path.exists(os.path.join(run_dir, run_files.MODEL_FILE)), "a stopped run has no final model"
    return recorded


def built_in_job_trainer(monkeypatch, tmp_path, name: str, *flags: str):
    """`hetero-ray train --model mlp FLAGS` built as the driver builds it, not run (no Ray):
    the TorchTrainer HeteroTrainer would run, and the settings each worker gets."""
    import hetero_ray.trainer
    from hetero_ray.builtin.driver import _device_mode, builtin_trainer
    from hetero_ray.cli.main import build_parser
    from hetero_ray.cli.train import config_from_args
    from hetero_ray.runs import storage

    monkeypatch.delenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", raising=False)  # the driver sets it
    worker_settings: dict = {}
    real_call_for = hetero_ray.trainer.call_for
    monkeypatch.setattr(hetero_ray.trainer, "call_for",
                        lambda loop, settings: worker_settings.update(settings) or real_call_for(loop, settings))
    config = config_from_args(build_parser().parse_args(
        ["train", "--model", "mlp", "--storage-path", str(tmp_path), "--name", name, *flags]))
    # Without --worker-devices the driver asks the running cluster for GPUs; no Ray runs here.
    device_mode = _device_mode(config) if config.worker_devices is not None else "cpu"
    trainer = builtin_trainer(config, device_mode)._torch_trainer(storage.resolve(str(tmp_path), name, None),
                                                                  device_mode, first_plan_wait_s=0.0)
    return trainer, worker_settings
