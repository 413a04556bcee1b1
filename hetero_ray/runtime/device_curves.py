"""Each rank's emulated device curve, read on the driver from its ``--emulate-devices`` /
``HeteroConfig.emulate_devices`` entry: a curve written out, or a device of a profile
(``nodes.json``), refitted with the planner's fit. The workers get the numbers
(:mod:`hetero_ray.training.timing.curve_emulation` pads their steps to them); bad input fails
here, before anything starts."""

from __future__ import annotations

from typing import Optional, Sequence

from hetero_ray.config import parse_emulated_device
from hetero_ray.errors import UserError
from hetero_ray.planning.capacity import probe_rows
from hetero_ray.planning.cost_model import fit_curve
from hetero_ray.profiling.capability import node_named, read_nodes_document
from hetero_ray.training.timing.curve_emulation import DeviceCurve


def device_curves(name: str, entries: Sequence[str]) -> list[DeviceCurve]:
    """Each rank's curve from its ``--emulate-devices`` entry (syntax checked by the config);
    profiles are read here, on the driver. UserError on a missing, malformed or unprobed profile."""
    documents: dict[str, dict] = {}
    curves = []
    for entry in entries:
        spec = parse_emulated_device(name, entry)
        if "floor_ms" in spec:
            curves.append(DeviceCurve(spec["floor_ms"] / 1e3, spec["alpha_ms"] / 1e3, spec["beta_ms"] / 1e3, entry))
            continue
        path = spec["profile"]
        if path not in documents:
            documents[path] = _load_profile(name, path)
        curves.append(_profile_curve(name, entry, documents[path], spec))
    return curves


def _load_profile(name: str, path: str) -> dict:
    return read_nodes_document(path, f"{name}:")


def _profile_curve(name: str, entry: str, document: dict, spec: dict) -> DeviceCurve:
    """The first device of the profile that the entry names and that has a model probe."""
    # Without a kind the GPU is meant; a CPU only where the profile probed no GPU.
    kind = spec["kind"] or ("gpu" if _has_probed_gpu(document, spec["node"]) else "cpu")
    probed = []
    for node in document["nodes"]:
        if node.get("status", "ok") != "ok" or not node_named(node, spec["node"]):
            continue
        for device in node.get("devices") or ():
            rows = probe_rows(device) if isinstance(device, dict) else []
            if not rows:
                continue
            probed.append(f"{str(node.get('node_id'))[:8]}:{device.get('kind')}{device.get('index', 0)}")
            if device.get("kind") != kind or (spec["index"] is not None and device.get("index", 0) != spec["index"]):
                continue
            fit = fit_curve([r["batch_size"] for r in rows], [r["busy_time_s"] for r in rows])
            return DeviceCurve(fit.floor_s, fit.alpha_s, fit.beta_s_per_sample, entry)
    which = ", ".join(probed) or "none"
    raise UserError(f"{name} entry {entry!r}: {spec['profile']} has no such device with a model probe "
                    f"(probed devices: {which}); name one of them as PROFILE.json[:NODE][:gpuN|cpuN], or "
                    f"profile again with --model MODEL")


def _has_probed_gpu(document: dict, node_name: Optional[str]) -> bool:
    return any(isinstance(d, dict) and d.get("kind") == "gpu" and probe_rows(d)
               for n in document["nodes"] if n.get("status", "ok") == "ok" and node_named(n, node_name)
               for d in n.get("devices") or ())
