"""``hetero-ray plan``: what-if planning from a saved profile, without starting Ray.

    hetero-ray plan --profile nodes.json --global-batch-size 512 --workers gpu,cpu*3 --json plan.json

Reads a ``nodes.json`` (from ``hetero-ray profile --model M --json FILE`` or a training run),
prints each probed device's busy-time curve ``t(b) = max(floor, α + β·b)`` with its error at
every probed size, then the first plan the run's own planner and policy
(:class:`~hetero_ray.planning.planner.Planner`) would make for the given workers, with its
predicted step time and throughput; ``--json FILE`` writes the same. A profile from before
the curve had a floor (no ``fit_shape``) is refitted from its probe rows. ``--workers``:
comma-separated ranks ``[NODE:]KIND[*COUNT]`` (default: one per probed device).
Usage and details: docs/profiling-and-planning.md#what-if-planning-hetero-ray-plan
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from typing import Any, Optional

from hetero_ray.errors import UserError
from hetero_ray.flags import add_deprecated_alias
from hetero_ray.profiling.capability import node_named, read_nodes_document

HELP = "what-if planning from a saved profile (nodes.json): curves, shares, predicted step time; no Ray"

CPU, GPU = "cpu", "gpu"
DEFAULT_REBALANCE_INTERVAL = 20  # the planner needs one; a first plan does not depend on it
_WORKER_RE = re.compile(r"^(?:(?P<node>[^:*]+):)?(?P<kind>cpu|gpu)(?:\*(?P<count>\d+))?$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hetero_ray.planning.policies import DEFAULT_POLICY, policy_names
    from hetero_ray.planning.policy_module import HELP as POLICY_MODULE_HELP

    parser.add_argument("--profile", required=True, metavar="FILE",
                        help="a nodes.json written by `hetero-ray profile --model M --json FILE`")
    parser.add_argument("--global-batch-size", type=int, metavar="B",  # required: run() says so (or --batch-size)
                        help="the global batch size: the samples of one optimiser step across all workers (required)")
    add_deprecated_alias(parser, "--batch-size", "--global-batch-size", dest="global_batch_size", type=int)
    parser.add_argument("--model", help="check that the profile probed this model (default: whatever it probed)")
    parser.add_argument("--workers", metavar="SPEC",
                        help="ranks as [NODE:]KIND[*COUNT],… e.g. gpu,cpu*3 (default: one per probed device)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, metavar="POLICY",
                        help=f"the policy whose first plan to show: {', '.join(policy_names())}, or one "
                             f"--policy-module registers (default {DEFAULT_POLICY})")
    parser.add_argument("--policy-module", metavar="MODULE", help=POLICY_MODULE_HELP)
    parser.add_argument("--allreduce-ms", type=float, metavar="MS",
                        help="the gradient all-reduce of a step with every rank in, in ms (a run's least "
                             "wait per step, or a guess): the plan then leaves out ranks that cost more in "
                             "communication than they add (default: compute only, as a run's first plan)")
    parser.add_argument("--json", metavar="FILE", help="also write the curves and the plan as JSON to FILE")


def run(args: argparse.Namespace) -> int:
    if args.global_batch_size is None:
        raise UserError("--global-batch-size is required: the global batch to share out, e.g. --global-batch-size 512")
    if args.global_batch_size < 1:
        raise UserError(f"--global-batch-size must be a positive integer, got {args.global_batch_size}")
    if args.allreduce_ms is not None and not (math.isfinite(args.allreduce_ms) and args.allreduce_ms >= 0):
        raise UserError(f"--allreduce-ms must be a number of milliseconds ≥ 0, got {args.allreduce_ms}")
    from hetero_ray.planning.policies import policy_class
    from hetero_ray.planning.policy_module import load_policy_module

    if args.policy_module:
        load_policy_module("--policy-module", args.policy_module)
    policy_class(args.policy)  # a registered one, or the message lists them
    if args.json:
        from hetero_ray.cli.profile import _check_writable

        _check_writable(args.json)
    document = load_profile(args.profile, args.model)
    report = plan_report(document, args.global_batch_size, args.workers, args.policy, args.profile,
                         allreduce_s=None if args.allreduce_ms is None else args.allreduce_ms / 1e3)
    print(format_report(report))
    if args.json:
        tmp = f"{args.json}.tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=2, allow_nan=False)
        os.replace(tmp, args.json)
        print(f"\nwritten: {os.path.abspath(args.json)}")
    return 0


# ---------------------------------------------------------------------------- the profile
def load_profile(path: str, model: Optional[str] = None) -> dict:
    """The profile document, its probed devices' curves brought up to date; UserError when
    it is missing, not JSON, not a profile, without a model probe, or of another model."""
    from hetero_ray.planning.capacity import refit_old_curve

    document = read_nodes_document(path, "--profile")
    nodes = document["nodes"]
    probed_model = document.get("model")
    if model is not None and probed_model != model:
        raise UserError(f"--profile {path} probed {probed_model or 'no model'}, not {model}; profile again "
                        f"with --model {model}, or leave out --model to plan for {probed_model or 'it'}")
    for node in nodes:
        if node.get("status", "ok") != "ok":
            continue
        for device in node.get("devices") or ():
            if isinstance(device, dict):
                refit_old_curve(device)
    if not any(_probed(d) for n in _ok_nodes(nodes) for d in n.get("devices") or ()):
        raise UserError(f"--profile {path} holds no model probe (no device has busy times at batch sizes); "
                        f"profile again with --model MODEL")
    return document


def _probed(device) -> bool:
    from hetero_ray.planning.capacity import rank_capacities

    if not isinstance(device, dict) or device.get("kind") not in (CPU, GPU):
        return False
    node = {"node_id": "x", "devices": [device]}
    return rank_capacities([node], ["x"], [device["kind"]])[0] is not None


def _ok_nodes(nodes: list) -> list[dict]:
    return [n for n in nodes if isinstance(n, dict) and n.get("status", "ok") == "ok"]


# ---------------------------------------------------------------------------- the workers
def parse_workers(spec: Optional[str], nodes: list[dict]) -> tuple[list[str], list[str]]:
    """(node id, device kind) per rank from ``--workers`` (see the module docstring)."""
    ok = _ok_nodes(nodes)
    probed = {(str(n.get("node_id")), kind): sum(1 for d in n.get("devices") or () if _probed(d) and d["kind"] == kind)
              for n in ok for kind in (CPU, GPU)}
    if spec is None:
        ranks = []
        for n in ok:
            node_id = str(n.get("node_id"))
            ranks += [(node_id, GPU)] * probed[(node_id, GPU)]
            if probed[(node_id, CPU)] and not probed[(node_id, GPU)]:
                ranks.append((node_id, CPU))
        return [r[0] for r in ranks], [r[1] for r in ranks]
    node_ids, kinds = [], []
    taken: dict[str, int] = {}
    for entry in (e.strip() for e in spec.split(",")):
        match = _WORKER_RE.match(entry)
        if not match or (match["count"] is not None and int(match["count"]) < 1):
            raise UserError(f"--workers entry {entry!r}: expected [NODE:]KIND[*COUNT] with KIND gpu or cpu and "
                            "COUNT ≥ 1, e.g. gpu,cpu*3 or 28c424db:gpu")
        kind, count = match["kind"], int(match["count"] or 1)
        candidates = [str(n.get("node_id")) for n in ok if node_named(n, match["node"])] if match["node"] else \
            [str(n.get("node_id")) for n in ok]
        if match["node"] and len(candidates) != 1:
            known = ", ".join(f"{str(n.get('node_id'))[:8]} ({n.get('hostname') or n.get('ip') or '?'})" for n in ok)
            which = "no node" if not candidates else f"{len(candidates)} nodes"
            raise UserError(f"--workers entry {entry!r}: {match['node']!r} names {which} of the profile "
                            f"(nodes: {known}); give a longer node id prefix, a hostname or an IP")
        for _ in range(count):
            if kind == GPU:
                node_id = next((c for c in candidates if taken.get(c, 0) < probed[(c, GPU)]), None)
                if node_id is not None:
                    taken[node_id] = taken.get(node_id, 0) + 1
            else:
                node_id = next((c for c in candidates if probed[(c, CPU)]), None)
            if node_id is None:
                where = f"on {match['node']}" if match["node"] else "in the profile"
                have = "left" if kind == GPU and any(probed[(c, GPU)] for c in candidates) else "with a model probe"
                raise UserError(f"--workers entry {entry!r}: no {kind} {have} {where}; name the probed devices "
                                "(see the curves `hetero-ray plan` prints without --workers)")
            node_ids.append(node_id)
            kinds.append(kind)
    return node_ids, kinds


# ---------------------------------------------------------------------------- the report
def plan_report(document: dict, global_batch_size: int, workers: Optional[str], policy: str,
                profile_path: str, allreduce_s: Optional[float] = None) -> dict[str, Any]:
    """Curves, plan and predictions as one JSON-safe dict (what ``--json`` writes).

    The plan is the first plan a run's planner makes (compute only: nothing is measured
    before the first step); with ``allreduce_s``, the all-reduce of every rank together, the
    one its decisions reach once they have measured it (the same planner, told it)."""
    from hetero_ray.planning.capacity import probe_rows, rank_capacities
    from hetero_ray.planning.comm import CommEstimates
    from hetero_ray.planning.cost_model import curve_busy_time_s
    from hetero_ray.planning.rank_facts import RankFacts

    nodes = document["nodes"]
    devices = []
    for node in _ok_nodes(nodes):
        for device in node.get("devices") or ():
            if not _probed(device):
                continue
            alpha, beta, floor = device["alpha_s"], device["beta_s_per_sample"], float(device.get("floor_s") or 0.0)
            probe = []
            for row in probe_rows(device):
                predicted = float(curve_busy_time_s(alpha, beta, floor, row["batch_size"]))
                probe.append({"batch_size": row["batch_size"], "measured_busy_time_s": row["busy_time_s"],
                              "predicted_busy_time_s": predicted,
                              "rel_error": (predicted - row["busy_time_s"]) / row["busy_time_s"]})
            devices.append({
                "node_id": str(node.get("node_id")), "hostname": node.get("hostname"), "ip": node.get("ip"),
                "kind": device["kind"], "index": device.get("index") or 0, "name": device.get("name"),
                "shape": device.get("fit_shape") or "line", "floor_s": floor, "alpha_s": alpha,
                "beta_s_per_sample": beta, "max_batch_size": device.get("max_batch_size"),
                "max_rel_error": max((abs(p["rel_error"]) for p in probe), default=None),
                "refitted": bool(device.get("refitted")), "probe": probe,
            })
    rank_node_ids, rank_kinds = parse_workers(workers, nodes)
    if not rank_node_ids:
        raise UserError("no worker to plan for: the profile has no probed device to put a rank on; "
                        "give --workers")
    if global_batch_size < len(rank_node_ids):
        raise UserError(f"--global-batch-size {global_batch_size} is smaller than the {len(rank_node_ids)} workers; "
                        "every rank needs a sample")
    ranks = RankFacts(node_ids=rank_node_ids, device_kinds=rank_kinds)
    plan = _first_plan(nodes, ranks, global_batch_size, policy, allreduce_s)
    sizes, reason = plan["local_batch_sizes"], plan.get("reason")
    capacities = rank_capacities(nodes, rank_node_ids, rank_kinds)
    comm, all_ranks_s = None, None
    if allreduce_s is not None:
        comm = CommEstimates.of_every_rank(len(rank_node_ids), allreduce_s)
        # every rank in: the compute-only first plan, with every rank's all-reduce
        every_rank = _first_plan(nodes, ranks, global_batch_size, policy, None)["local_batch_sizes"]
        all_ranks_s = max(c.busy_time_s(b) for c, b in zip(capacities, every_rank)) + comm.cost_s(range(len(every_rank)))
    gpu_index = _gpu_indices(nodes, rank_node_ids, rank_kinds)
    ranks = [{"rank": r, "node_id": node_id, "kind": kind, "index": gpu_index[r],
              "local_batch_size": b, "max_batch_size": c.max_batch_size,
              "predicted_busy_time_s": c.busy_time_s(b) if b > 0 else 0.0}
             for r, (node_id, kind, b, c) in enumerate(zip(rank_node_ids, rank_kinds, sizes, capacities))]
    compute_s = max(r["predicted_busy_time_s"] for r in ranks)
    comm_s = 0.0 if comm is None else comm.cost_s(r for r, b in enumerate(sizes) if b > 0)
    step_time_s = compute_s + comm_s
    return {
        "profile": profile_path, "model": document.get("model"), "global_batch_size": global_batch_size,
        "policy": policy, "devices": devices, "workers": ranks, "plan_reason": reason,
        "left_out_ranks": [r["rank"] for r in ranks if r["local_batch_size"] == 0],
        "allreduce_s": allreduce_s, "predicted_compute_time_s": compute_s, "predicted_comm_time_s": comm_s,
        "predicted_step_time_s": step_time_s, "samples_per_s": global_batch_size / step_time_s,
        "all_ranks_predicted_step_time_s": all_ranks_s,
    }


def _first_plan(nodes: list, ranks, global_batch_size: int, policy: str, allreduce_s: Optional[float]) -> dict:
    """The first plan a run's planner makes for ``ranks`` from these profiles (with a known
    all-reduce: the one its decisions reach once they have measured it)."""
    from hetero_ray.planning.planner import Planner

    planner = Planner(global_batch_size, policy, DEFAULT_REBALANCE_INTERVAL, allreduce_s=allreduce_s)
    planner.set_capabilities(nodes)
    return planner.plan_for(len(ranks.node_ids), ranks=ranks)


def _gpu_indices(nodes, rank_node_ids, rank_kinds) -> list[int]:
    """The NVML index of each GPU rank's device (the capacity rule: k-th GPU rank of a node
    on its k-th probed GPU); 0 for CPU ranks."""
    by_id = {str(n.get("node_id")): n for n in _ok_nodes(nodes)}
    taken: dict[str, int] = {}
    out = []
    for node_id, kind in zip(rank_node_ids, rank_kinds):
        if kind != GPU:
            out.append(0)
            continue
        gpus = sorted((d for d in by_id[node_id].get("devices") or () if isinstance(d, dict) and d.get("kind") == GPU),
                      key=lambda d: d.get("index") or 0)
        position = taken.get(node_id, 0)
        taken[node_id] = position + 1
        out.append(gpus[position].get("index") or 0)
    return out


def format_report(report: dict) -> str:
    from hetero_ray.formatting import format_table

    lines = [f"profile {report['profile']} (model {report['model'] or '?'}): busy time t(b) = max(floor, α + β·b)"]
    for d in report["devices"]:
        label = f"node {d['node_id'][:8]} {d['kind']}{d['index'] if d['kind'] == GPU else ''} {d['name'] or ''}".rstrip()
        cap = f", max batch {d['max_batch_size']}" if d["max_batch_size"] else ""
        note = " (refitted from the probe: the profile predates the curve's floor)" if d["refitted"] else ""
        lines.append("")
        lines.append(f"{label}: {d['shape']}, floor {d['floor_s'] * 1e3:.3g} ms, α {d['alpha_s'] * 1e3:.3g} ms, "
                     f"β {d['beta_s_per_sample'] * 1e3:.3g} ms/sample{cap}{note}")
        rows = [[p["batch_size"], f"{p['measured_busy_time_s'] * 1e3:.3f}", f"{p['predicted_busy_time_s'] * 1e3:.3f}",
                 f"{p['rel_error']:+.1%}"] for p in d["probe"]]
        lines.append(format_table(["batch", "measured ms", "predicted ms", "error"], rows))
    lines.append("")
    lines.append(f"plan ({report['policy']}, global batch {report['global_batch_size']}, "
                 f"{len(report['workers'])} worker{'s' if len(report['workers']) != 1 else ''}): {report['plan_reason']}")
    rows = [[w["rank"], f"{w['node_id'][:8]} {w['kind']}{w['index'] if w['kind'] == GPU else ''}",
             w["local_batch_size"], w["max_batch_size"] or "-", f"{w['predicted_busy_time_s'] * 1e3:.3f}"]
            for w in report["workers"]]
    lines.append(format_table(["rank", "device", "local batch", "max batch", "predicted busy ms"], rows))
    comm = ("communication not modelled: give --allreduce-ms to see which ranks cost more than they add"
            if report["allreduce_s"] is None else f"compute {report['predicted_compute_time_s'] * 1e3:.3f} ms + "
            f"all-reduce {report['predicted_comm_time_s'] * 1e3:.3f} ms")
    out = report["left_out_ranks"]
    lines.append(f"predicted step time {report['predicted_step_time_s'] * 1e3:.3f} ms ({comm}), "
                 f"throughput {report['samples_per_s']:,.0f} samples/s"
                 + (f"; left out: rank{'s' if len(out) > 1 else ''} {', '.join(map(str, out))}" if out else ""))
    return "\n".join(lines)
