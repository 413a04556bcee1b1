"""The performance app for a production WSGI server, instead of Werkzeug's development
server that ``hetero-ray dashboard`` runs.

    pip install waitress
    python -m hetero_ray_dashboards.wsgi --runs-dir runs          # http://127.0.0.1:8050
    python -m hetero_ray_dashboards.wsgi --runs-dir runs --address auto --threads 8

That runs waitress (pure Python, threads in one process: the app's one connection to Ray
and its caches live in that process, which a forking server would multiply), bound to
127.0.0.1 unless ``--host`` says otherwise (and then it warns: the app has no login).
Any other WSGI server takes ``hetero_ray_dashboards.wsgi:application``, configured by
``HETERO_RAY_RUNS_DIR`` (default ``runs``) and ``RAY_ADDRESS`` (live runs; unset: offline);
bind it to 127.0.0.1 yourself, e.g.
``waitress-serve --listen=127.0.0.1:8050 hetero_ray_dashboards.wsgi:application``
(waitress-serve's own default is every interface).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from hetero_ray_dashboards.app import create_app

RUNS_DIR_ENV_VAR = "HETERO_RAY_RUNS_DIR"
DEFAULT_HOST = "127.0.0.1"  # only this machine; reach it from elsewhere through ssh -L
DEFAULT_PORT = 8050
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def make_application(runs_dir: Optional[str] = None, address: Optional[str] = None):
    """The app's WSGI callable (its Flask server) over ``runs_dir``, live from ``address``."""
    runs_dir = runs_dir or os.environ.get(RUNS_DIR_ENV_VAR) or "runs"
    return create_app(runs_dir, address=address).server


def __getattr__(name: str):
    # `application` is made when a WSGI server first asks for it, not at import.
    if name == "application":
        app = make_application(address=os.environ.get("RAY_ADDRESS") or None)
        globals()["application"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetero_ray_dashboards.wsgi", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", default=os.environ.get(RUNS_DIR_ENV_VAR, "runs"),
                        help="folder of run directories; the app opens nothing outside it (default %(default)s)")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="Ray cluster for live runs (HOST:PORT, auto, ray://…); default RAY_ADDRESS, else offline")
    parser.add_argument("--host", default=DEFAULT_HOST, help="interface to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="(default %(default)s)")
    parser.add_argument("--threads", type=int, default=4, help="waitress worker threads (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        import waitress
    except ImportError:
        print("python -m hetero_ray_dashboards.wsgi: error: waitress is not installed; `pip install waitress`, "
              "or use `hetero-ray dashboard` (Werkzeug's development server)", file=sys.stderr)
        return 2
    if args.host not in LOCAL_HOSTS:
        print(f"[dashboard] WARNING: listening on {args.host}: anyone who can reach port {args.port} there can "
              "see your runs (the app has no login).", file=sys.stderr)
    application = make_application(args.runs_dir, args.address)
    print(f"[dashboard] waitress on http://{args.host}:{args.port}/ (runs from {os.path.abspath(args.runs_dir)})",
          flush=True)
    waitress.serve(application, host=args.host, port=args.port, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
