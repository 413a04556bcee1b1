"""Callbacks called directly: routing, the run list, every page's refresh, and the rule
that a refresh sends only what the browser does not have yet."""

from __future__ import annotations

import os
import shutil

import plotly.graph_objects as go
import pytest
from dash import html, no_update

from hetero_ray.metrics.store import MetricsStore
from hetero_ray.reporting import figures, frames
from hetero_ray.runs import run_files
from hetero_ray_dashboards import callbacks
from hetero_ray_dashboards.app import create_app
from hetero_ray_dashboards.catalog import RunCatalog
from hetero_ray_dashboards.pages import PAGES, balancer, bottlenecks, cluster, compare, gpu, ranks, run
from tests.fakes import StoreBridge
from tests.helpers import make_steps, write_run


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    write_run(root / "static", policy="static")
    write_run(root / "optimal", policy="optimal", batches=(7, 1), busy=(0.05, 0.05), decisions=True)
    return str(root)


@pytest.fixture
def catalog(runs_dir):
    return RunCatalog(runs_dir)


@pytest.fixture
def own_runs(runs_dir, tmp_path):
    """A copy of the module's runs for a test that changes their files; the others keep
    reading the runs as written."""
    return str(shutil.copytree(runs_dir, tmp_path / "runs"))


def page_extra(page, key="offline:static"):
    if page is ranks:
        return ([0, 1],)
    if page is compare:
        return (["offline:static", "offline:optimal"],)
    return ()


def outputs_of(page, values: list) -> dict:
    """Names the outputs of ``update_page`` (see callbacks.page_outputs)."""
    named = {}
    i = 0
    for graph_id in page.GRAPHS:
        named[graph_id], named[graph_id + ".extendData"] = values[i], values[i + 1]
        i += 2
    for content_id in page.CONTENT:
        named[content_id] = values[i]
        i += 1
    named["message"], named["state"], named["interval_disabled"] = values[i:i + 3]
    return named


def table_column(component, name: str) -> list[str]:
    """The cells of column ``name`` in the first HTML table of a Dash component tree."""
    table = next(iter(find_all(component, html.Table)))
    head, body = table.children
    names = [th.children for th in head.children.children]
    return [tr.children[names.index(name)].children for tr in body.children]


def find_all(component, kind) -> list:
    """Every ``kind`` component in a Dash component tree, in document order."""
    if isinstance(component, kind):
        return [component]
    if isinstance(component, (list, tuple)):
        return [found for c in component for found in find_all(c, kind)]
    children = getattr(component, "children", None)
    return find_all(children, kind) if children is not None else []


def text_of(component) -> str:
    """All text in a Dash component tree."""
    if component is None or component is no_update:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    if isinstance(component, (list, tuple)):
        return " ".join(text_of(c) for c in component)
    return text_of(getattr(component, "children", None))


# ---- navigation and the run list -----------------------------------------------------------

def test_route_serves_every_page_and_explains_unknown_paths(catalog):
    for page in PAGES:
        assert callbacks.route(page.PATH, catalog).id == f"{page.NAME}-page"
    assert callbacks.route("/", catalog).id == "run-page"
    assert callbacks.route("/run/", catalog).id == "run-page"
    assert "Page not found" in text_of(callbacks.route("/../../etc/passwd", catalog))


def test_run_list_offers_every_run_and_keeps_the_selection(catalog):
    options, value, status, message = callbacks.update_runs(catalog, 0, "", None, None)
    assert {o["value"] for o in options} == {"offline:static", "offline:optimal"}
    assert value == options[0]["value"] and message is None  # the list's first run: the newest
    assert "offline" in text_of(status)
    same = callbacks.update_runs(catalog, 1, "", value, options)
    assert same[0] is no_update and same[1] is no_update  # nothing re-sent


def test_run_list_takes_the_run_from_the_url_but_not_a_path_out_of_the_folder(catalog):
    _, value, _, _ = callbacks.update_runs(catalog, 0, "?run=offline:optimal", None, None)
    assert value == "offline:optimal"
    options, value, _, _ = callbacks.update_runs(catalog, 0, "?run=offline:../../etc", None, None)
    assert value == options[0]["value"]  # ignored: the list's first run, as without a ?run=


