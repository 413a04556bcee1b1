"""dashboards/grafana/hetero_ray.json: it is a Grafana dashboard in the layout of Ray's own,
every metric it queries is a gauge hetero_ray exports (with Ray's ``ray_`` prefix), every
exported gauge has a panel, it groups by tags the gauges carry, and it is what its
generator writes. No Ray is started."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from hetero_ray.metrics.gauges import GAUGES, TAG_KEYS

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(REPO_ROOT, "dashboards", "grafana", "hetero_ray.json")
GENERATOR = os.path.join(REPO_ROOT, "dashboards", "grafana", "generate.py")
EXPORTED = {f"ray_{name}" for name in GAUGES}  # Ray prefixes application metrics with ray_
RAY_LABELS = {"SessionName"}  # the label Ray adds to every metric it exports

PROMQL_WORDS = {"sum", "max", "min", "avg", "by", "without", "label_values", "rate", "irate", "increase"}


def load(path: str = DASHBOARD) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def queries(dashboard: dict) -> list[str]:
    """Every PromQL the dashboard runs: the panels' targets and the variables' queries."""
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(query["query"])
    return found


def metrics_in(expr: str) -> set[str]:
    """The metric names of one PromQL expression (label matchers and strings removed)."""
    bare = re.sub(r'"[^"]*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\b(by|without)\s*\([^)]*\)", "", bare)
    bare = re.sub(r",\s*\w+\s*\)", ")", bare)  # label_values(metric, label): the label is no metric
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare))
    return names - PROMQL_WORDS


def test_it_is_a_grafana_dashboard_in_rays_layout():
    dashboard = load()
    assert dashboard["title"] == "hetero_ray" and dashboard["uid"] and dashboard["schemaVersion"]
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    graphs = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert rows and graphs and all(p["targets"] for p in graphs)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert all(p["gridPos"]["w"] == 12 for p in graphs)  # two panels a row, as Ray's dashboards
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names[:2] == ["datasource", "SessionName"]  # Ray's own first two variables
    used = set(re.findall(r"\$(\w+)", json.dumps(queries(dashboard))))
    assert used <= set(names), f"undefined variables: {used - set(names)}"


def test_every_queried_metric_is_exported_and_every_gauge_has_a_panel():
    dashboard = load()
    queried = set().union(*(metrics_in(expr) for expr in queries(dashboard)))
    assert queried, "no metric found in the dashboard's queries"
    assert queried <= EXPORTED, f"queried but not exported by hetero_ray: {sorted(queried - EXPORTED)}"
    panel_metrics = set().union(*(metrics_in(t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])))
    assert panel_metrics == EXPORTED, f"exported gauges without a panel: {sorted(EXPORTED - panel_metrics)}"


def test_it_groups_and_filters_by_tags_the_gauges_carry():
    tags = set(TAG_KEYS) | RAY_LABELS
    for expr in queries(load()):
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            assert {g.strip() for g in group.split(",")} <= tags, expr
        for matcher in re.findall(r"\{([^}]*)\}", expr):
            assert {m.split("=")[0].strip() for m in matcher.split(",") if m.strip()} <= tags, expr


def test_the_metric_check_catches_a_name_hetero_ray_does_not_export(tmp_path):
    dashboard = load()
    dashboard["panels"][1]["targets"][0]["expr"] = 'max(ray_hetero_ray_plan_version{rank=~"$Rank"}) by (rank)'
    queried = set().union(*(metrics_in(expr) for expr in queries(dashboard)))
    assert "ray_hetero_ray_plan_version" in queried and not queried <= EXPORTED
    assert metrics_in('label_values(ray_hetero_ray_local_batch_size{SessionName=~"$SessionName"}, rank)') \
        == {"ray_hetero_ray_local_batch_size"}


def test_the_json_is_what_its_generator_writes(tmp_path):
    out = tmp_path / "hetero_ray.json"
    subprocess.run([sys.executable, GENERATOR, str(out)], check=True, timeout=120, cwd=REPO_ROOT)
    assert load(str(out)) == load(), "rerun dashboards/grafana/generate.py after changing it"
