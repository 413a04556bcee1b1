"""Benchmark: what the in-training profiler costs per step (target: ratio ≤ 1.02).

Two ways to measure, both interleaving "profiling on" and "profiling off" rounds so that
the drift of a shared machine (±10 % between minutes on 2 cores) stays out of the ratio:

- default, a real run: the same short ``hetero-ray train`` twice per round, with
  ``profile_interval=10`` and ``profile_interval=0``; the figure is the median over
  rounds of (steady samples/s off) / (steady samples/s on) = step-time ratio on/off.
  Needs ``TrainConfig.profile_interval``.
- ``--in-process``: the training step alone (model forward, backward, optimiser step on
  this process's CPU), in alternating blocks with and without a
  :class:`~hetero_ray.training.timing.resource_sampler.ResourceSampler` at the same interval;
  the figure is the median block step time on / off. No Ray, ~20 s.

    python benchmarks/profiler_overhead.py [--rounds 3] [--steps 150] [--json out.json]
    python benchmarks/profiler_overhead.py --in-process [--blocks 30] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script

from hetero_ray.formatting import format_table  # noqa: E402

PROFILE_INTERVAL = 10  # steps between readings: the default the loop runs with
TARGET_RATIO = 1.02


def run_with_interval(output_dir: str, name: str, profile_interval: int, *, model: str, batch_size: int,
                      steps: int, num_workers: int) -> float:
    """Steady samples/s of one short training run with the in-training profiler at ``profile_interval``."""
    from hetero_ray.builtin.config import TrainConfig
    from hetero_ray.builtin.driver import run_training

    config = TrainConfig(
        model=model, dataset="synthetic_image", num_samples=batch_size * (steps + 1), global_batch_size=batch_size,
        epochs=1000, max_steps=steps, num_workers=num_workers, policy="static",
        checkpoint_every=10 * steps, storage_path=output_dir, name=name, max_failures=0,
        profile_interval=profile_interval, profile=False,  # node profiling happens before step 0 either way
    )
    result = run_training(config, emit=lambda line: None)
    return result.summary["steady_samples_per_s"]


def in_process_ratio(model: str, batch_size: int, blocks: int, steps_per_block: int,
                     interval: int = PROFILE_INTERVAL) -> dict:
    """Median step time with a sampler over without, alternating blocks of steps."""
    import torch

    from hetero_ray.builtin.data import random_batch, spec_for
    from hetero_ray.builtin.models import build_model, compute_loss
    from hetero_ray.training.timing.resource_sampler import ResourceSampler

    torch.set_num_threads(1)  # one worker's share on this machine
    spec = spec_for(model)
    torch.manual_seed(0)
    net = build_model(model, spec)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    inputs, targets = random_batch(spec, batch_size)
    device = torch.device("cpu")
    sampler = ResourceSampler(device, interval_steps=interval)
    step = 0

    def train_step(with_sampler: bool) -> float:
        nonlocal step
        start = time.perf_counter()
        loss = compute_loss(net(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        row = {"loss": float(loss.detach())}
        if with_sampler:
            row.update(sampler.maybe_sample(step))
        step += 1
        return time.perf_counter() - start

    for _ in range(steps_per_block):  # warm-up
        train_step(False)
    on: list[float] = []
    off: list[float] = []
    block_ratios = []
    for block in range(blocks):
        order = (True, False) if block % 2 == 0 else (False, True)  # ABBA: no side always goes first
        medians = {}
        for side in order:
            times = [train_step(side) for _ in range(steps_per_block)]
            (on if side else off).extend(times)
            medians[side] = statistics.median(times)
        block_ratios.append(medians[True] / medians[False])
    # The direct cost, immune to a noisy machine: what the step pays (maybe_sample) plus,
    # as an upper bound, the whole background reading amortised over its interval (it
    # runs in another thread, mostly outside the GIL, so the step pays less than that).
    calls = 2000
    sampler.maybe_sample(step)  # due now at the latest; then not again for `interval` steps
    t0 = time.perf_counter()
    for _ in range(calls):
        sampler.maybe_sample(step)  # the step's common path: not due, copy the latest readings
    call_s = (time.perf_counter() - t0) / calls
    t0 = time.perf_counter()
    for _ in range(200):
        sampler.sample_now()
    read_s = (time.perf_counter() - t0) / 200
    sampler.close()
    step_off = statistics.median(off)
    return {"mode": "in-process", "model": model, "batch_size": batch_size, "profile_interval": interval,
            "blocks": blocks, "steps_per_block": steps_per_block, "samples_taken": sampler.samples_taken,
            "step_time_on_s": statistics.median(on), "step_time_off_s": step_off,
            "block_ratios": block_ratios,
            "overhead_ratio": statistics.median(on) / step_off,
            "maybe_sample_call_s": call_s, "reading_s": read_s,
            "direct_cost_ratio": 1.0 + (call_s + read_s / interval) / step_off}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="simple_cnn")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch (in-process: the one step's batch)")
    parser.add_argument("--steps", type=int, default=150, help="training steps per run (real runs)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved on/off rounds (median)")
    parser.add_argument("--in-process", action="store_true", help="time the training step alone, no Ray")
    parser.add_argument("--blocks", type=int, default=30, help="--in-process: alternating blocks")
    parser.add_argument("--steps-per-block", type=int, default=10, help="--in-process: steps per block")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    if args.in_process:
        print(f"[bench] in-process: {args.model}, batch {args.batch_size}, {args.blocks} alternating blocks of "
              f"{args.steps_per_block} steps, sampler every {PROFILE_INTERVAL} steps…", flush=True)
        figures = in_process_ratio(args.model, args.batch_size, args.blocks, args.steps_per_block)
        print("per-block ratios on/off:", ", ".join(f"{r:.3f}" for r in figures["block_ratios"]))
        print(f"maybe_sample: {figures['maybe_sample_call_s'] * 1e6:.1f} µs per step; one reading "
              f"(psutil): {figures['reading_s'] * 1e6:.0f} µs every {PROFILE_INTERVAL} steps")
        rows = [["median step time (ms), profiler on vs off", f"{figures['step_time_on_s'] * 1e3:.2f}",
                 f"{figures['step_time_off_s'] * 1e3:.2f}", f"{figures['overhead_ratio']:.4f}", f"≤ {TARGET_RATIO}"],
                ["direct cost bound: 1 + (call + reading/interval) / step", "", "",
                 f"{figures['direct_cost_ratio']:.5f}", f"≤ {TARGET_RATIO}"]]
    else:
        import ray

        from hetero_ray.runtime.cluster import connect

        connect(None, local_num_cpus=max(4, os.cpu_count() or 1), timeout_s=30)
        figures = {"mode": "training", "on_runs": [], "off_runs": []}
        with tempfile.TemporaryDirectory(prefix="hetero_ray_profbench_") as workdir:
            common = dict(model=args.model, batch_size=args.batch_size, steps=args.steps,
                          num_workers=args.num_workers)
            for r in range(args.rounds):
                # Alternate which side goes first, so neither always meets a warmer machine.
                sides = (PROFILE_INTERVAL, 0) if r % 2 == 0 else (0, PROFILE_INTERVAL)
                for interval in sides:
                    label = "on" if interval else "off"
                    print(f"[bench] round {r + 1}/{args.rounds}: profiling {label} "
                          f"(profile_interval={interval}, {args.steps} steps)…", flush=True)
                    rate = run_with_interval(workdir, f"prof-{label}-{r}", interval, **common)
                    figures[f"{label}_runs"].append(rate)
        ray.shutdown()
        figures["round_ratios"] = [off / on for on, off in zip(figures["on_runs"], figures["off_runs"])]
        figures["overhead_ratio"] = statistics.median(figures["round_ratios"])
        print("profiling on (samples/s):", ", ".join(f"{r:.0f}" for r in figures["on_runs"]))
        print("profiling off (samples/s):", ", ".join(f"{r:.0f}" for r in figures["off_runs"]))
        print("per-round step-time ratios on/off:", ", ".join(f"{r:.3f}" for r in figures["round_ratios"]))
        rows = [["step time, profiler on vs off (training)",
                 f"{statistics.median(figures['on_runs']):.0f} samples/s",
                 f"{statistics.median(figures['off_runs']):.0f} samples/s",
                 f"{figures['overhead_ratio']:.3f}", f"≤ {TARGET_RATIO}"]]
    print()
    print(format_table(["comparison", "on", "off", "ratio", "target"], rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
