"""The app's data access: run keys that cannot escape --runs-dir, run discovery, tables
cached by modification time (parts of a running run read incrementally), offline and
live sources, the Ray bridge's failure modes, and the dashboard command's checks.
"""

from __future__ import annotations

import os
import time

import pytest

from hetero_ray.metrics.store import MetricsStore
from hetero_ray.reporting.run_source import OfflineRunSource, normalise_nodes
from hetero_ray.runs import run_files
from hetero_ray.runs.readers import escaping_links
from hetero_ray.runs.table_cache import TableCache
from hetero_ray_dashboards.catalog import RunCatalog
from hetero_ray_dashboards.live_source import LiveRunSource
from hetero_ray_dashboards.run_keys import RunNotFound, list_offline_runs, resolve_run_dir
from tests.cli import run_cli
from tests.fakes import StoreBridge
from tests.helpers import make_steps, write_run


# ---- run keys cannot leave --runs-dir ------------------------------------------------------

@pytest.fixture
def runs_dir(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "alpha")
    write_run(root / "group" / "beta")
    (root / "not-a-run").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "config.json").write_text("{}")  # looks like a run, but outside runs/
    return str(root)


@pytest.mark.parametrize("name", [
    "../secret", "alpha/../../secret", "..", ".", "", "/etc", "/", "~root", "alpha\\..\\..\\secret",
    "alpha//x", "alpha/./", "al\x00pha", "a" * 600, "not-a-run", "missing",
    "%2e%2e/secret",  # URL-encoded: taken literally, no such run
])
def test_run_names_that_escape_or_name_no_run_are_refused(runs_dir, name):
    with pytest.raises(RunNotFound):
        resolve_run_dir(runs_dir, name)


def test_a_symlink_out_of_the_runs_folder_is_refused(runs_dir, tmp_path):
    os.symlink(tmp_path / "secret", os.path.join(runs_dir, "link"))
    with pytest.raises(RunNotFound):
        resolve_run_dir(runs_dir, "link")
    assert "link" not in {e.name for e in list_offline_runs(runs_dir)}


def test_runs_under_the_folder_resolve(runs_dir):
    assert resolve_run_dir(runs_dir, "alpha") == os.path.realpath(os.path.join(runs_dir, "alpha"))
    assert resolve_run_dir(runs_dir, "group/beta").endswith(os.path.join("group", "beta"))


@pytest.mark.parametrize("key", ["offline:../secret", "offline:/etc", "live:anything", "alpha", None, 5, "offline:"])
def test_catalog_refuses_bad_keys(runs_dir, key):
    with pytest.raises(RunNotFound):
        RunCatalog(runs_dir).source(key)


def test_run_list_finds_nested_runs_and_their_status(runs_dir, tmp_path):
    write_run(os.path.join(runs_dir, "gamma"), finish=False)  # parts only, just written: running
    entries = {e.name: e for e in list_offline_runs(runs_dir)}
    assert set(entries) == {"alpha", "group/beta", "gamma"}
    assert entries["alpha"].status == "finished" and entries["gamma"].status == "running"
    assert entries["group/beta"].key == "offline:group/beta"
    assert list_offline_runs(str(tmp_path / "nothing-here")) == []


# ---- files inside a run cannot lead out of it -----------------------------------------------

def _outside_run(tmp_path, finish: bool = True) -> str:
    """A run directory outside --runs-dir, with a summary and nodes that are easy to recognise."""
    run_dir = write_run(tmp_path / ("outside" if finish else "outside-running"), finish=finish)
    run_files.write_json(os.path.join(run_dir, run_files.SUMMARY_FILE), {"status": "secret-status"})
    run_files.write_json(os.path.join(run_dir, run_files.NODES_FILE), {"nodes": [{"node_id": "secret-node"}]})
    return run_dir


