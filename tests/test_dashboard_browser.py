"""The app in a real browser (headless Debian chromium through playwright).

Offline: two real training runs (``static`` and ``optimal``, emulated speeds 1 and 0.5) on
the session's Ray, one app server for the module; every page loads with their data, draws
the expected traces, follows the run and rank selection, and logs no console error.
Live: a training job runs on the session's Ray while the app (connected through its Ray
bridge) shows it; new steps appear without a reload.

Screenshots go to ``test-artifacts/``. The browser is the system's chromium, which
``make setup-browser`` installs (never ``playwright install``).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

CHROMIUM = "/usr/bin/chromium"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.path.join(REPO_ROOT, "test-artifacts")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]
TIMEOUT_MS = 20_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.ray,  # the runs it shows are trained for real on the session's Ray
    pytest.mark.slow,  # two real runs before the first page (~75 s), then a browser
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing: run `make setup-browser` "
                                                            "(Debian's chromium; never `playwright install`)"),
]


# ---- fixtures: real runs, one server, one browser ------------------------------------------

def train(config, retries: int = 1):
    """Trains for real. Retried once when Ray Train's placement-group cleaner tore the
    workers down ("placement group was removed"): with the session Ray's dashboard off it
    sometimes cannot tell that the controller is alive on a loaded 2-core machine."""
    import shutil

    from hetero_ray.builtin.driver import run_training
    from hetero_ray.errors import TrainingFailed

    try:
        return run_training(config, emit=lambda line: None)
    except TrainingFailed as e:
        if retries <= 0 or "placement group was removed" not in str(e):
            raise
        shutil.rmtree(os.path.join(config.storage_path, config.name), ignore_errors=True)
        return train(config, retries - 1)


def config(output_dir: str, name: str, **overrides):
    from hetero_ray.builtin.config import TrainConfig

    values = dict(model="mlp", dataset="synthetic_image", num_samples=512, eval_samples=64, global_batch_size=32,
                  epochs=2, num_workers=2, storage_path=output_dir, checkpoint_every=1000, max_failures=0,
                  emulate_speeds=[1.0, 0.5], rebalance_interval=8, name=name)
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def runs_dir(ray_session, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("runs"))
    train(config(root, "static", policy="static"))  # profiled: the cluster page shows its nodes
    train(config(root, "optimal", policy="optimal", profile=False))  # its decisions come from its steps
    return root


class Server:
    def __init__(self, app):
        from werkzeug.serving import make_server

        self.app = app
        self._server = make_server("127.0.0.1", 0, app.server, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self):
        self._server.shutdown()


@pytest.fixture(scope="module")
def server(runs_dir):
    from hetero_ray_dashboards.app import create_app

    server = Server(create_app(runs_dir))  # offline: no address
    yield server
    server.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    os.makedirs(ARTIFACTS, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A fresh tab that fails the test on any console error or uncaught exception."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    yield tab
    context.close()
    assert errors == [], f"console errors: {errors}"


def shot(tab, name: str) -> None:
    tab.wait_for_timeout(400)  # let plotly finish its transitions
    tab.screenshot(path=os.path.join(ARTIFACTS, f"{name}.png"), full_page=True)


def legend(tab, graph_id: str) -> list[str]:
    return tab.eval_on_selector_all(f"#{graph_id} .legendtext", "els => els.map(e => e.textContent)")


def points(tab, graph_id: str, trace: int = 0) -> int:
    """Points plotly computed for a trace (plotly ≥ 6 ships arrays base64: count what it drew)."""
    return tab.evaluate("([id, i]) => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');"
                        " return gd && gd.calcdata && gd.calcdata[i] ? gd.calcdata[i].length : 0; }",
                        [graph_id, trace])


def wait_legend(tab, graph_id: str, expected: list[str]) -> None:
    tab.wait_for_function("([id, n]) => document.querySelectorAll('#' + id + ' .legendtext').length === n",
                          arg=[graph_id, len(expected)])
    assert legend(tab, graph_id) == expected


def wait_text(tab, selector: str, text: str) -> None:
    tab.wait_for_selector(f"{selector}:has-text({text!r})")


def choose_run(tab, label_part: str) -> None:
    """Dash 4's dropdown: a button that opens a list of role=option items."""
    tab.click("#run-select")
    tab.locator("[role=option]", has_text=label_part).first.click()


