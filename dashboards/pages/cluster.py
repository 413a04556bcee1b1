"""Cluster: nodes and devices with their measured capabilities, and which are training.

Two sources: the run's node profile (``nodes.json`` / the metrics store: CPU, devices,
matmul throughput, bandwidth, per-device cost model) and, in live mode, Ray's own list of
nodes (alive or not, resources). A node is *live* while its ranks report steps.
"""

from __future__ import annotations

import time

import pandas as pd
from dash import html

from hetero_ray.reporting import figures, frames, run_frames
from hetero_ray_dashboards import layout as ui

NAME, PATH, TITLE = "cluster", "/cluster", "Cluster"
GRAPHS = ("cluster-capabilities", "cluster-rank-speed")
CONTENT = ("cluster-ray-nodes", "cluster-nodes", "cluster-devices")
INPUTS = ()
NO_PROFILE = ("No node profile in this run (nodes.json): node profiling writes it before training starts. "
              "Nodes below are those that ran ranks.")


def layout(catalog=None):
    return ui.page_frame(NAME, TITLE, [
        ui.block("cluster-ray-nodes"),
        ui.block("cluster-nodes"),
        ui.block("cluster-devices"),
        ui.row([ui.graph("cluster-capabilities"), ui.graph("cluster-rank-speed")]),
    ])


def ray_nodes_frame(nodes: list[dict]) -> pd.DataFrame:
    rows = [{
        "node_id": str(n.get("node_id", ""))[:8], "address": n.get("ip") or "", "host": n.get("hostname") or "",
        "alive": "yes" if n.get("alive") else "no",
        "CPU": (n.get("resources") or {}).get("CPU"), "GPU": (n.get("resources") or {}).get("GPU"),
        "memory GB": round((n.get("resources") or {}).get("memory", 0) / 1e9, 1),
    } for n in nodes]
    return pd.DataFrame(rows, columns=["node_id", "address", "host", "alive", "CPU", "GPU", "memory GB"])


def build(source, catalog=None) -> dict:
    steps = run_frames.steps(source)
    nodes = source.nodes()
    node_table = frames.nodes_frame(nodes, steps, live=source.active(), now=time.time())
    if not node_table.empty:
        node_table = node_table.assign(node_id=node_table["node_id"].str.slice(0, 8),
                                       last_step_age_s=node_table["last_step_age_s"].round(1))
        if not source.active():  # how long ago a finished run's nodes stepped says nothing
            node_table = node_table.drop(columns=["last_step_age_s"])
    devices = frames.devices_frame(nodes)
    ray_nodes = catalog.cluster_nodes() if catalog is not None else None
    if ray_nodes is None:
        ray_block = [html.H3("Ray cluster"), html.P(
            "Offline: the app is not connected to a Ray cluster, so this shows the run's own record. "
            "Start it with --address (or on the `ray start --head` machine) to see the cluster's nodes.",
            className="empty")]
    else:
        ray_block = [html.H3("Ray cluster (now)"), ui.table(ray_nodes_frame(ray_nodes), empty="The cluster reports no nodes.")]
    table = source.derived("rank_table", lambda: frames.rank_table(steps))
    return {
        "cluster-ray-nodes": ray_block,
        "cluster-nodes": [html.H3("Nodes of this run"),
                          *([html.P(NO_PROFILE, className="empty")] if not nodes else []),
                          ui.table(node_table, empty=ui.NO_STEPS)],
        "cluster-devices": [html.H3("Devices (profiled)"),
                            ui.table(devices.drop(columns=["node_id"]) if not devices.empty else devices,
                                     empty="No device profile in this run yet.")],
        "cluster-capabilities": figures.capabilities_figure(devices),
        "cluster-rank-speed": figures.rank_speed_figure(table),
    }