def test_a_run_whose_files_are_symlinks_out_of_it_shows_none_of_them(runs_dir, tmp_path):
    outside = _outside_run(tmp_path)
    assert not RunCatalog(str(tmp_path)).source("offline:outside").steps().empty  # readable, where it is
    linked = os.path.join(runs_dir, "linked")
    os.makedirs(linked)
    names = sorted(os.listdir(outside))
    for name in names:
        os.symlink(os.path.join(outside, name), os.path.join(linked, name))
    source = RunCatalog(runs_dir).source("offline:linked")
    for table in (source.steps(), source.plans(), source.epochs(), source.decisions()):
        assert table.empty
    assert source.config() == {} and source.summary() is None and source.nodes() == []
    assert source.status() != "secret-status"
    assert {e.name: e.status for e in list_offline_runs(runs_dir)}["linked"] != "secret-status"
    notice = source.notice()
    assert notice and "symbolic links leading out of its directory" in notice
    assert all(name in notice for name in names[:5])
    assert RunCatalog(runs_dir).source("offline:alpha").notice() is None  # an ordinary run


def test_parts_folders_that_lead_out_of_the_run_are_not_read(runs_dir, tmp_path):
    outside = _outside_run(tmp_path, finish=False)  # parts only: a run still being written
    linked = os.path.join(runs_dir, "linked-parts")
    os.makedirs(os.path.join(linked, run_files.PARTS_DIR))
    run_files.write_json(os.path.join(linked, run_files.CONFIG_FILE), {"policy": "static"})
    os.symlink(os.path.join(outside, run_files.PARTS_DIR, "steps"), os.path.join(linked, run_files.PARTS_DIR, "steps"))
    os.symlink(os.path.join(outside, run_files.PARTS_DIR, "plans"), os.path.join(linked, "plans.parquet"))
    os.makedirs(os.path.join(linked, run_files.PARTS_DIR, "epochs"))
    outside_part = sorted(os.listdir(os.path.join(outside, run_files.PARTS_DIR, "epochs")))[0]
    os.symlink(os.path.join(outside, run_files.PARTS_DIR, "epochs", outside_part),
               os.path.join(linked, run_files.PARTS_DIR, "epochs", "part-00000001.parquet"))
    source = RunCatalog(runs_dir).source("offline:linked-parts")
    assert source.steps().empty and source.plans().empty and source.epochs().empty
    assert escaping_links(linked) == ["parts/epochs/part-00000001.parquet", "parts/steps", "plans.parquet"]
    assert "parts/steps" in source.notice()
    # The whole parts folder as a link out, and a link that stays inside the run: only the first is refused.
    os.remove(os.path.join(linked, "plans.parquet"))
    os.symlink(run_files.CONFIG_FILE, os.path.join(linked, "kept.json"))
    os.rename(os.path.join(linked, run_files.PARTS_DIR), os.path.join(linked, "old-parts"))
    os.symlink(os.path.join(outside, run_files.PARTS_DIR), os.path.join(linked, run_files.PARTS_DIR))
    source = RunCatalog(runs_dir).source("offline:linked-parts")
    assert source.steps().empty and source.epochs().empty
    assert escaping_links(linked) == ["parts"]
    assert source.config() == {"policy": "static"}


# ---- tables cached by modification time -----------------------------------------------------

def test_parts_of_a_running_run_are_read_incrementally(tmp_path):
    run_dir = str(tmp_path)
    store = MetricsStore(run_dir, "x", parquet_flush_interval_s=3600)
    store.begin_attempt(0, 2)
    cache = TableCache()
    store.add(steps=make_steps(5).to_dict("records"))
    store.flush()
    first, signature = cache.read(run_dir, "steps")
    assert len(first) == 10
    again, same = cache.read(run_dir, "steps")
    assert again is first and same == signature  # nothing changed: nothing read
    store.add(steps=make_steps(3, first_step=5).to_dict("records"))
    store.flush()
    grown, newer = cache.read(run_dir, "steps")
    assert len(grown) == 16 and newer != signature
    assert list(grown["global_step"].drop_duplicates()) == list(range(8))
    store.finalize()  # parts merged into steps.parquet
    merged, _ = cache.read(run_dir, "steps")
    assert len(merged) == 16


def test_rows_of_redone_steps_are_dropped_after_a_restart(tmp_path):
    run_dir = str(tmp_path)
    store = MetricsStore(run_dir, "x", parquet_flush_interval_s=3600)
    store.begin_attempt(0, 2)
    store.add(steps=make_steps(10).to_dict("records"))
    store.begin_attempt(6, 2)  # resumed from a checkpoint at step 6: steps 6..9 are redone
    store.add(steps=make_steps(4, first_step=6, attempt=1).to_dict("records"))
    store.flush()
    steps, _ = TableCache().read(run_dir, "steps")
    assert len(steps) == 20
    assert set(steps[steps["global_step"] >= 6]["attempt"]) == {1}


