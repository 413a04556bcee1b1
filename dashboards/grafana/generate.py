"""Writes dashboards/grafana/hetero_ray.json: hetero_ray's Grafana dashboard, made by Ray's
own dashboard factory from Ray's Train dashboard template, so the layout (rows of two
panels), the templating (datasource, SessionName) and the panel JSON are those of the
dashboards Ray provisions.

    .venv/bin/python dashboards/grafana/generate.py dashboards/grafana/hetero_ray.json

Not part of the installed package; rerun it after a gauge is added to
hetero_ray/metrics/gauges.py (tests/test_docs.py checks the JSON against the gauges).
"""

import copy
import json
import os
import sys
import tempfile

from ray.dashboard.modules.metrics import grafana_dashboard_factory as factory
from ray.dashboard.modules.metrics.dashboards.common import DashboardConfig, Panel, Row, Target

RAY_TEMPLATE = os.path.join(os.path.dirname(factory.__file__), "dashboards", "train_grafana_dashboard_base.json")
SELECTED = 'experiment=~"$Experiment", rank=~"$Rank", {global_filters}'  # the factory fills global_filters
LEGEND = "{{experiment}} rank {{rank}}"


def per_rank(metric: str) -> str:
    return f"max({metric}{{{{{SELECTED}}}}}) by (experiment, rank)"


def graph(panel_id: int, title: str, description: str, unit: str, expr: str, legend: str = LEGEND) -> Panel:
    return Panel(id=panel_id, title=title, description=description, unit=unit,
                 targets=[Target(expr=expr, legend=legend)], fill=0, stack=False)


ROWS = [
    Row(title="Throughput", id=100, panels=[
        graph(1, "Own samples/s per rank", "Each rank's own throughput: its local batch size ÷ the busy time "
              "(data + forward + backward) of its last step.", "samples/s", per_rank("ray_hetero_ray_samples_per_s")),
        graph(2, "Sum of the ranks' own samples/s", "Σ of each rank's own samples/s: what the run would reach if "
              "no rank ever waited (the ideal the bench's efficiency is measured against).", "samples/s",
              f"sum({per_rank('ray_hetero_ray_samples_per_s')}) by (experiment)", legend="{{experiment}}"),
    ]),
    Row(title="Balance", id=101, panels=[
        graph(3, "Local batch size per rank", "Each rank's share of the global batch (samples per step): the plan "
              "in force. A step up or down is a plan change.", "samples", per_rank("ray_hetero_ray_local_batch_size")),
        graph(4, "Busy time per rank", "Busy time of each rank's last step (waiting for the others excluded). "
              "Balanced ranks are about equal; one rank above the others is a straggler.", "s",
              per_rank("ray_hetero_ray_busy_time_s")),
    ]),
    Row(title="GPU", id=102, panels=[
        graph(5, "GPU utilisation per rank", "GPU utilisation of each rank's device (percent), read by the "
              "in-training profiler (--profile-interval). Empty on CPU ranks.", "percent",
              per_rank("ray_hetero_ray_gpu_util")),
    ]),
]


def template() -> dict:
    """Ray's Train template with hetero_ray's variables: its datasource and SessionName,
    then the runs (the ``experiment`` tag) and their ranks."""
    base = json.load(open(RAY_TEMPLATE))
    ray_vars = {v["name"]: v for v in base["templating"]["list"]}

    def labels(name: str, description: str, metric_filter: str, label: str) -> dict:
        variable = copy.deepcopy(ray_vars["SessionName"])
        query = f"label_values(ray_hetero_ray_local_batch_size{{{{{metric_filter}}}}}, {label})"
        variable.update(name=name, label=name, description=description, definition=query,
                        query={"query": query, "refId": "StandardVariableQuery"}, multi=name != "SessionName")
        return variable

    base["title"] = "hetero_ray"
    base["templating"]["list"] = [
        ray_vars["datasource"],
        labels("SessionName", "Filter queries to specific ray sessions.", "{global_filters}", "SessionName"),
        labels("Experiment", "hetero_ray runs (RunConfig.name, --name).", 'SessionName=~"$SessionName"',
               "experiment"),
        labels("Rank", "Training ranks of the chosen runs.",
               'SessionName=~"$SessionName", experiment=~"$Experiment"', "rank"),
    ]
    return base


def main(out_path: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as base_file:
        json.dump(template(), base_file, indent=2)
    try:
        config = DashboardConfig(name="HETERO_RAY", default_uid="heteroRayDashboard", rows=ROWS,
                                 standard_global_filters=['SessionName=~"$SessionName"'],
                                 base_json_file_name=base_file.name)  # absolute: the factory's join keeps it
        content, _ = factory._generate_grafana_dashboard(config)  # private in Ray 2.60; its output is plain JSON
    finally:
        os.unlink(base_file.name)
    with open(out_path, "w") as f:
        json.dump(json.loads(content), f, indent=2, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
