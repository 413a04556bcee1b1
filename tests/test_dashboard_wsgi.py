"""The app's production WSGI entry (dashboards/wsgi.py): the WSGI callable serves the app
over a runs folder, ``application`` is made from the environment when a server asks for
it, and ``python -m hetero_ray_dashboards.wsgi`` serves through waitress on 127.0.0.1 by
default (that test runs where waitress is installed) or says how to get it. No Ray."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from hetero_ray_dashboards import wsgi
from tests.helpers import free_port


def test_the_wsgi_callable_serves_the_app(tmp_path):
    client = wsgi.make_application(str(tmp_path)).test_client()
    page = client.get("/")
    assert page.status_code == 200 and b"hetero_ray" in page.data
    assert client.get("/_dash-layout").status_code == 200


def test_application_is_made_from_the_environment_when_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv(wsgi.RUNS_DIR_ENV_VAR, str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    module = importlib.reload(wsgi)
    assert "application" not in vars(module)  # nothing is built at import
    application = module.application
    assert callable(application) and module.application is application
    assert application.test_client().get("/").status_code == 200


def test_without_waitress_it_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "waitress", None)  # import waitress raises ImportError
    assert wsgi.main(["--runs-dir", str(tmp_path)]) == 2
    assert "pip install waitress" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("waitress") is None, reason="waitress not installed")
def test_it_serves_through_waitress_on_loopback_by_default(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    server = subprocess.Popen([sys.executable, "-m", "hetero_ray_dashboards.wsgi", "--runs-dir", str(tmp_path),
                               "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
                    assert response.status == 200 and b"hetero_ray" in response.read()
                break
            except OSError:
                assert server.poll() is None, server.stdout.read()
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.2)
        listening = {c.laddr.ip for c in psutil.Process(server.pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert listening == {"127.0.0.1"}  # loopback only, not every interface
    finally:
        server.terminate()
        server.communicate(timeout=30)
