"""``hetero-ray dashboard``: the performance app over a runs folder (and a live cluster).

    hetero-ray dashboard --runs-dir runs                  # offline; live too if Ray runs here
    hetero-ray dashboard --address auto --runs-dir runs   # on the `ray start --head` machine
    ssh -L 8050:127.0.0.1:8050 HEAD                       # then open http://127.0.0.1:8050

Which cluster: ``--address``, else ``RAY_ADDRESS``, else ``auto`` when a Ray cluster runs
on this machine; otherwise offline only (said at start). The app never starts a Ray of
its own, and only opens run directories under ``--runs-dir``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from hetero_ray.constants import CONNECT_TIMEOUT_S_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S, env_float
from hetero_ray.errors import UserError

HELP = "open the performance app (live runs through Ray, finished runs from --runs-dir)"
DEFAULT_HOST = "127.0.0.1"  # only this machine; reach it from elsewhere through ssh -L
DEFAULT_PORT = 8050
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
AUTO_CONNECT_TIMEOUT_S = 10.0  # a cluster found on this machine answers fast or is not ours


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="Ray cluster to show running experiments from (HOST:PORT, auto, "
                                          "ray://…); default RAY_ADDRESS, or auto when Ray runs on this machine")
    parser.add_argument("--runs-dir", default="runs", help="folder of run directories; the app opens nothing "
                                                           "outside it (default %(default)s)")
    parser.add_argument("--host", default=DEFAULT_HOST, help="interface to listen on (default %(default)s: this "
                                                             "machine only; anything else exposes the app)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default %(default)s)")


def resolve_address(address: Optional[str]) -> tuple[Optional[str], str]:
    """The cluster address to use and how it was chosen (for the start-up line)."""
    if address:
        return address, "--address"
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if local_ray_running():
        return "auto", "a Ray cluster runs on this machine"
    return None, "no --address, no RAY_ADDRESS and no Ray cluster on this machine"


def local_ray_running() -> bool:
    """Whether a Ray cluster's processes run on this machine (what address='auto' finds)."""
    try:
        from ray._private.services import find_gcs_addresses

        return bool(find_gcs_addresses())
    except Exception:  # noqa: BLE001 - a Ray without these internals: treat as none
        return False


def check_args(args: argparse.Namespace) -> None:
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be in 1..65535; got {args.port}")
    if not os.path.isdir(args.runs_dir):
        if os.path.exists(args.runs_dir):
            raise UserError(f"--runs-dir {args.runs_dir} is not a folder")
        # An empty app that says how to start a run is more useful than an error.
        print(f"[dashboard] {args.runs_dir} does not exist yet; runs written there will appear "
              f"(start one with `hetero-ray train --storage-path {args.runs_dir}`)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    check_args(args)
    from hetero_ray_dashboards.app import create_app, serve
    from hetero_ray_dashboards.ray_bridge import BridgeUnavailable, RayBridge

    address, why = resolve_address(args.address)
    bridge = None
    if address is None:
        print(f"[dashboard] offline only: {why}. Runs under {args.runs_dir} are shown from their files; "
              "pass --address HOST:PORT (or run on the `ray start --head` machine) for live runs.")
    else:
        print(f"[dashboard] connecting to the Ray cluster at {address} ({why})…", flush=True)
        chosen = why in ("--address", "RAY_ADDRESS")
        timeout_s = env_float(CONNECT_TIMEOUT_S_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S) if chosen else AUTO_CONNECT_TIMEOUT_S
        bridge = RayBridge(address, connect_timeout_s=timeout_s)
        try:
            bridge.start(wait=True)
        except BridgeUnavailable as e:
            bridge.close()
            if chosen:  # asked for: fail before serving anything
                raise UserError(f"{str(e).rstrip('.?')} — check the address (the head's GCS port, 6379 by "
                                "default), or leave out --address to browse --runs-dir offline") from None
            print(f"[dashboard] offline only: found a Ray cluster here but could not join it ({e}); pass "
                  "--address to choose one", file=sys.stderr)
            bridge = None
        else:
            print(f"[dashboard] live: connected to {address}")
    if args.host not in LOCAL_HOSTS:
        print(f"[dashboard] WARNING: listening on {args.host}: anyone who can reach port {args.port} there can "
              "see your runs (the app has no login). Prefer the default 127.0.0.1 with "
              f"`ssh -L {args.port}:127.0.0.1:{args.port} THIS_HOST`.", file=sys.stderr)
    app = create_app(args.runs_dir, bridge=bridge)
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    print(f"[dashboard] open http://{shown}:{args.port}/  (runs from {os.path.abspath(args.runs_dir)}; Ctrl-C stops)",
          flush=True)
    try:
        serve(app, args.host, args.port)
    except OSError as e:  # the port is taken, or the host is not an address of this machine
        raise UserError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); pass another --port "
                        "or --host") from None
    finally:
        if bridge is not None:
            bridge.close()
    return 0