def test_offline_source_version_changes_with_the_files(runs_dir):
    source = RunCatalog(runs_dir).source("offline:alpha")
    version = source.version()
    assert source.version() == version
    time.sleep(0.01)
    run_files.write_json(os.path.join(source.run_dir, run_files.NODES_FILE), {"nodes": [{"node_id": "n"}]})
    assert source.version() != version
    assert source.nodes() == [{"node_id": "n"}]


def test_offline_bottlenecks_prefer_the_summary(runs_dir):
    source = RunCatalog(runs_dir).source("offline:alpha")
    path = os.path.join(source.run_dir, run_files.SUMMARY_FILE)
    summary = run_files.read_json(path)
    verdict = {"rank": 1, "node_id": "node-1", "verdict": "straggler", "evidence": {}, "recommendation": "move work"}
    run_files.write_json(path, {**summary, "bottlenecks": [verdict]})
    assert source.bottlenecks() == ([verdict], None)


def test_nodes_are_normalised():
    assert normalise_nodes({"nodes": [{"node_id": "a"}, "junk"]}) == [{"node_id": "a"}]
    assert normalise_nodes([{"node_id": "b"}]) == [{"node_id": "b"}]
    assert normalise_nodes(None) == [] and normalise_nodes("x") == []


# ---- live sources ---------------------------------------------------------------------------

@pytest.fixture
def live(tmp_path):
    store = MetricsStore(str(tmp_path / "live-run"), "live-run", parquet_flush_interval_s=3600)
    os.makedirs(store.run_dir, exist_ok=True)
    store.begin_attempt(0, 2)
    bridge = StoreBridge(store)
    source = LiveRunSource("live:live-run", "live-run", bridge, config={"epochs": 1})
    return store, bridge, source


def refresh(source):
    source._last_refresh = 0.0  # the throttle shares one round trip between browsers; not wanted here
    source.refresh()


def test_live_source_fetches_increments(live):
    store, bridge, source = live
    store.add(steps=make_steps(5).to_dict("records"))
    refresh(source)
    assert len(source.steps()) == 10 and source.version() == 1
    refresh(source)
    assert len(source.steps()) == 10 and source.version() == 1  # nothing new: same version
    store.add(steps=make_steps(2, first_step=5).to_dict("records"))
    refresh(source)
    assert len(source.steps()) == 14 and source.version() == 2
    assert source.status() == "running" and source.active()


def test_live_source_keeps_a_bounded_window(live):
    store, bridge, source = live
    source._max_rows = 8
    store.add(steps=make_steps(10).to_dict("records"))
    refresh(source)
    steps = source.steps()
    assert len(steps) == 8 and steps["global_step"].min() == 6
    assert "most recent 8 step rows" in source.notice()


def test_live_source_says_when_the_run_ended_or_the_cluster_is_gone(live):
    store, bridge, source = live
    store.add(steps=make_steps(2).to_dict("records"))
    refresh(source)
    bridge.down = True
    refresh(source)
    assert "lost connection to the Ray cluster" in source.notice() and len(source.steps()) == 4
    bridge.down, bridge.gone = False, True
    refresh(source)
    assert source.status() == "finished" and not source.active() and "has ended" in source.notice()


def test_catalog_lists_live_runs_first_and_maps_an_ended_one_to_its_directory(live, tmp_path):
    store, bridge, _ = live
    catalog = RunCatalog(str(tmp_path), bridge=bridge)
    write_run(store.run_dir)  # the live run's directory is under runs_dir
    entries = catalog.entries()
    assert entries[0].key == "live:live-run" and entries[0].live
    source = catalog.source("live:live-run")
    assert source.offline_key == "offline:live-run" and source.config()["policy"] == "static"
    bridge.gone = True
    refresh(source)
    assert catalog.successor("live:live-run") == "offline:live-run"


# ---- the Ray bridge and the dashboard command -----------------------------------------------

def test_bridge_refuses_queries_that_are_not_store_reads():
    from hetero_ray_dashboards.ray_bridge import RayBridge

    with pytest.raises(ValueError, match="not a metrics-store query"):
        RayBridge("127.0.0.1:1").call("exp", "finalize")


