"""A GPU check anyone with a GPU can run: one command, one table, every log in one folder.

    python benchmarks/gpu_check.py                      # or: make gpu-check
    python3 benchmarks/gpu_check.py --log-dir /tmp/gpu-check --quick --deadline-s 600

The GPU machine needs what a training node needs: Ray, torch with CUDA and the project's
``requirements.txt`` installed (``make setup``, or the GPU image), or, on a machine without
network, a prebuilt bundle of them you built elsewhere and activated first.

On this machine it starts two Ray nodes, as a mixed cluster has them: one labelled
``hetero-ray.io/device=gpu`` holding the GPUs, one labelled ``cpu`` that sees none
(``CUDA_VISIBLE_DEVICES=``). Then, each stage in its own process under its own time limit,
its output in ``LOG_DIR/<stage>.log``:

1. ``nvml``: the NVML inventory of every GPU, and its sampling while the GPU works;
2. ``profile``: ``hetero-ray profile --model M`` over both nodes, and ``hetero-ray plan`` on
   the profile: each device's curve and its largest error at the probed batch sizes;
3. ``train-*``: the built-in job on the GPU alone, and on the GPU + CPU ranks under
   ``optimal`` and ``static`` (steady samples/s each, and the ratio to the GPU alone; the
   final shares, the ranks left out, and rank 0's mean step with and without its pauses);
   the best subset of ranks as :func:`~hetero_ray.planning.subset.solve_subset_split`
   predicts it from the profile's curves and the all-reduce measured in those runs;
4. ``precision-*``: the built-in job on the GPU + 2 CPU ranks with uneven shares and a plan
   change, in fp32, bf16 and fp16 (GradScaler): each step's loss over the global batch in
   bf16 and fp16 against fp32; and the GPU alone in bf16 (samples/s against fp32);
5. ``api``: ``examples/own_model.py`` (HeteroTrainer, a BatchNorm CNN) on the GPU, 2 steps;
6. ``nccl``: two GPU ranks over NCCL, where there are two GPUs or more;
7. ``ray-data``: the GPU rank fed by a ``map_batches`` pipeline on the CPU-only node (and
   anywhere) against its own DataLoader doing the same CPU-heavy transform
   (``benchmarks/bench_ray_data.py --gpu``): samples/s of each and the ratios;
8. ``lightning`` (where the ``lightning`` extra is installed): ``examples/lightning_module.py``
   on the GPU in 32-true and 16-mixed (a real GradScaler), and on the GPU + a CPU rank in
   16-mixed: each run's final logged loss.

A stage that fails or runs out of time is a row of the table, not the end of the check.
Exit status: 0 when every stage passed, 1 when one did not, 2 when there is no GPU (or no
Ray) here — with what to do about it. ``LOG_DIR.tar.gz`` packs the folder at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from typing import Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

NO_GPU_EXIT_CODE = 2
FAILED_EXIT_CODE = 1
DEVICE_LABEL = "hetero-ray.io/device"
RAY_PORT = 6399  # not Ray's default 6379, so a Ray cluster already running here is left alone
PASSED, FAILED, SKIPPED = "ok", "FAILED", "skipped"
PRECISION_STEPS = 50
STAGES = ("profile", "train", "precision", "api", "nccl", "ray-data", "lightning")
# When the whole check must end (time.monotonic()), from --deadline-s: time on a GPU machine is
# often short, and a table of what ran beats a killed check with none.
_deadline: Optional[float] = None
HEADERS = ["stage", "check", "value", "vs GPU alone", "status"]


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    stage: str
    check: str
    value: str = ""
    ratio: Optional[float] = None  # to the GPU alone's samples/s
    status: str = PASSED


# ---------------------------------------------------------------------------- pure: the table
def format_check_table(rows: Sequence[Row]) -> str:
    """The one table the check prints."""
    from hetero_ray.formatting import format_table

    return format_table(HEADERS, [[r.stage, r.check, r.value, "" if r.ratio is None else f"{r.ratio:.2f}×", r.status]
                                  for r in rows])


def exit_code(rows: Sequence[Row]) -> int:
    return FAILED_EXIT_CODE if any(r.status == FAILED for r in rows) else 0


def curve_rows(plan: dict) -> list[Row]:
    """Each probed device's curve and its largest error, from ``hetero-ray plan --json``."""
    rows = []
    for d in plan.get("devices", []):
        name = f"{d['kind']}{d.get('index') or 0} {d.get('name') or ''}".strip()
        curve = (f"{d['shape']}: max({d['floor_s'] * 1e3:.3g} ms, {d['alpha_s'] * 1e3:.3g} ms + "
                 f"{d['beta_s_per_sample'] * 1e3:.3g} ms·b)")
        error = d.get("max_rel_error")
        sizes = ",".join(str(p["batch_size"]) for p in d.get("probe", []))
        rows.append(Row("profile", f"curve {name} (b = {sizes})",
                        f"{curve}; max error {error:.1%}" if error is not None else curve,
                        status=PASSED if error is not None and error <= 0.10 else FAILED))
    return rows


