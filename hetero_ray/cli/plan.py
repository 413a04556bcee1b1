"""``hetero-ray plan``: what-if planning from a saved profile, without starting Ray.

    hetero-ray plan --profile nodes.json --global-batch-size 512
    hetero-ray plan --profile nodes.json --global-batch-size 512 --workers gpu,cpu*3 --json plan.json
    hetero-ray plan --profile nodes.json --global-batch-size 512 --workers 28c424db:gpu,10.0.0.7:cpu*2

Reads a ``nodes.json`` written by ``hetero-ray profile --model M --json FILE`` (or by a
training run), prints each probed device's busy-time curve ``t(b) = max(floor, α + β·b)``
with its error at every probed batch size, then the first plan the planner would make for
the given workers — the run's own planner and policy (:class:`~hetero_ray.planning.planner.Planner`),
not a copy — with its predicted step time and throughput. ``--json FILE`` writes the same,
with the measured and the predicted busy time at every probed size of every device.

A profile from before the curve had a floor (no ``fit_shape``) holds a line fitted to the
probe; its devices are refitted from their probe rows with today's curve, and the output
says so.

``--workers``: comma-separated ranks ``[NODE:]KIND[*COUNT]``, KIND ``gpu`` or ``cpu``, NODE a
node id prefix, hostname or IP. Without NODE a ``gpu`` rank takes the next probed GPU not yet
taken (nodes in file order), a ``cpu`` rank the first node with a probed CPU. Default: one
rank per probed GPU, and one CPU rank on each node that has a probed CPU and no probed GPU.
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
from hetero_ray.profiling.capability import read_nodes_document

HELP = "what-if planning from a saved profile (nodes.json): curves, shares, predicted step time; no Ray"

CPU, GPU = "cpu", "gpu"
DEFAULT_REBALANCE_INTERVAL = 20  # the planner needs one; a first plan does not depend on it
_WORKER_RE = re.compile(r"^(?:(?P<node>[^:*]+):)?(?P<kind>cpu|gpu)(?:\*(?P<count>\d+))?$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hetero_ray.planning.policies import DEFAULT_POLICY, policy_names

    parser.add_argument("--profile", required=True, metavar="FILE",
                        help="a nodes.json written by `hetero-ray profile --model M --json FILE`")
    parser.add_argument("--global-batch-size", type=int, metavar="B",  # required: run() says so (or --batch-size)
                        help="the global batch size: the samples of one optimiser step across all workers (required)")
    add_deprecated_alias(parser, "--batch-size", "--global-batch-size", dest="global_batch_size", type=int)
    parser.add_argument("--model", help="check that the profile probed this model (default: whatever it probed)")
    parser.add_argument("--workers", metavar="SPEC",
                        help="ranks as [NODE:]KIND[*COUNT],… e.g. gpu,cpu*3 (default: one per probed device)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, choices=policy_names(),
                        help=f"the policy whose first plan to show (default {DEFAULT_POLICY})")
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
                _refit_if_old(device)
    if not any(_probed(d) for n in _ok_nodes(nodes) for d in n.get("devices") or ()):
        raise UserError(f"--profile {path} holds no model probe (no device has busy times at batch sizes); "
                        f"profile again with --model MODEL")
    return document


def _refit_if_old(device: dict) -> None:
    """A device probed before the floor: its curve refitted from the probe rows (median busy
    time per size), marked ``refitted``."""
    from hetero_ray.planning.cost_model import fit_curve

    rows = _probe_rows(device)
    if device.get("fit_shape") or not rows:
        return
    fit = fit_curve([r["batch_size"] for r in rows], [r["busy_time_s"] for r in rows])
    device.update(alpha_s=fit.alpha_s, beta_s_per_sample=fit.beta_s_per_sample, floor_s=fit.floor_s,
                  fit_shape=fit.shape, fit_max_rel_error=fit.max_rel_error, refitted=True)


def _probe_rows(device: dict) -> list[dict]:
    rows = []
    for row in device.get("probe") or ():
        b, t = (row.get("batch_size"), row.get("busy_time_s")) if isinstance(row, dict) else (None, None)
        if isinstance(b, int) and not isinstance(b, bool) and b >= 1 and _positive(t):
            rows.append({"batch_size": b, "busy_time_s": float(t)})
    return rows


def _probed(device) -> bool:
    from hetero_ray.planning.capacity import rank_capacities

    if not isinstance(device, dict) or device.get("kind") not in (CPU, GPU):
        return False
    node = {"node_id": "x", "devices": [device]}
    return rank_capacities([node], ["x"], [device["kind"]])[0] is not None


def _ok_nodes(nodes: list) -> list[dict]:
    return [n for n in nodes if isinstance(n, dict) and n.get("status", "ok") == "ok"]


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


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
        candidates = [str(n.get("node_id")) for n in ok if _names(n, match["node"])] if match["node"] else \
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


def _names(node: dict, name: str) -> bool:
    return str(node.get("node_id", "")).startswith(name) or name in (node.get("hostname"), node.get("ip"))


# ---------------------------------------------------------------------------- the report
def plan_report(document: dict, global_batch_size: int, workers: Optional[str], policy: str,
                profile_path: str, allreduce_s: Optional[float] = None) -> dict[str, Any]:
    """Curves, plan and predictions as one JSON-safe dict (what ``--json`` writes).

    ``allreduce_s``: the all-reduce of every rank together; given, the plan is the one the
    balancer reaches once it has measured it (:func:`with_communication`), else the run's
    first plan (compute only: nothing is measured before the first step)."""
    from hetero_ray.planning.capacity import rank_capacities
    from hetero_ray.planning.cost_model import curve_busy_time_s
    from hetero_ray.planning.planner import Planner
    from hetero_ray.planning.policies import policy_class
    from hetero_ray.planning.rank_facts import RankFacts

    nodes = document["nodes"]
    devices = []
    for node in _ok_nodes(nodes):
        for device in node.get("devices") or ():
            if not _probed(device):
                continue
            alpha, beta, floor = device["alpha_s"], device["beta_s_per_sample"], float(device.get("floor_s") or 0.0)
            probe = []
            for row in _probe_rows(device):
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
    planner = Planner(global_batch_size, policy, DEFAULT_REBALANCE_INTERVAL)
    planner.set_capabilities(nodes)
    plan = planner.plan_for(len(rank_node_ids), ranks=RankFacts(node_ids=rank_node_ids, device_kinds=rank_kinds))
    sizes, reason = plan["local_batch_sizes"], plan.get("reason")
    capacities = rank_capacities(nodes, rank_node_ids, rank_kinds)
    communication, comm = None, None
    if allreduce_s is not None:
        comm = _comm_estimates(len(rank_node_ids), allreduce_s)
        communication = with_communication(capacities, global_batch_size, comm, allreduce_s)
        if policy_class(policy).weighs_communication:
            sizes, reason = communication["local_batch_sizes"], communication["reason"]
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
        "all_ranks_predicted_step_time_s": None if communication is None else communication["all_ranks_step_time_s"],
    }


def _comm_estimates(num_ranks: int, allreduce_s: float):
    """The balancer's own all-reduce estimates (:mod:`hetero_ray.planning.comm`), holding
    one measurement: every rank together. A smaller group is scaled from it by a ring's
    hops, as the balancer's first guess is; one rank communicates nothing."""
    from hetero_ray.planning.comm import CommEstimates

    comm = CommEstimates(window_steps=1, min_steps=1)
    comm.add(range(num_ranks), allreduce_s)
    return comm