def test_bridge_to_an_address_where_nothing_listens_fails_fast():
    from hetero_ray_dashboards.ray_bridge import BridgeUnavailable, RayBridge

    bridge = RayBridge("127.0.0.1:1", connect_timeout_s=5)
    started = time.monotonic()
    # "cannot reach" is the answer of the connection check before Ray: fast by construction
    with pytest.raises(BridgeUnavailable, match="cannot reach a Ray cluster at 127.0.0.1:1"):
        bridge.start(wait=True)
    print(f"\nthe bridge gave up {time.monotonic() - started:.1f} s after its start")  # a figure, not a check
    assert bridge.status()["state"] == "lost"
    with pytest.raises(BridgeUnavailable, match="lost connection to the Ray cluster at 127.0.0.1:1; retrying"):
        bridge.experiments()
    bridge.close()


def test_dashboard_command_address_choice(monkeypatch):
    from hetero_ray.cli import dashboard

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(dashboard, "local_ray_running", lambda: False)
    assert dashboard.resolve_address("10.0.0.5:6379") == ("10.0.0.5:6379", "--address")
    assert dashboard.resolve_address(None)[0] is None
    monkeypatch.setattr(dashboard, "local_ray_running", lambda: True)
    assert dashboard.resolve_address(None)[0] == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.6:6379")
    assert dashboard.resolve_address(None) == ("10.0.0.6:6379", "RAY_ADDRESS")



def test_dashboard_command_rejects_a_bad_port(tmp_path, capsys):
    code, _, err = run_cli(["dashboard", "--runs-dir", str(tmp_path), "--port", "70000"], capsys)
    assert code == 2 and "--port must be in 1..65535" in err


def test_dashboard_command_fails_fast_on_an_unreachable_address(tmp_path, capsys):
    code, _, err = run_cli(["dashboard", "--runs-dir", str(tmp_path), "--address", "127.0.0.1:1"], capsys)
    assert code == 2 and "cannot reach a Ray cluster at 127.0.0.1:1" in err


def test_dashboard_command_warns_when_exposed_and_serves_offline(tmp_path, capsys, monkeypatch):
    from hetero_ray.cli import dashboard
    from hetero_ray_dashboards import app as app_module

    served = {}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(dashboard, "local_ray_running", lambda: False)
    monkeypatch.setattr(app_module, "serve", lambda app, host, port: served.update(host=host, port=port, app=app))
    code, out, err = run_cli(["dashboard", "--runs-dir", str(tmp_path), "--host", "0.0.0.0", "--port", "8123"], capsys)
    assert code == 0 and served["host"] == "0.0.0.0" and served["port"] == 8123
    assert "WARNING: listening on 0.0.0.0" in err and "ssh -L 8123:127.0.0.1:8123" in err
    assert "offline only" in out
    code, out, err = run_cli(["dashboard", "--runs-dir", str(tmp_path)], capsys)
    assert code == 0 and served["host"] == "127.0.0.1" and "WARNING" not in err


def test_offline_source_is_an_offline_run_source(runs_dir):
    assert isinstance(RunCatalog(runs_dir).source("offline:group/beta"), OfflineRunSource)


@pytest.mark.ray
def test_bridge_says_it_lost_the_cluster_and_reconnects(ray_session):
    """The child holding the Ray connection dies (as it does ~60 s after a GCS is gone):
    queries fail at once with the retrying message, and a new child takes over."""
    from hetero_ray_dashboards.ray_bridge import BridgeUnavailable, RayBridge

    address = ray_session.get_runtime_context().gcs_address
    bridge = RayBridge(address, retry_s=1.0)
    bridge.start(wait=True)
    try:
        assert isinstance(bridge.experiments(), list) and bridge.status()["state"] == "connected"
        bridge._process.kill()
        bridge._process.wait(10)
        deadline = time.monotonic() + 60  # the supervisor notices within retry_s; a request may notice first
        with pytest.raises(BridgeUnavailable, match=f"lost connection to the Ray cluster at {address}; retrying"):
            while time.monotonic() < deadline:  # past it: "DID NOT RAISE"
                bridge.experiments()
                time.sleep(0.25)
        deadline = time.monotonic() + 60
        while bridge.status()["state"] != "connected":
            assert time.monotonic() < deadline, bridge.status()
            time.sleep(0.5)
        assert isinstance(bridge.experiments(), list)
    finally:
        bridge.close()