# ---- offline: one test per page ------------------------------------------------------------

def test_run_page(server, page):
    page.goto(f"{server.url}/run?run=offline:static")
    wait_legend(page, "run-throughput", ["achieved", "ideal (no waiting)"])
    kpis = page.inner_text("#run-kpis")
    assert "static" in kpis and "finished" in kpis and "step 32 of 32" in kpis
    assert points(page, "run-throughput") == 32
    wait_legend(page, "run-loss", ["train loss", "eval loss"])
    page.wait_for_selector("#run-eval .scatterlayer .trace")
    shot(page, "run")


def test_choosing_another_run_updates_the_page(server, page):
    page.goto(f"{server.url}/run?run=offline:static")
    wait_text(page, "#run-kpis", "static")
    choose_run(page, "optimal")
    wait_text(page, "#run-kpis", "optimal")
    assert page.url.endswith("/run?run=offline:static")  # no navigation: the page updated in place
    wait_legend(page, "run-throughput", ["achieved", "ideal (no waiting)"])


def test_ranks_page_follows_the_rank_selection(server, page):
    page.goto(f"{server.url}/ranks?run=offline:optimal")
    wait_legend(page, "ranks-throughput", ["rank 0", "rank 1"])
    assert legend(page, "ranks-breakdown") == ["data", "forward", "backward", "emulation pad", "optimizer", "waiting"]
    assert page.locator("#ranks-busy-wait .cartesianlayer .subplot").count() == 2  # a row per rank
    assert points(page, "ranks-busy-wait") > 0
    shot(page, "ranks")
    page.get_by_label("rank 1").uncheck()
    wait_legend(page, "ranks-throughput", ["rank 0"])
    assert page.locator("#ranks-table tbody tr").count() == 1


def test_cluster_page(server, page, runs_dir):
    from hetero_ray.runs import run_files

    # The runs were trained with profiling on (the default): nodes.json lists every device.
    nodes = run_files.read_json(os.path.join(runs_dir, "static", run_files.NODES_FILE))["nodes"]
    profiled_devices = sum(len(n.get("devices") or []) for n in nodes)
    assert profiled_devices >= 1, nodes
    page.goto(f"{server.url}/cluster?run=offline:static")
    page.wait_for_selector("#cluster-nodes tbody tr")
    text = page.inner_text("#page")
    assert "not connected to a Ray cluster" in text
    assert "No node profile in this run" not in text
    assert page.locator("#cluster-devices tbody tr").count() == profiled_devices
    page.wait_for_selector("#cluster-rank-speed .bars .point")
    assert page.locator("#cluster-rank-speed .bars .point").count() == 2  # a bar per rank
    shot(page, "cluster")


def test_balancer_page(server, page, runs_dir):
    from hetero_ray.runs import run_files
    from hetero_ray_dashboards.pages.balancer import DECISIONS_SHOWN

    # Emulated speeds 1 and 0.5 under --policy optimal: the balancer decides at the first
    # rebalance point its records reach, and every decision is in decisions.parquet.
    decided = len(run_files.read_table(os.path.join(runs_dir, "optimal"), "decisions"))
    assert decided >= 1, "the optimal run recorded no balancer decision: the page has nothing to show"
    page.goto(f"{server.url}/balancer?run=offline:optimal")
    wait_legend(page, "balancer-efficiency", ["efficiency"])
    assert points(page, "balancer-efficiency") == 32
    page.wait_for_selector("#balancer-plans tbody tr")
    page.wait_for_selector("#balancer-decisions .scatterlayer .point")
    assert page.locator("#balancer-decisions .scatterlayer .point").count() == decided  # a marker per decision
    assert page.locator("#balancer-table tbody tr").count() == min(decided, DECISIONS_SHOWN)
    shot(page, "balancer")


