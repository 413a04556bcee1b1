"""Benchmark: what keeping freed memory (:mod:`hetero_ray.training.rank.allocator`) gains per
training step on the CPU.

Each side runs in a fresh process (the setting is process-wide and cannot be undone):
``simple_cnn`` training steps at a few batch sizes on one thread, as one CPU worker runs
them, with glibc's default thresholds and with hetero_ray's. Rounds alternate the two
sides so that a shared machine's drift stays out of the ratio. Per side: the median CPU
time per step, the minor page faults per step, the step-to-step coefficient of variation
(synchronous ranks wait for the unluckiest one, so jitter costs throughput) and the
process's peak RSS.

    python benchmarks/allocator.py [--batch-sizes 64,192] [--steps 60] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script

from hetero_ray.formatting import format_table  # noqa: E402

SIDES = ("glibc default", "hetero_ray")
_WARMUP_STEPS = 10


def measure_steps(model: str, batch_size: int, steps: int) -> dict:
    """In this process: per-step CPU time and page faults of ``steps`` training steps."""
    import torch

    from hetero_ray.builtin.data import random_batch, spec_for
    from hetero_ray.builtin.models import build_model, compute_loss

    torch.set_num_threads(1)
    spec = spec_for(model)
    torch.manual_seed(0)
    net = build_model(model, spec)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    inputs, targets = random_batch(spec, batch_size)
    cpu_s, faults = [], []
    for step in range(_WARMUP_STEPS + steps):
        faults0, cpu0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt, time.thread_time()
        compute_loss(net(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= _WARMUP_STEPS:
            cpu_s.append(time.thread_time() - cpu0)
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults0)
    return {"median_cpu_s": statistics.median(cpu_s),
            "cv": statistics.pstdev(cpu_s) / statistics.mean(cpu_s),
            "faults_per_step": statistics.median(faults),
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _child(side: str, model: str, batch_size: int, steps: int) -> None:
    if side == SIDES[1]:
        from hetero_ray.training.rank.allocator import keep_freed_memory

        if not keep_freed_memory():
            raise SystemExit("this platform has no glibc mallopt: nothing to compare")
    print(json.dumps(measure_steps(model, batch_size, steps)))


def _run_side(side: str, model: str, batch_size: int, steps: int) -> dict:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", side, "--model", model,
                           "--batch-sizes", str(batch_size), "--steps", str(steps)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {side} side failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="simple_cnn")
    parser.add_argument("--batch-sizes", default="64,192", help="comma-separated (default 64,192)")
    parser.add_argument("--steps", type=int, default=60, help="measured steps per process (default 60)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per batch size (default 3)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        batch_sizes = []
    if not batch_sizes or min(batch_sizes) < 1 or args.steps < 1 or args.rounds < 1:
        parser.error(f"--batch-sizes wants positive integers like 64,192 (got {args.batch_sizes!r}); "
                     "--steps and --rounds at least 1")
    if args.child:
        _child(args.child, args.model, batch_sizes[0], args.steps)
        return 0

    figures, rows = [], []
    for batch_size in batch_sizes:
        runs = {side: [] for side in SIDES}
        for round_index in range(args.rounds):
            order = SIDES if round_index % 2 == 0 else SIDES[::-1]
            for side in order:
                print(f"[bench] {args.model} batch {batch_size}, round {round_index + 1}/{args.rounds}: {side}…",
                      flush=True)
                runs[side].append(_run_side(side, args.model, batch_size, args.steps))
        summary = {side: {key: statistics.median(run[key] for run in runs[side]) for key in runs[side][0]}
                   for side in SIDES}
        default, kept = summary[SIDES[0]], summary[SIDES[1]]
        ratio = kept["median_cpu_s"] / default["median_cpu_s"]
        figures.append({"batch_size": batch_size, "runs": runs, "summary": summary, "step_time_ratio": ratio})
        for side in SIDES:
            s = summary[side]
            rows.append([batch_size, side, f"{s['median_cpu_s'] * 1e3:.1f}", f"{s['faults_per_step']:.0f}",
                         f"{s['cv']:.3f}", f"{s['max_rss_mib']:.0f}", f"{ratio:.3f}" if side == SIDES[1] else ""])
    print()
    print(format_table(["batch", "allocator", "CPU ms/step", "page faults/step", "step CV", "peak RSS MiB",
                        "step time vs default"], rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "steps": args.steps, "batch_sizes": figures}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