def with_communication(capacities, global_batch_size: int, comm, allreduce_s: float) -> dict[str, Any]:
    """The optimal policy's plan once the all-reduce of every rank is known: the group and
    split minimising ``max t_i(b_i) + c(G)`` (:func:`subset.solve_subset_split`, rank 0
    always in), ``c`` from ``comm`` (:func:`_comm_estimates`)."""
    from hetero_ray.planning.policies import PolicyConfig
    from hetero_ray.planning.subset import solve_subset_split

    result = solve_subset_split([c.alpha_s for c in capacities], [c.beta_s_per_sample for c in capacities],
                                global_batch_size, comm.cost_s,
                                PolicyConfig().min_local_batch_size, [c.max_batch_size for c in capacities],
                                [c.floor_s for c in capacities], must_include=[0])
    out = ", ".join(str(r) for r in result.left_out)
    reason = (f"optimal with an all-reduce of {allreduce_s * 1e3:.3g} ms for every rank: "
              + (f"ranks {out} left out: their all-reduce costs more than they add (predicted "
                 f"{result.predicted_step_time_s * 1e3:.3f} ms without them, "
                 f"{result.all_ranks_step_time_s * 1e3:.3f} ms with every rank in)" if out else "every rank in"))
    return {"local_batch_sizes": list(result.local_batch_sizes), "reason": reason,
            "all_ranks_step_time_s": result.all_ranks_step_time_s}


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
