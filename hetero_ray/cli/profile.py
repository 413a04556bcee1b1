"""``hetero-ray profile``: measure every node of the cluster, print a table, optionally JSON.

    hetero-ray profile                                  # local Ray: this machine
    hetero-ray profile --address 10.0.0.5:6379 --model simple_cnn --json nodes.json
    ray job submit --working-dir . -- python jobs/profile_cluster.py --model resnet18 --json nodes.json

(In a Ray job, a relative --json lands under HETERO_RAY_JOB_OUTPUT_DIR or ~/hetero_ray, not in
Ray's temporary copy of the working dir; see jobs/job_paths.py.)

Figures are measured on each node by a profiler actor pinned there (matmul throughput,
memory bandwidth, host↔device copies; with ``--model`` the model's busy-time curve
``max(floor, α + β·b)``, its largest error at a probed size, and its largest batch), not looked up from a spec sheet. A node that fails (NVML error, timeout)
is reported as failed; the others complete. Exit status 1 only if every node failed.

The profile's flags are the settings of :class:`ProbeChoice` (which built-in model) and
:class:`ProfileConfig` (how to profile); each field declares its flag
(:func:`hetero_ray.flags.setting`). Only --address and --json, which say where to run and
where to write, are written out here.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from hetero_ray import flags
from hetero_ray.builtin.config import ProbeChoice
from hetero_ray.errors import UserError
from hetero_ray.profiling.profile_config import ProfileConfig

HELP = "measure each node's compute, memory bandwidth and (with --model) the model's per-sample cost"

ALL_FAILED_EXIT_CODE = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster to profile and the output file, around the model to probe and how."""
    parser.add_argument("--address", help="Ray cluster to profile (HOST:PORT, auto, ray://…); "
                                          "default RAY_ADDRESS or a local Ray on this machine")
    flags.add_flags(parser, ProbeChoice)
    flags.add_flags(parser, ProfileConfig)
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")


def config_from_args(args: argparse.Namespace) -> tuple[ProbeChoice, ProfileConfig]:
    """The built-in model to probe and how to profile, as the flags give them; raises
    ConfigError on bad values."""
    return (ProbeChoice(**flags.settings_from_args(args, ProbeChoice)),
            ProfileConfig(**flags.settings_from_args(args, ProfileConfig)))


def run(args: argparse.Namespace) -> int:
    choice, config = config_from_args(args)
    if args.json:
        _check_writable(args.json)

    from hetero_ray.builtin.recipe import builtin_recipe
    from hetero_ray.constants import CONNECT_TIMEOUT_S_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S, env_float
    from hetero_ray.profiling.capability import write_nodes_json
    from hetero_ray.runtime import cluster
    from hetero_ray.runtime.cluster_profiling import profile_cluster

    connection = cluster.connect(args.address, local_num_cpus=os.cpu_count() or 1,
                                 timeout_s=env_float(CONNECT_TIMEOUT_S_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S),
                                 include_dashboard=False)
    print(f"[profile] Ray: {'local cluster started' if connection.started_local else connection.address}",
          flush=True)
    # The profilers build the model from its recipe: the flags name a built-in one.
    recipe = builtin_recipe(choice.model, choice.dataset) if choice.model else None
    nodes = profile_cluster(dataclasses.replace(config, model=recipe), emit=lambda line: print(line, flush=True))
    print()
    print(profile_report(nodes, choice.model))
    if args.json:
        write_nodes_json(args.json, nodes, choice.model, config.batch_sizes)
        print(f"\nwritten: {os.path.abspath(args.json)}")
    if nodes and all(not node.ok for node in nodes):
        print("\nhetero-ray profile: every node failed to profile", flush=True)
        return ALL_FAILED_EXIT_CODE
    return 0


def profile_report(nodes, model=None) -> str:
    """The table (a row per node and device), node facts, and failures."""
    from hetero_ray.formatting import format_table

    rows = []
    for node in nodes:
        for device in node.devices:
            rows.append([
                node.node_id[:8], node.ip or "?", device.kind if device.kind == "cpu" else f"gpu{device.index}",
                _clip(device.name, 28), _num(device.matmul_tflops_fp32, ".3g"), _num(device.matmul_tflops_bf16, ".3g"),
                _num(device.memory_bandwidth_gbps, ".3g"), _num(device.h2d_gbps, ".3g"),
                _num(device.floor_s, ".2f", 1e3), _num(device.alpha_s, ".2f", 1e3),
                _num(device.beta_s_per_sample, ".3f", 1e3), _num(device.fit_max_rel_error, ".1%"),
                _num(device.max_batch_size, "d"),
            ])
    headers = ["node", "ip", "device", "name", "fp32 TFLOPS", "bf16 TFLOPS", "mem GB/s", "h2d GB/s"]
    headers += [f"{model} floor ms" if model else "floor ms", "α ms", "β ms/sample", "max err", "max batch"]
    lines = [format_table(headers, rows)] if rows else ["no device was measured"]
    lines.append("")
    for node in nodes:
        cpu = node.cpu
        facts = [cpu.model or "CPU ?",
                 f"{cpu.physical_cores or '?'} cores ({cpu.logical_cores or '?'} logical)",
                 f"{cpu.ram_bytes / 1024**3:.1f} GiB RAM" if cpu.ram_bytes else "RAM ?"]
        if cpu.cpu_quota_cores is not None:
            facts.append(f"cgroup quota {cpu.cpu_quota_cores:.2f} cores")
        resources = ", ".join(f"{k}={v:g}" for k, v in sorted(node.resources.items())
                              if not k.startswith("memory") and k != "object_store_memory")
        status = "ok" if node.ok else "FAILED"
        took = f", {node.profile_time_s:.1f} s" if node.profile_time_s is not None else ""
        where = ", ".join(filter(None, [node.hostname or node.ip or "?", node.platform]))  # wsl2: Windows in WSL2
        lines.append(f"node {node.node_id[:8]} ({where}): {status}{took}; "
                     + "; ".join(facts) + (f"; Ray resources {resources}" if resources else ""))
        if node.error:
            lines.append(f"  error: {node.error}")
        for device in node.devices:
            if device.error:
                lines.append(f"  {device.kind}{device.index if device.kind == 'gpu' else ''}: {device.error}")
    return "\n".join(lines)


def _check_writable(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"--json {path}: folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UserError(f"--json {path}: not writable; choose another path")
    if os.path.isdir(path):
        raise UserError(f"--json {path} is a folder; give a file name such as {os.path.join(path, 'nodes.json')}")


def _num(value, spec: str, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    return format(value * scale if scale != 1.0 else value, spec)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
