"""``hetero-ray bench``: static, proportional, dynamic and optimal on the same job, against the ideal.

The harness is not part of the installed package: it lives in the repository's
``benchmarks/`` folder (with the other benchmarks), and this command runs it from the
checkout hetero_ray was installed from (``pip install -e .``, as ``make setup`` does).
An installed wheel has no checkout beside it, and the command says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from hetero_ray.cli.args import float_list, speed_change
from hetero_ray.config import POLICIES
from hetero_ray.errors import ConfigError, UserError

# The checkout this package was installed from (pip install -e .): it holds benchmarks/.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELP = "compare the policies on the same short training against the ideal (Σ of the devices' own throughput)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="Ray cluster to run on (default: RAY_ADDRESS or a local Ray)")
    parser.add_argument("--model", default="simple_cnn", help="(default %(default)s)")
    parser.add_argument("--emulate-speeds", type=float_list, default=[1.0, 1.0, 0.5, 0.25],
                        help="per-rank emulated speed (default 1,1,0.5,0.25); 'none' for real devices only")
    parser.add_argument("--no-emulation", action="store_true", help="real devices only (a real heterogeneous cluster)")
    parser.add_argument("--num-workers", type=int, help="default: one per emulated speed")
    parser.add_argument("--batch-size", type=int, default=192, help="global batch (default %(default)s)")
    parser.add_argument("--steps", type=int, default=160, help="steps per policy (default %(default)s)")
    parser.add_argument("--rebalance-interval", type=int, default=20, help="(default %(default)s)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated (default %(default)s)")
    parser.add_argument("--speed-change", type=speed_change, metavar="STEP:RANK:SPEED",
                        help="also run optimal with this emulated slowdown mid-run (adaptation)")
    parser.add_argument("--homogeneous-check", action="store_true",
                        help="also run optimal without emulation and count plan changes (thrashing)")
    parser.add_argument("--cold-start", action="store_true",
                        help="also run optimal from equal shares without profiling, against the profiled run")
    parser.add_argument("--plain-anchor", action="store_true",
                        help="also run plain Ray Train (TorchTrainer, equal shares, same model and global batch) "
                             "and print each policy ÷ it")
    parser.add_argument("--output-dir", help="where the bench's runs go (default runs/bench-<time>)")
    parser.add_argument("--json", help="write the figures to this file")


def harness():
    """The ``benchmarks.balance`` module of the checkout this package was installed from.

    Raises:
        UserError: hetero_ray runs from an installed wheel, without the repository.
    """
    if not os.path.isfile(os.path.join(REPO_ROOT, "benchmarks", "balance.py")):
        raise UserError("hetero-ray bench runs the harness in the repository's benchmarks/ folder, which an "
                        "installed hetero-ray does not include: clone the repository and run it from there "
                        "(make setup; .venv/bin/hetero-ray bench, or python jobs/bench_balance.py)")
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
    from benchmarks import balance

    return balance


def run(args: argparse.Namespace) -> int:
    if args.no_emulation:
        args.emulate_speeds = None
    args.num_workers = args.num_workers or (len(args.emulate_speeds) if args.emulate_speeds else 2)
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in args.policies if p not in POLICIES]
    if unknown or not args.policies:
        raise ConfigError(f"--policies must be a comma-separated subset of {', '.join(POLICIES)}; got {unknown}")
    if args.emulate_speeds and len(args.emulate_speeds) != args.num_workers:
        raise ConfigError(f"--emulate-speeds has {len(args.emulate_speeds)} values but --num-workers is {args.num_workers}")
    if args.speed_change and args.speed_change["rank"] >= args.num_workers:
        raise ConfigError(f"--speed-change rank {args.speed_change['rank']} does not exist with {args.num_workers} workers")
    for flag, value in (("--batch-size", args.batch_size), ("--steps", args.steps),
                        ("--rebalance-interval", args.rebalance_interval)):
        if value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")
    if args.batch_size < args.num_workers:
        raise ConfigError(f"--batch-size {args.batch_size} is smaller than the {args.num_workers} workers")
    bench = harness()  # after the flags are checked: bad input fails without the repository too
    result = bench.run_bench(args)
    bench.print_result(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
        print(f"figures: {args.json}")
    return 0