def test_an_empty_runs_folder_says_how_to_start_a_run(tmp_path):
    options, value, _, message = callbacks.update_runs(RunCatalog(str(tmp_path)), 0, "", None, None)
    assert options == [] and value is no_update  # stays None
    assert f"No runs under {tmp_path} — start one with `hetero-ray train --storage-path {tmp_path}" in text_of(message)


def test_rank_selector_offers_the_runs_ranks(catalog):
    options, value = callbacks.rank_selector(catalog, "offline:static")
    assert [o["value"] for o in options] == [0, 1] and value == [0, 1]
    assert callbacks.rank_selector(catalog, "offline:../x") == ([], [])


# ---- pages ----------------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.NAME)
def test_every_page_builds_from_a_run_directory_then_sends_nothing_twice(catalog, page):
    first = outputs_of(page, callbacks.update_page(page, catalog, "offline:static", page_extra(page), None))
    for graph_id in page.GRAPHS:
        assert isinstance(first[graph_id], go.Figure), graph_id
    assert first["interval_disabled"] is True  # a finished run is not refreshed
    again = callbacks.update_page(page, catalog, "offline:static", page_extra(page), first["state"])
    assert all(value is no_update for value in again), page.NAME


def test_run_page_shows_progress_and_throughput(catalog):
    out = outputs_of(run, callbacks.update_page(run, catalog, "offline:static", (), None))
    assert [t.name for t in out["run-throughput"].data] == ["achieved", "ideal (no waiting)"]
    kpis = text_of(out["run-kpis"])
    assert "finished" in kpis and "step 40 of 40" in kpis and "epoch 4 of 4" in kpis


def test_choosing_another_run_redraws_the_page(catalog):
    first = outputs_of(run, callbacks.update_page(run, catalog, "offline:static", (), None))
    other = outputs_of(run, callbacks.update_page(run, catalog, "offline:optimal", (), first["state"]))
    assert isinstance(other["run-throughput"], go.Figure)
    assert other["state"]["identity"] != first["state"]["identity"]


def test_choosing_ranks_redraws_the_ranks_page(catalog):
    both = outputs_of(ranks, callbacks.update_page(ranks, catalog, "offline:static", ([0, 1],), None))
    one = outputs_of(ranks, callbacks.update_page(ranks, catalog, "offline:static", ([1],), both["state"]))
    assert [t.name for t in one["ranks-throughput"].data] == ["rank 1"]
    assert len(one["ranks-busy-wait"].data) == 2 and len(both["ranks-busy-wait"].data) == 4


def test_balancer_page_shows_decisions(catalog):
    out = outputs_of(balancer, callbacks.update_page(balancer, catalog, "offline:optimal", (), None))
    assert [t.name for t in out["balancer-decisions"].data] == ["adopted", "kept current plan"]
    assert "kept current plan" in text_of(out["balancer-table"])


def test_bottlenecks_page_classifies_the_steps_when_the_summary_has_no_verdicts(catalog):
    out = outputs_of(bottlenecks, callbacks.update_page(bottlenecks, catalog, "offline:static", (), None))
    # write_run's static run: rank 0 is busy 0.06 s with 6 samples while rank 1 (0.04 s, 2
    # samples) waits for it, and the summary carries no verdicts of its own.
    assert table_column(out["bottlenecks-table"], "verdict") == ["straggler", "balanced"]


def test_bottlenecks_page_prefers_the_summarys_verdicts(own_runs):
    summary = os.path.join(own_runs, "optimal", run_files.SUMMARY_FILE)
    run_files.write_json(summary, {**run_files.read_json(summary), "bottlenecks": [
        {"rank": 1, "node_id": "node-1abcdefgh", "verdict": "straggler", "evidence": {"busy_ratio": 1.4823},
         "recommendation": "move 2 samples to rank 0"}]})
    out = outputs_of(bottlenecks, callbacks.update_page(bottlenecks, RunCatalog(own_runs), "offline:optimal", (), None))
    text = text_of(out["bottlenecks-table"])
    assert "straggler" in text and "busy_ratio=1.48" in text and "move 2 samples" in text