def throughput_rows(samples_per_s: dict[str, Optional[float]], gpu_alone: str = "GPU alone",
                    plans: Optional[dict[str, str]] = None) -> list[Row]:
    """Steady samples/s of each run, and its ratio to the GPU alone (None: the run failed);
    ``plans``: each run's final plan in words (:func:`plan_text`), said beside its figure."""
    base = samples_per_s.get(gpu_alone)
    rows = []
    for name, value in samples_per_s.items():
        ok = value is not None and value > 0
        ratio = value / base if ok and base else None
        text = f"{value:,.0f} samples/s" if ok else "no result"
        if ok and (plans or {}).get(name):
            text += f"; {plans[name]}"
        rows.append(Row("train", name, text, ratio, PASSED if ok else FAILED))
    return rows


PAUSE_S = 0.1  # a step this much longer than a millisecond step is a pause: a checkpoint, a collection


def step_text(steps) -> str:
    """Rank 0's mean step over the run's second half, by wall clock, and the same without
    its pauses: a few pauses inside a short run of millisecond steps can halve the steady
    rate, and which it was (a slower plan, or a pause) is the question."""
    if steps is None or len(steps) == 0:
        return ""
    ends = steps[steps["rank"] == 0].sort_values("global_step")["wall_time"]
    gaps = ends.iloc[len(ends) // 2:].diff().dropna()
    if len(gaps) == 0:
        return ""
    steady = gaps[gaps < PAUSE_S]
    text = f"mean step {gaps.mean() * 1e3:.2f} ms"
    if len(steady) < len(gaps):
        text += (f", {steady.mean() * 1e3:.2f} ms without its {len(gaps) - len(steady)} "
                 f"pause{'s' if len(gaps) - len(steady) > 1 else ''} over {PAUSE_S * 1e3:.0f} ms")
    return text


def plan_text(summary: dict) -> str:
    """A run's final shares, the ranks it left out and how often its plan changed, from its
    summary.json: whether a slower group was kept or left out is the point of the GPU runs."""
    shares = summary.get("final_plan") or []
    if len(shares) < 2:
        return ""
    out = summary.get("left_out_ranks") or []
    text = f"final shares {'/'.join(str(s) for s in shares)}"
    text += f", ranks {','.join(str(r) for r in out)} out" if out else ", no rank out"
    return f"{text}, {summary.get('plan_changes', 0)} plan changes"


def comm_time_s(steps) -> Optional[float]:
    """The all-reduce a step of several ranks costs: per global step the least wait of the
    ranks in (the slowest of them waits only for the communication; a rank left out waits
    for none), median over the steps with two ranks in or more."""
    if steps is None or len(steps) == 0:
        return None
    steps = steps[steps["local_batch_size"] > 0]
    grouped = steps.groupby("global_step")
    per_step = grouped["wait_time_s"].min()[grouped["rank"].nunique() >= 2]
    return float(per_step.median()) if len(per_step) else None


def best_subset_row(plan: dict, global_batch_size: int, comm_s: Optional[float],
                    measured: dict[str, Optional[float]], gpu_alone: str = "GPU alone") -> Row:
    """The group of ranks ``solve_subset_split`` predicts fastest from the profile's curves,
    with ``c(G) = comm_s`` for two ranks or more (0 alone), beside the best run measured."""
    from hetero_ray.planning.subset import solve_subset_split

    workers = plan.get("workers", [])
    devices = {(d["node_id"], d["kind"], d.get("index") or 0): d for d in plan.get("devices", [])}
    curves = [devices.get((w["node_id"], w["kind"], w.get("index") or 0)) for w in workers]
    if not workers or any(c is None for c in curves) or comm_s is None:
        return Row("subset", "best subset (predicted)", "needs the profile's curves and a measured all-reduce",
                   status=SKIPPED)
    split = solve_subset_split([c["alpha_s"] for c in curves], [c["beta_s_per_sample"] for c in curves],
                               global_batch_size, lambda group: 0.0 if len(group) == 1 else comm_s,
                               caps=[c.get("max_batch_size") for c in curves], floors=[c["floor_s"] for c in curves])
    group = ",".join(f"{workers[r]['kind']}{r}" for r in split.group)
    predicted = global_batch_size / split.predicted_step_time_s
    best_name, best = max(((k, v) for k, v in measured.items() if v), key=lambda kv: kv[1], default=(None, None))
    base = measured.get(gpu_alone)
    value = (f"ranks {group}: {predicted:,.0f} samples/s predicted (all-reduce {comm_s * 1e3:.2f} ms); "
             f"best measured: {best_name or 'none'}")
    return Row("subset", "best subset vs measured", value, best / base if best and base else None,
               PASSED if best else FAILED)


# bf16 keeps 8 bits of mantissa (relative rounding 2^-8 ≈ 0.4 %): a loss of ~1 drifting
# through 50 steps of rounded forward passes stays within a few hundredths (tests/test_precision.py).
LOSS_TOLERANCE = 0.05


def step_losses(steps):
    """The loss of each global step over the whole global batch: Σ b_i·loss_i / B."""
    if steps is None or len(steps) == 0:
        return None
    steps = steps[steps["local_batch_size"] > 0]
    weighted = (steps["loss"] * steps["local_batch_size"]).groupby(steps["global_step"]).sum()
    return (weighted / steps.groupby("global_step")["local_batch_size"].sum()).sort_index()


def precision_rows(losses: dict, compared: Sequence[str] = ("bf16", "fp16")) -> list[Row]:
    """bf16 and fp16 against fp32, step by step (same seed, same shares, same plan change)."""
    fp32 = losses.get("fp32")
    rows = []
    for name in compared:
        other = losses.get(name)
        if fp32 is None or other is None or len(other) != len(fp32):
            rows.append(Row("precision", f"{name} vs fp32 loss, GPU + 2 CPU", "no comparable run", status=FAILED))
            continue
        gap = float((other - fp32).abs().max())
        moved = float(fp32.iloc[0] - fp32.iloc[-1])
        ok = gap < LOSS_TOLERANCE and moved > 0 and not other.equals(fp32)
        rows.append(Row("precision", f"{name} vs fp32 loss, GPU + 2 CPU, {len(fp32)} steps",
                        f"max |Δloss| {gap:.4f} (tolerance {LOSS_TOLERANCE}); fp32 loss fell by {moved:.3f}",
                        status=PASSED if ok else FAILED))
    return rows


# ---------------------------------------------------------------------------- the machine
def no_gpu_reason() -> Optional[str]:
    """Why this machine cannot run the check (with what to do), or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed here; install the project (make setup) or use the GPU image"
    if not torch.cuda.is_available():
        return ("no CUDA GPU on this machine (torch.cuda.is_available() is False); run the check on a machine "
                "with an NVIDIA GPU and its driver")
    try:
        import ray  # noqa: F401
    except ImportError:
        return ("Ray is not installed here: install the project's requirements (make setup, or "
                "pip install -r requirements.txt), or on a GPU machine without network activate a prebuilt "
                "bundle of them first")
    return None


def _python_env(address: Optional[str] = None, **extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p),
               PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
    if address:
        env["RAY_ADDRESS"] = address
    env.update(extra)
    return env


def _ray_command(*args: str) -> list[str]:
    """`ray …` through this Python (the GPU image's Ray is on PYTHONPATH, not on PATH)."""
    return [sys.executable, "-c", "import sys; sys.argv[0] = 'ray'; from ray.scripts.scripts import main; "
                                  "sys.exit(main())", *args]


def _hetero_ray(*args: str) -> list[str]:
    return [sys.executable, "-m", "hetero_ray.cli.main", *args]


class Cluster:
    """Two `ray start --block` nodes: the GPUs (label gpu) and CPU-only ranks (label cpu)."""

    def __init__(self, log_dir: str, num_gpus: int, gpu_node_cpus: int, cpu_node_cpus: int, port: int = RAY_PORT):
        self.address = f"127.0.0.1:{port}"
        # `ray start` turns token authentication on where a token file exists (an earlier
        # Ray's): then the check itself and every stage it runs must present it.
        if os.path.exists(os.path.expanduser("~/.ray/auth_token")):
            os.environ["RAY_AUTH_MODE"] = "token"
        self._temp = tempfile.mkdtemp(prefix="gpuchk")
        self._processes = []
        common = ["start", "--block", "--disable-usage-stats", f"--temp-dir={self._temp}"]
        # The dashboard where Ray has its packages (ray[default]): Ray Train's placement-group
        # cleaner finds each run's controller through it; without it every run's end waits 12 s.
        self._start(log_dir, "ray_gpu_node", [*common, "--head", f"--port={port}", f"--num-cpus={gpu_node_cpus}",
                                              f"--num-gpus={num_gpus}", f"--labels={DEVICE_LABEL}=gpu"], {})
        time.sleep(5)  # the head listens before a node may join
        # The CPU node sees no GPU, as a CPU-only machine.
        self._start(log_dir, "ray_cpu_node", [*common, f"--address={self.address}", f"--num-cpus={cpu_node_cpus}",
                                              "--num-gpus=0", f"--labels={DEVICE_LABEL}=cpu"],
                    {"CUDA_VISIBLE_DEVICES": ""})

    def _start(self, log_dir: str, name: str, args: list[str], env: dict) -> None:
        with open(os.path.join(log_dir, f"{name}.log"), "w") as log:
            self._processes.append(subprocess.Popen(_ray_command(*args), env=_python_env(**env), stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True))

    def wait_for_nodes(self, timeout_s: float) -> None:
        import ray

        deadline = time.monotonic() + timeout_s
        ray.init(address=self.address, logging_level="ERROR")
        try:
            while sum(n["Alive"] for n in ray.nodes()) < 2:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the two Ray nodes did not both start within {timeout_s:.0f} s "
                                       "(see ray_gpu_node.log and ray_cpu_node.log)")
                time.sleep(1)
        finally:
            ray.shutdown()

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                os.killpg(process.pid, 15)
        for process in self._processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
        shutil.rmtree(self._temp, ignore_errors=True)


def run_stage(name: str, command: list[str], log_dir: str, timeout_s: float, env: dict) -> Optional[str]:
    """Runs one stage's process, its output in ``LOG_DIR/<name>.log``; None when it passed,
    else why not (its exit status, or the time limit)."""
    if _deadline is not None:
        left = _deadline - time.monotonic()
        if left < 5:
            print(f"[gpu-check] {name}: not run, --deadline-s reached", flush=True)
            return "not run: the check's --deadline-s was reached"
        timeout_s = min(timeout_s, left)
    print(f"[gpu-check] {name}: {' '.join(command[1:])[:160]}", flush=True)
    with open(os.path.join(log_dir, f"{name}.log"), "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            return f"over its {timeout_s:.0f} s limit (see {name}.log)"
    return None if code == 0 else f"exit status {code} (see {name}.log)"


# ---------------------------------------------------------------------------- the stages
def nvml_rows(sample_s: float = 3.0) -> list[Row]:
    """NVML's inventory of every GPU, and its readings while GPU 0 multiplies matrices."""
    import torch

    from hetero_ray.profiling.gpu import NvmlGpuReader
    from hetero_ray.profiling.inventory import gpu_inventory

    reader = NvmlGpuReader()
    if reader.device_count() == 0:
        return [Row("nvml", "inventory", reader.unavailable_reason or "no GPU", status=FAILED)]
    rows = []
    for gpu in gpu_inventory(reader):
        memory = gpu.get("memory_total_bytes")
        rows.append(Row("nvml", f"inventory gpu{gpu['index']}",
                        f"{gpu.get('name')}, {memory / 2**30:.0f} GiB, {gpu.get('sm_count')} SMs, "
                        f"cc {gpu.get('compute_capability')}" if memory else str(gpu.get("error")),
                        status=FAILED if gpu.get("error") else PASSED))
    a = torch.randn(4096, 4096, device="cuda:0")
    samples, deadline = [], time.monotonic() + sample_s
    while time.monotonic() < deadline:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        samples.append(reader.sample(reader.index_for_torch_device(0)))
    busiest = max((s.get("gpu_util") or 0 for s in samples), default=0)
    power = max((s.get("gpu_power_w") or 0 for s in samples), default=0)
    rows.append(Row("nvml", "sampling gpu0 under a matmul load",
                    f"{len(samples)} readings, utilisation up to {busiest:.0f} %, power up to {power:.0f} W",
                    status=PASSED if busiest > 0 else FAILED))
    return rows


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _steps(path: str):
    import pandas as pd

    return pd.read_parquet(path) if os.path.exists(path) else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log-dir", default=os.path.join("runs", time.strftime("gpu-check-%Y%m%d-%H%M%S")),
                   help="every stage's log and output goes here (packed into LOG_DIR.tar.gz at the end)")
    p.add_argument("--model", default="simple_cnn", help="built-in model to profile and train (default simple_cnn)")
    p.add_argument("--global-batch-size", "--batch-size", dest="batch_size", type=int, default=512, help="global batch of the training runs (default 512)")
    p.add_argument("--steps", type=int, default=60, help="global steps per training run (default 60)")
    p.add_argument("--cpu-workers", type=int, default=3, help="CPU ranks beside the GPU (default 3)")
    p.add_argument("--cpus-per-worker", type=int, default=3, help="cores per rank (default 3)")
    p.add_argument("--stage-timeout-s", type=float, default=300, help="time limit of each stage (default 300 s)")
    p.add_argument("--stages", default=",".join(STAGES),
                   help=f"which stages to run, of {','.join(STAGES)} (default all; nvml always runs)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="end the whole check after this many seconds: later stages become 'not run' rows "
                        "and the table is still written (default: no deadline)")
    p.add_argument("--quick", action="store_true",
                   help="for a few minutes of GPU time: no bf16 run of the GPU alone, precision in fp32 and "
                        "bf16 only")
    p.add_argument("--profile-each-run", action="store_true",
                   help="let each training run profile the nodes again before its first step (default: the "
                        "profile stage measured them; the runs compare steady throughput)")
    args = p.parse_args(argv)
    args.stages = set(args.stages.split(","))
    if args.stages - set(STAGES):
        p.error(f"--stages: unknown {', '.join(sorted(args.stages - set(STAGES)))}; choose from {', '.join(STAGES)}")
    global _deadline
    _deadline = None if args.deadline_s is None else time.monotonic() + args.deadline_s

    reason = no_gpu_reason()
    if reason is not None:
        print(f"gpu-check: {reason}. Nothing was run.", file=sys.stderr)
        return NO_GPU_EXIT_CODE
    import torch

    num_gpus = torch.cuda.device_count()
    log_dir = os.path.abspath(args.log_dir)
    os.makedirs(log_dir, exist_ok=True)
    rows: list[Row] = []
    try:
        rows += nvml_rows()
    except Exception as e:  # noqa: BLE001 - a row, not the end of the check
        rows.append(Row("nvml", "inventory and sampling", f"{type(e).__name__}: {e}", status=FAILED))

    gpu_node_cpus = args.cpus_per_worker * num_gpus + 1
    cpu_node_cpus = max(args.cpus_per_worker * args.cpu_workers, (os.cpu_count() or 2) - gpu_node_cpus)
    cluster = Cluster(log_dir, num_gpus, gpu_node_cpus, cpu_node_cpus)
    try:
        cluster.wait_for_nodes(args.stage_timeout_s)
        rows += _cluster_stages(args, cluster.address, log_dir, num_gpus)
    except Exception as e:  # noqa: BLE001 - say it in the table, stop the nodes
        rows.append(Row("cluster", "two Ray nodes (gpu, cpu)", f"{type(e).__name__}: {e}", status=FAILED))
    finally:
        cluster.stop()

    table = format_check_table(rows)
    with open(os.path.join(log_dir, "table.txt"), "w") as f:
        f.write(table + "\n")
    with tarfile.open(f"{log_dir}.tar.gz", "w:gz") as archive:
        archive.add(log_dir, arcname=os.path.basename(log_dir))
    print(f"\n{table}\n\nlogs: {log_dir} (packed: {log_dir}.tar.gz)")
    return exit_code(rows)


def _cluster_stages(args, address: str, log_dir: str, num_gpus: int) -> list[Row]:
    env = _python_env(address)
    limit = args.stage_timeout_s
    rows: list[Row] = []
    nodes_json, plan_json = os.path.join(log_dir, "nodes.json"), os.path.join(log_dir, "plan.json")
    cpu_ranks = ",".join(["cpu"] * args.cpu_workers)
    if "profile" in args.stages:
        failed = run_stage("profile", _hetero_ray("profile", "--address", address, "--model", args.model,
                                                  "--cpus-per-worker", str(args.cpus_per_worker), "--json",
                                                  nodes_json), log_dir, limit, env)
        if failed is None:
            failed = run_stage("plan", _hetero_ray(
                "plan", "--profile", nodes_json, "--global-batch-size", str(args.batch_size),
                "--workers", f"gpu,cpu*{args.cpu_workers}", "--json", plan_json), log_dir, limit, env)
        rows += curve_rows(_read_json(plan_json) or {}) if failed is None else [
            Row("profile", "profile and curves", failed, status=FAILED)]
    plan = _read_json(plan_json) or {}
    # Before the training runs: the newest stages first, where --deadline-s cuts the check short.
    if "ray-data" in args.stages:
        rows += _ray_data_rows(args, env, log_dir, limit)
    if "lightning" in args.stages:
        rows += _lightning_rows(env, log_dir, limit)

    runs = {"GPU alone": ("gpu", "optimal", "fp32"),
            f"GPU + {args.cpu_workers} CPU, optimal": (f"gpu,{cpu_ranks}", "optimal", "fp32"),
            f"GPU + {args.cpu_workers} CPU, static": (f"gpu,{cpu_ranks}", "static", "fp32"),
            "GPU alone, bf16": ("gpu", "optimal", "bf16")}
    if args.quick:
        del runs["GPU alone, bf16"]
    measured: dict[str, Optional[float]] = {}
    plans: dict[str, str] = {}
    comm_s = None
    profile_flag = [] if args.profile_each_run else ["--no-profile"]
    for i, (name, (devices, policy, precision)) in enumerate(runs.items() if "train" in args.stages else ()):
        experiment = f"train-{i}-{policy}-{len(devices.split(','))}w-{precision}"
        failed = run_stage(experiment, _hetero_ray(
            "train", "--address", address, "--model", args.model, "--dataset", "synthetic_image",
            "--global-batch-size", str(args.batch_size), "--num-samples", str(args.batch_size * args.steps),
            "--eval-samples", str(args.batch_size), "--epochs", "1", "--worker-devices", devices,
            "--num-workers", str(len(devices.split(","))), "--cpus-per-worker", str(args.cpus_per_worker),
            "--policy", policy, "--precision", precision, *profile_flag,
            # A checkpoint is a barrier of every rank: on a GPU whose step takes milliseconds
            # one inside the measured half of the run would outweigh its steps.
            "--checkpoint-every", str(args.steps), "--storage-path", os.path.join(log_dir, "runs"),
            "--name", experiment), log_dir, limit, env)
        run_dir = os.path.join(log_dir, "runs", experiment)
        summary = _read_json(os.path.join(run_dir, "summary.json")) or {}
        measured[name] = summary.get("steady_samples_per_s") if failed is None else None
        steps = _steps(os.path.join(run_dir, "steps.parquet"))
        plans[name] = "; ".join(t for t in (plan_text(summary), step_text(steps)) if t)
        if comm_s is None and "," in devices and failed is None:
            comm_s = comm_time_s(steps)
    if "train" in args.stages:
        rows += throughput_rows(measured, plans=plans)
        rows.append(best_subset_row(plan, args.batch_size, comm_s, measured))
    if "precision" in args.stages:
        rows += precision_rows(_precision_losses(args, env, log_dir, limit), _precisions(args)[1:])
    if "api" not in args.stages:
        return rows
    api_dir = os.path.join(log_dir, "api")
    failed = run_stage("api", [sys.executable, os.path.join(REPO_ROOT, "examples", "own_model.py"),
                               "--worker-devices", "gpu", "--num-workers", "1", "--global-batch-size", "96",
                               "--num-samples", "192", "--epochs", "1", "--loader-workers", "0",
                               "--storage-path", api_dir, "--name", "gpu-check-api"], log_dir, limit, env)
    steps = _steps(os.path.join(api_dir, "gpu-check-api", "steps.parquet")) if failed is None else None
    on_cuda = steps is not None and len(steps) == 2 and steps["h2d_time_s"].notna().all()
    rows.append(Row("api", "HeteroTrainer, BatchNorm CNN on cuda, 2 steps",
                    failed or (f"{len(steps)} steps, host→device copies timed" if on_cuda else
                               "ran, but not 2 steps on CUDA (see api.log)"),
                    status=PASSED if on_cuda else FAILED))

    if "nccl" not in args.stages:
        return rows
    if num_gpus < 2:
        rows.append(Row("nccl", "2 GPU ranks over NCCL", f"{num_gpus} GPU here: needs 2 or more", status=SKIPPED))
    else:
        failed = run_stage("nccl", _hetero_ray(
            "train", "--address", address, "--model", args.model, "--global-batch-size", str(args.batch_size),
            "--num-samples", str(args.batch_size * 10), "--epochs", "1", "--use-gpu", "yes", "--backend", "nccl",
            "--num-workers", "2", "--cpus-per-worker", "1", "--storage-path", os.path.join(log_dir, "runs"),
            "--name", "nccl"), log_dir, limit, env)
        summary = _read_json(os.path.join(log_dir, "runs", "nccl", "summary.json")) or {}
        value = summary.get("steady_samples_per_s")
        rows.append(Row("nccl", "2 GPU ranks over NCCL", failed or f"{value or 0:,.0f} samples/s",
                        status=PASSED if failed is None else FAILED))
    return rows


RAY_DATA_TRANSFORM_MS = 0.5  # per row: an augmentation's cost, enough to make one GPU rank input-bound


def _ray_data_rows(args, env: dict, log_dir: str, limit: float) -> list[Row]:
    """A GPU rank fed by Ray Data on the CPU-only node's cores, against its own DataLoader."""
    out = os.path.join(log_dir, "ray_data.json")
    failed = run_stage("ray-data", [sys.executable, os.path.join(REPO_ROOT, "benchmarks", "bench_ray_data.py"), "--gpu",
                                    "--json", out, "--num-rows", "32768", "--epochs", "2", "--global-batch-size", "512",
                                    "--transform-ms", str(RAY_DATA_TRANSFORM_MS),
                                    "--loader-workers", str(args.cpus_per_worker)], log_dir, limit, env)
    figures = (_read_json(out) or {}).get("samples_per_s", {}) if failed is None else {}
    if not figures:
        return [Row("ray-data", "GPU rank fed by Ray Data vs its own DataLoader", failed or "no figures",
                    status=FAILED)]
    own = next(iter(figures.values()))
    return [Row("ray-data", label, f"{value:,.0f} samples/s ({RAY_DATA_TRANSFORM_MS} ms CPU work a row)"
                + ("" if i == 0 else f"; {value / own:.2f}× the own DataLoader"))
            for i, (label, value) in enumerate(figures.items())]


LIGHTNING_RUNS = {"GPU, 32-true": ("gpu", "32-true"), "GPU, 16-mixed": ("gpu", "16-mixed"),
                  "GPU + CPU, 16-mixed": ("gpu,cpu", "16-mixed")}


def _lightning_rows(env: dict, log_dir: str, limit: float) -> list[Row]:
    """examples/lightning_module.py on CUDA: the final logged loss of each precision."""
    import importlib.util

    if importlib.util.find_spec("lightning") is None:
        return [Row("lightning", "Lightning bridge on CUDA", "the lightning extra is not installed here "
                    "(pip install '.[lightning]')", status=SKIPPED)]
    rows = []
    for i, (label, (devices, precision)) in enumerate(LIGHTNING_RUNS.items()):
        name = f"lightning-{i}"
        storage = os.path.join(log_dir, "runs")
        failed = run_stage(name, [sys.executable, os.path.join(REPO_ROOT, "examples", "lightning_module.py"),
                                  "--worker-devices", devices, "--precision", precision, "--epochs", "2",
                                  "--storage-path", storage, "--name", name], log_dir, limit, env)
        loss = _last_metric(os.path.join(storage, name), ("loss_epoch", "loss")) if failed is None else None
        rows.append(Row("lightning", label, failed or (f"final epoch loss {loss:.4f}" if loss is not None
                                                       else "ran, no loss reported"),
                        status=PASSED if loss is not None else FAILED))
    return rows


def _last_metric(run_dir: str, keys: Sequence[str]) -> Optional[float]:
    """The last reported value of the first of ``keys`` a report holds."""
    import pandas as pd

    path = os.path.join(run_dir, "reports.parquet")
    if not os.path.exists(path):
        return None
    for metrics in pd.read_parquet(path).sort_values("global_step")["metrics"].iloc[::-1]:
        reported = json.loads(metrics)
        for key in keys:
            if reported.get(key) is not None:
                return float(reported[key])
    return None


def _precisions(args) -> tuple[str, ...]:
    return ("fp32", "bf16") if args.quick else ("fp32", "bf16", "fp16")


def _precision_losses(args, env: dict, log_dir: str, limit: float) -> dict:
    """Each precision's per-step loss on the GPU + 2 CPU ranks: uneven shares and a plan change
    at step 20, the same seed, so the runs differ only in precision."""
    losses = {}
    for precision in _precisions(args):
        experiment = f"precision-{precision}"
        failed = run_stage(experiment, _hetero_ray(
            "train", "--model", "mlp", "--num-samples", "960", "--eval-samples", "48", "--global-batch-size", "48",
            "--epochs", "3", "--max-steps", str(PRECISION_STEPS), "--seed", "5", "--lr", "0.05",
            "--worker-devices", "gpu,cpu,cpu", "--num-workers", "3", "--cpus-per-worker", "2",
            "--policy", "static", "--batch-split", "26,14,8", "--plan-changes", "20:8,16,24", "--no-profile",
            "--precision", precision, "--storage-path", os.path.join(log_dir, "runs"), "--name", experiment),
            log_dir, limit, env)
        if failed is None:
            losses[precision] = step_losses(_steps(os.path.join(log_dir, "runs", experiment, "steps.parquet")))
    return losses


if __name__ == "__main__":
    sys.exit(main())
