"""Spine benchmark: hetero_ray's cost against plain Ray Train, and what shares recover.

1. Same machine, same model/data/global batch, homogeneous workers: steady samples/s of
   ``hetero-ray train --policy static`` and of a plain Ray Train loop; ratio (target ≥ 0.97).
2. Emulated speeds 1,0.5: ``--policy proportional`` over ``--policy static`` (≈ 1.5×
   expected: the fast rank stops waiting for the slow one).

Steady samples/s = global batch × steps in the second half / wall time of that half, so
start-up (Ray Train launching workers) is not counted for either side. The data set is
made large enough that no epoch ends (evaluation, checkpoint) inside the measured steps:
the comparison is of training steps, which is what the plain loop does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script

from hetero_ray.formatting import format_table  # noqa: E402


def steady_rate(step_end_times: list[float], global_batch_size: int) -> float:
    mid = len(step_end_times) // 2
    span = step_end_times[-1] - step_end_times[mid - 1]
    return global_batch_size * (len(step_end_times) - mid) / span


def run_hetero(output_dir: str, name: str, *, model: str, num_samples: int, batch_size: int,
               steps: int, num_workers: int, policy: str, emulate_speeds: Optional[list[float]]) -> float:
    from hetero_ray.builtin.config import TrainConfig
    from hetero_ray.builtin.driver import run_training

    config = TrainConfig(
        model=model, dataset="synthetic_image", num_samples=num_samples, global_batch_size=batch_size,
        epochs=1000, max_steps=steps, num_workers=num_workers, policy=policy,
        emulate_speeds=emulate_speeds, checkpoint_every=10 * steps, storage_path=output_dir,
        name=name, max_failures=0,
    )
    result = run_training(config, emit=lambda line: None)
    return result.summary["steady_samples_per_s"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="simple_cnn")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--num-samples", type=int, help="default: enough for all steps in one epoch")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved plain/hetero_ray rounds (median)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    args.num_samples = args.num_samples or args.batch_size * (args.steps + 1)

    import ray

    from benchmarks.plain_ray_train import run_plain
    from hetero_ray.runtime.cluster import connect

    connect(None, local_num_cpus=max(4, os.cpu_count() or 1), timeout_s=30)
    figures: dict = {"plain_runs": [], "hetero_static_runs": []}
    with tempfile.TemporaryDirectory(prefix="hetero_ray_bench_") as workdir:
        common = dict(model=args.model, num_samples=args.num_samples, batch_size=args.batch_size, steps=args.steps)
        # Interleaved rounds: a shared 2-core machine drifts by ±10 % between runs, and
        # alternating the two sides keeps that drift out of the ratio.
        for round_index in range(args.rounds):
            print(f"[bench] round {round_index + 1}/{args.rounds}: plain Ray Train ({args.model}, global batch "
                  f"{args.batch_size}, 2 workers, {args.steps} steps)…", flush=True)
            plain_times = run_plain(args.model, "synthetic_image", args.num_samples, args.batch_size, args.steps,
                                    2, 0.05, 0, os.path.join(workdir, f"plain{round_index}.json"))
            figures["plain_runs"].append(steady_rate(plain_times, args.batch_size))
            print(f"[bench] round {round_index + 1}/{args.rounds}: hetero_ray --policy static, same settings…", flush=True)
            figures["hetero_static_runs"].append(run_hetero(workdir, f"static{round_index}", num_workers=2,
                                                            policy="static", emulate_speeds=None, **common))
        figures["plain_samples_per_s"] = statistics.median(figures["plain_runs"])
        figures["hetero_static_samples_per_s"] = statistics.median(figures["hetero_static_runs"])
        # Each round's pair ran back to back; the median of the pair ratios is the figure.
        figures["round_ratios"] = [h / p for h, p in zip(figures["hetero_static_runs"], figures["plain_runs"])]
        print("[bench] emulated speeds 1,0.5: --policy static…", flush=True)
        figures["emulated_static_samples_per_s"] = run_hetero(workdir, "emu-static", num_workers=2, policy="static",
                                                              emulate_speeds=[1.0, 0.5], **common)
        print("[bench] emulated speeds 1,0.5: --policy proportional…", flush=True)
        figures["emulated_proportional_samples_per_s"] = run_hetero(
            workdir, "emu-proportional", num_workers=2, policy="proportional", emulate_speeds=[1.0, 0.5], **common)
    ray.shutdown()

    figures["overhead_ratio"] = statistics.median(figures["round_ratios"])
    figures["proportional_over_static"] = (figures["emulated_proportional_samples_per_s"]
                                           / figures["emulated_static_samples_per_s"])
    print()
    print("plain Ray Train runs (samples/s):", ", ".join(f"{r:.0f}" for r in figures["plain_runs"]))
    print("hetero_ray static runs (samples/s):", ", ".join(f"{r:.0f}" for r in figures["hetero_static_runs"]))
    print("per-round ratios:", ", ".join(f"{r:.3f}" for r in figures["round_ratios"]))
    print(format_table(
        ["comparison", "samples/s", "baseline samples/s", "ratio", "target"],
        [["hetero_ray static vs plain Ray Train", f"{figures['hetero_static_samples_per_s']:.0f}",
          f"{figures['plain_samples_per_s']:.0f}", f"{figures['overhead_ratio']:.3f}", "≥ 0.97"],
         ["speeds 1,0.5: proportional vs static", f"{figures['emulated_proportional_samples_per_s']:.0f}",
          f"{figures['emulated_static_samples_per_s']:.0f}", f"{figures['proportional_over_static']:.3f}", "≈ 1.5"]],
    ))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