def test_bottlenecks_page(server, page):
    page.goto(f"{server.url}/bottlenecks?run=offline:optimal")
    page.wait_for_selector("#bottlenecks-table .table, #bottlenecks-table .empty")
    # A finished run with steps has a verdict for each of its two ranks.
    assert page.locator("#bottlenecks-table tbody tr").count() == 2
    assert "recommendation" in page.inner_text("#bottlenecks-table thead")
    shot(page, "bottlenecks")


def test_gpu_page_explains_a_cpu_run(server, page):
    page.goto(f"{server.url}/gpu?run=offline:static")
    wait_text(page, "#gpu-metrics", "ran on CPUs")
    shot(page, "gpu")


def test_compare_page(server, page):
    page.goto(f"{server.url}/compare")
    wait_legend(page, "compare-throughput", ["optimal", "static"])
    assert page.locator("#compare-table tbody tr").count() == 2
    wait_legend(page, "compare-accuracy", ["optimal", "static"])
    shot(page, "compare")


def test_a_url_cannot_open_a_folder_outside_the_runs_dir(server, page):
    page.goto(f"{server.url}/run?run=offline:../../../etc")
    wait_text(page, "#run-kpis", "finished")
    assert "etc" not in page.inner_text("#run-kpis")  # the list's first run is shown instead
    page.goto(f"{server.url}/no-such-page")
    page.wait_for_selector("text=Page not found")


# ---- live --------------------------------------------------------------------------------

@pytest.mark.slow
def test_live_run_shows_new_steps_without_a_reload(ray_session, fast_config, browser):
    import ray

    from hetero_ray_dashboards.app import create_app

    # ~100 steps of ~0.2-0.3 s: the job runs for a while after its first step.
    cfg = fast_config(num_samples=3200, global_batch_size=32, emulate_speeds=[0.1, 0.05], policy="optimal",
                      rebalance_interval=10, name="live-browser")
    failure: dict = {}

    def job():
        try:
            train(cfg)
        except Exception as e:  # noqa: BLE001 - reported by the test
            failure["error"] = e

    trainer = threading.Thread(target=job, daemon=True, name="live-training")
    trainer.start()
    app = create_app(cfg.storage_path, address=ray.get_runtime_context().gcs_address)
    server = Server(app)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    extend_responses: list[int] = []

    def on_response(response):
        if "_dash-update-component" in response.url:
            try:
                body = response.text()
            except Exception:  # noqa: BLE001 - a response the page no longer needs
                return
            if '"extendData"' in body:
                extend_responses.append(len(body))

    tab.on("response", on_response)
    try:
        deadline = time.monotonic() + 120  # worker startup is slow on 2 cores
        while "live-browser" not in app.catalog.live_experiments(0):
            assert trainer.is_alive() or "error" not in failure, failure
            assert time.monotonic() < deadline, "the live run never appeared"
            time.sleep(0.5)
        tab.goto(f"{server.url}/run?run=live:live-browser")
        wait_text(tab, "#connection-status", "live: connected")
        deadline = time.monotonic() + 90
        while points(tab, "run-throughput") < 2:  # the first steps are on the page
            assert "error" not in failure, f"the training job failed: {failure['error']}"
            assert trainer.is_alive() and time.monotonic() < deadline, "no steps reached the page"
            time.sleep(0.5)
        tab.evaluate("() => { window.__no_reload = true; }")
        before = points(tab, "run-throughput")
        tab.wait_for_function("([n]) => { const gd = document.querySelector('#run-throughput .js-plotly-plot');"
                              " return gd.calcdata[0].length >= n + 5; }", arg=[before], timeout=30_000)
        after = points(tab, "run-throughput")
        assert after >= before + 5
        assert tab.evaluate("() => window.__no_reload === true")  # same document: no reload
        assert extend_responses, "new points should arrive as extendData increments"
        assert "live-browser" in tab.inner_text("#run-kpis") and "running" in tab.inner_text("#run-kpis")
        shot(tab, "live-run")
        print(f"\nlive: {before} → {after} points; increments of {min(extend_responses)}–{max(extend_responses)} bytes")
    finally:
        context.close()
        trainer.join(timeout=180)
        server.close()
        app.catalog.bridge.close()
    assert "error" not in failure, failure
    assert errors == [], f"console errors: {errors}"
