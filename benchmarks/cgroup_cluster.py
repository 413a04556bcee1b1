"""The balancer on a real, unannounced straggler: a two-node Ray cluster on this machine
where one node's processes are capped by a cgroup to a third of a core.

    sudo-capable Linux with the cgroup v1 cpu controller; runs the policies' benchmark (benchmarks/balance.py) on it:
    python benchmarks/cgroup_cluster.py [--quota 0.33] [--steps 160] [--no-plain-anchor] [--json out.json]

Each node offers one CPU, so each holds one training worker. Nothing tells hetero_ray
which node is slow: profiling and the balancer must find out.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.local_cluster import (  # noqa: E402
    cgroup_unusable_reason, free_port, set_cpu_quota, start_node, stop_nodes, wait_for_nodes,
)
from benchmarks.balance import main as bench_main  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quota", type=float, default=0.33, help="cores the slow node may use (default %(default)s)")
    parser.add_argument("--period-ms", type=float, default=100.0,
                        help="CFS period over which the quota holds (default %(default)s, the kernel's; "
                             "10 spreads the cap evenly over a step)")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--policies", default="static,optimal")
    parser.add_argument("--cold-start", action="store_true",
                        help="also run optimal from equal shares without profiling (needs optimal in --policies)")
    parser.add_argument("--no-plain-anchor", action="store_true",
                        help="leave out the plain Ray Train run (saves a third of the time)")
    parser.add_argument("--json")
    args = parser.parse_args()
    reason = cgroup_unusable_reason()
    if reason:
        print(f"cannot build the capped cluster here: {reason}", file=sys.stderr)
        return 2
    log_dir = tempfile.mkdtemp(prefix="hetero_ray_cgroup_bench_")
    port = free_port()
    address = f"127.0.0.1:{port}"
    nodes = []
    try:
        nodes.append(start_node(port=port, num_cpus=1, log_dir=log_dir))
        nodes.append(start_node(address=address, num_cpus=1, cpu_quota=args.quota, log_dir=log_dir))
        wait_for_nodes(address, 2, nodes)
        set_cpu_quota(nodes[1], args.quota, period_us=int(args.period_ms * 1000))
        print(f"[bench] cluster at {address}: head (1 CPU) + a node capped at {args.quota} core "
              f"per {args.period_ms:g} ms", flush=True)
        argv = ["--address", address, "--no-emulation", "--num-workers", "2", "--steps", str(args.steps),
                "--batch-size", str(args.batch_size), "--policies", args.policies,
                "--output-dir", os.path.join(log_dir, "runs")] + ([] if args.no_plain_anchor else ["--plain-anchor"])
        if args.json:
            argv += ["--json", args.json]
        if args.cold_start:
            argv.append("--cold-start")
        return bench_main(argv)
    finally:
        import ray  # not at the top: hetero_ray sets the auth mode before Ray is first imported

        ray.shutdown()  # before its nodes go: a driver left connected to a dead cluster exits 1
        stop_nodes(nodes)


if __name__ == "__main__":
    sys.exit(main())
