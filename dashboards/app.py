"""``create_app``: the Dash app over a runs folder and, optionally, a Ray cluster."""

from __future__ import annotations

import os
from typing import Optional

import dash

from hetero_ray_dashboards import callbacks, layout
from hetero_ray_dashboards.catalog import RunCatalog
from hetero_ray_dashboards.pages import PAGES

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")


def create_app(runs_dir: str, address: Optional[str] = None, *, bridge=None) -> dash.Dash:
    """The app for the runs under ``runs_dir``.

    Args:
        runs_dir: the only folder whose run directories the app opens.
        address: a Ray cluster to show running experiments from (HOST:PORT, ``auto``,
            ``ray://…``); None for offline only. The connection is made once, here, by a
            child process (see :mod:`hetero_ray_dashboards.ray_bridge`); an address that does not
            answer raises :class:`~hetero_ray_dashboards.ray_bridge.BridgeUnavailable`.
        bridge: an already started bridge (the CLI starts it first to fail fast).
    """
    if bridge is None and address:
        from hetero_ray_dashboards.ray_bridge import RayBridge

        bridge = RayBridge(address)
        bridge.start(wait=True)
    catalog = RunCatalog(runs_dir, bridge=bridge)
    app = dash.Dash(
        __name__,
        title="hetero_ray",
        assets_folder=ASSETS_DIR,
        suppress_callback_exceptions=True,  # pages come and go with the URL
        serve_locally=True,  # plotly.js and Dash's bundles from this server: no CDN, works offline
        update_title=None,
    )
    # Without this Dash fetches a plotly.com URL to compare versions (a console error offline).
    app.enable_dev_tools(debug=False, dev_tools_ui=False, dev_tools_props_check=False,
                         dev_tools_disable_version_check=True, dev_tools_hot_reload=False)
    app.layout = layout.shell(PAGES)
    callbacks.register(app, catalog)
    app.catalog = catalog  # tests and the CLI reach the data through the app
    return app


def serve(app: dash.Dash, host: str, port: int) -> None:
    """Serves until interrupted. The Flask reloader stays off: it forks, and would
    start a second connection to Ray."""
    app.run(host=host, port=port, debug=False, use_reloader=False, dev_tools_disable_version_check=True)