def test_gpu_page_explains_the_cpu_run(catalog):
    out = outputs_of(gpu, callbacks.update_page(gpu, catalog, "offline:static", (), None))
    assert "ran on CPUs" in out["gpu-metrics"].layout.annotations[0].text


def test_cluster_page_lists_profiled_nodes_and_devices(own_runs):
    run_files.write_json(os.path.join(own_runs, "static", run_files.NODES_FILE), {"nodes": [{
        "node_id": "node-0", "ip": "10.0.0.2", "hostname": "box-a", "status": "ok",
        "cpu": {"model": "EPYC", "physical_cores": 16, "logical_cores": 32, "ram_bytes": 64 * 2**30},
        "devices": [{"kind": "cpu", "name": "EPYC", "index": 0, "matmul_tflops_fp32": 1.2,
                     "memory_bandwidth_gbps": 40.0, "alpha_s": 0.001, "beta_s_per_sample": 0.0002}]}]})
    out = outputs_of(cluster, callbacks.update_page(cluster, RunCatalog(own_runs), "offline:static", (), None))
    assert "box-a" in text_of(out["cluster-nodes"]) and "EPYC, 16 cores, 64 GiB" in text_of(out["cluster-nodes"])
    assert "40" in text_of(out["cluster-devices"])
    assert [t.name for t in out["cluster-capabilities"].data] == ["fp32 TFLOP/s"]
    assert "not connected to a Ray cluster" in text_of(out["cluster-ray-nodes"])


def test_compare_page_puts_runs_side_by_side(catalog):
    out = outputs_of(compare, callbacks.update_page(compare, catalog, None, page_extra(compare), None))
    assert [t.name for t in out["compare-throughput"].data] == ["static", "optimal"]
    table = text_of(out["compare-table"])
    assert "static" in table and "optimal" in table and "target: eval metric" in table


def test_a_bad_run_key_gives_a_message_not_an_error(catalog):
    out = outputs_of(run, callbacks.update_page(run, catalog, "offline:../../etc", (), None))
    assert "is not a run under the runs folder" in text_of(out["message"])
    assert out["run-throughput"].layout.meta["empty"] and out["interval_disabled"] is True
    out = outputs_of(run, callbacks.update_page(run, catalog, None, (), None))
    assert "no run selected: choose a run in the list" in text_of(out["message"])


# ---- live pages: only the new points ---------------------------------------------------------

@pytest.fixture
def live(tmp_path):
    store = MetricsStore(str(tmp_path / "live-run"), "live-run", parquet_flush_interval_s=3600)
    os.makedirs(store.run_dir)
    store.begin_attempt(0, 2)
    catalog = RunCatalog(str(tmp_path), bridge=StoreBridge(store))
    return store, catalog


def refresh_page(page, catalog, state, extra=()):
    source = catalog.source("live:live-run")
    source._last_refresh = 0.0
    return outputs_of(page, callbacks.update_page(page, catalog, "live:live-run", extra, state))


def test_a_live_page_keeps_refreshing_and_appends_only_new_steps(live):
    store, catalog = live
    store.add(steps=make_steps(30).to_dict("records"))
    first = refresh_page(run, catalog, None)
    assert first["interval_disabled"] is False
    figure = first["run-throughput"]  # arrays as lists: plotly.js cannot extend base64 arrays
    assert isinstance(figure, dict) and isinstance(figure["data"][0]["x"], list) and len(figure["data"][0]["x"]) == 30
    store.add(steps=make_steps(5, first_step=30).to_dict("records"))
    second = refresh_page(run, catalog, first["state"])
    assert second["run-throughput"] is no_update
    update, indices = second["run-throughput.extendData"]
    assert indices == [0, 1] and len(update["x"][0]) == 5 and len(update["y"][1]) == 5
    quiet = refresh_page(run, catalog, second["state"])
    assert quiet["run-throughput"] is no_update and quiet["run-throughput.extendData"] is no_update


def test_a_live_page_redraws_when_the_plan_changes(live):
    store, catalog = live
    store.add_plan({"plan_version": 0, "first_global_step": 0, "attempt": 0, "local_batch_sizes": [6, 2]})
    store.add(steps=make_steps(20).to_dict("records"))
    first = refresh_page(ranks, catalog, None, ([0, 1],))
    store.add_plan({"plan_version": 1, "first_global_step": 20, "attempt": 0, "local_batch_sizes": [5, 3]})
    store.add(steps=make_steps(5, first_step=20, batches=(5, 3)).to_dict("records"))
    second = refresh_page(ranks, catalog, first["state"], ([0, 1],))
    assert isinstance(second["ranks-batch"], dict)  # a new marker: the figure itself
    assert second["ranks-throughput"] is no_update and second["ranks-throughput.extendData"] is not no_update


def test_partly_reported_steps_wait_until_every_rank_is_in(live):
    store, catalog = live
    store.add(steps=make_steps(10).to_dict("records"))
    first = refresh_page(run, catalog, None)
    rank0_only = make_steps(3, first_step=10)
    store.add(steps=rank0_only[rank0_only["rank"] == 0].to_dict("records"))
    second = refresh_page(run, catalog, first["state"])
    assert second["run-throughput.extendData"] is no_update


# ---- deliver, on its own ---------------------------------------------------------------------

def series_figure(n: int, append: bool = True, title: str = "t") -> go.Figure:
    df = frames.cluster_steps(make_steps(n))
    fig = figures.throughput_figure(df)
    fig.update_layout(title_text=title, meta={"append": append, "bucket_steps": 1})
    return fig


def test_deliver_sends_the_figure_first_then_only_new_points_then_nothing():
    figure, extend, state = callbacks.deliver(series_figure(10), None)
    assert isinstance(figure, dict) and extend is no_update
    assert figure["data"][0]["x"] == [float(v) for v in frames.cluster_steps(make_steps(10))["elapsed_s"]]
    figure, extend, state = callbacks.deliver(series_figure(13), state)
    assert figure is no_update and extend[1] == [0, 1] and len(extend[0]["x"][0]) == 3
    assert all(isinstance(v, float) for v in extend[0]["y"][0])  # plain lists, not base64
    figure, extend, _ = callbacks.deliver(series_figure(13), state)
    assert figure is no_update and extend is no_update


def test_deliver_sends_the_figure_when_old_points_or_the_layout_changed():
    _, _, state = callbacks.deliver(series_figure(10), None)
    assert isinstance(callbacks.deliver(series_figure(12, title="other"), state)[0], dict)
    assert isinstance(callbacks.deliver(series_figure(8), state)[0], dict)  # fewer points: redraw
    assert isinstance(callbacks.deliver(series_figure(8), state, extendable=False)[0], go.Figure)  # base64
    _, _, state = callbacks.deliver(series_figure(10, append=False), None)
    assert isinstance(callbacks.deliver(series_figure(12, append=False), state)[0], go.Figure)
    assert callbacks.deliver(series_figure(10, append=False), state)[0] is no_update


def test_a_figure_sent_as_base64_is_redrawn_not_extended():
    """plotly.js cannot extend base64 arrays: a finished-looking run that starts writing
    again gets its figure resent as lists, then increments."""
    _, _, state = callbacks.deliver(series_figure(10), None, extendable=False)
    figure, extend, state = callbacks.deliver(series_figure(12), state, extendable=True)
    assert isinstance(figure, dict) and extend is no_update
    figure, extend, _ = callbacks.deliver(series_figure(14), state, extendable=True)
    assert figure is no_update and len(extend[0]["x"][0]) == 2


def test_payload_of_an_increment_is_a_fraction_of_the_figure():
    _, _, state = callbacks.deliver(series_figure(200), None)
    full = callbacks.payload_bytes([series_figure(210)])
    increment = callbacks.payload_bytes(list(callbacks.deliver(series_figure(210), state)[:2]))
    assert increment < full / 5


def test_create_app_registers_a_callback_per_page(runs_dir):
    app = create_app(runs_dir)
    outputs = " ".join(app.callback_map)
    for page in PAGES:
        assert f"{page.NAME}-state.data" in outputs
    assert app.config.suppress_callback_exceptions and isinstance(app.catalog, RunCatalog)
