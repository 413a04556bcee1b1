"""The app's one connection to Ray, held by a child process.

A Ray driver process exits about 60 s after its cluster's GCS goes away ("Failed to
connect to GCS within 60 seconds … The program will terminate"; checked here with Ray
2.60). A web server that called ``ray.init`` itself would die with the cluster. So the
app never does: a child process (``python -m hetero_ray_dashboards.ray_bridge``, a fresh
interpreter: no fork of a threaded server, no re-import of the caller's main module)
connects once and answers a fixed set of queries over a socket pair. When the child dies or stops answering, the app says
"lost connection to the Ray cluster at ADDR; retrying" and a supervisor thread starts a
new child every ``retry_s`` — never a new local Ray: the child only joins an address.

Queries (all read-only):
    experiments                names of running experiments (their metrics-store actors)
    updates(exp, cursors)      ``MetricsStore.updates_since`` of that experiment
    call(exp, method, kwargs)  one of :data:`STORE_QUERIES` on its metrics store
    nodes                      the cluster's nodes (id, address, alive, resources)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Optional

STORE_QUERIES = frozenset({"info", "rank_summaries", "plan_history", "capabilities"})
DEFAULT_CONNECT_TIMEOUT_S = 20.0  # ray.init to a remote head takes a few seconds here
DEFAULT_CALL_TIMEOUT_S = 10.0  # a query that takes longer means the cluster is in trouble
DEFAULT_RETRY_S = 5.0  # between reconnection attempts
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ray's own log lines from the child (connection retries, warnings) go to this process's
# stderr unless HETERO_RAY_DASHBOARD_QUIET_RAY=1.
_QUIET = os.environ.get("HETERO_RAY_DASHBOARD_QUIET_RAY") == "1"


class BridgeUnavailable(RuntimeError):
    """No connection to Ray right now; the message says why and that it is retrying."""


class ExperimentGone(LookupError):
    """The experiment's metrics store is not (or no longer) running."""


class RayBridge:
    """The parent side: thread-safe requests to the child, with reconnection."""

    def __init__(self, address: str, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, retry_s: float = DEFAULT_RETRY_S):
        self.address = address
        self._connect_timeout_s = connect_timeout_s
        self._call_timeout_s = call_timeout_s
        self._retry_s = retry_s
        self._lock = threading.Lock()  # one request on the pipe at a time
        self._process: Optional[subprocess.Popen] = None
        self._conn = None
        self._state = "connecting"
        self._error: Optional[str] = None
        self._ever_connected = False
        self._stop = threading.Event()
        self._supervisor: Optional[threading.Thread] = None

    # ---- lifecycle ------------------------------------------------------------------

    def start(self, wait: bool = True) -> None:
        """Connects (``wait``: in this thread, raising on failure) and keeps reconnecting."""
        if wait:
            self._spawn()
            if self._state != "connected":
                raise BridgeUnavailable(self._error or f"cannot connect to the Ray cluster at {self.address}")
        self._supervisor = threading.Thread(target=self._supervise, daemon=True, name="ray-bridge")
        self._supervisor.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._kill()

    def status(self) -> dict[str, Any]:
        """``state`` (connecting | connected | lost), ``address`` and a message for people."""
        if self._state == "connected":
            message = f"live: connected to the Ray cluster at {self.address}"
        elif self._state == "connecting" and not self._ever_connected:
            message = f"connecting to the Ray cluster at {self.address}…"
        else:
            message = (f"lost connection to the Ray cluster at {self.address}; retrying every "
                       f"{self._retry_s:.0f} s" + (f" ({self._error})" if self._error else ""))
        return {"state": self._state, "address": self.address, "message": message}

    # ---- queries --------------------------------------------------------------------

    def experiments(self) -> list[str]:
        return self.request("experiments")

    def updates(self, experiment: str, cursors: dict[str, int], limit: int = 50_000) -> dict:
        return self.request("updates", experiment, cursors, limit)

    def call(self, experiment: str, method: str, **kwargs: Any) -> Any:
        if method not in STORE_QUERIES:
            raise ValueError(f"{method!r} is not a metrics-store query ({', '.join(sorted(STORE_QUERIES))})")
        return self.request("call", experiment, method, kwargs)

    def nodes(self) -> list[dict]:
        return self.request("nodes")

    def request(self, op: str, *args: Any) -> Any:
        if self._state != "connected":  # say so at once, also while a reconnection is under way
            raise BridgeUnavailable(self.status()["message"])
        with self._lock:
            if self._state != "connected" or self._conn is None:
                raise BridgeUnavailable(self.status()["message"])
            try:
                self._conn.send((op, args))
                if not self._conn.poll(self._call_timeout_s):
                    raise TimeoutError(f"no answer within {self._call_timeout_s:.0f} s")
                kind, value = self._conn.recv()
            except (OSError, EOFError, TimeoutError) as e:
                self._lose(str(e) or type(e).__name__)
                raise BridgeUnavailable(self.status()["message"]) from None
        if kind == "ok":
            return value
        if kind == "gone":
            raise ExperimentGone(value)
        if kind == "lost":  # the child's Ray calls fail: the cluster is unreachable
            with self._lock:
                self._lose(value)
            raise BridgeUnavailable(self.status()["message"])
        raise RuntimeError(value)

    # ---- internals ------------------------------------------------------------------

    def _supervise(self) -> None:
        while not self._stop.wait(self._retry_s):
            with self._lock:
                alive = self._process is not None and self._process.poll() is None
                if self._state == "connected" and not alive:
                    self._lose("the connection process exited")
                reconnect = self._state != "connected"
            if reconnect and not self._stop.is_set():
                self._spawn()

    def _spawn(self) -> None:
        """Starts a child and waits for its connect outcome; requests meanwhile fail fast
        (the lock is held only to swap the connection in)."""
        with self._lock:
            self._kill()
            if self._state == "connected":
                self._state = "connecting"
        parent_socket, child_socket = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO_ROOT, env.get("PYTHONPATH")]))
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(child_socket.fileno()), self.address,
                 str(self._connect_timeout_s)],
                pass_fds=(child_socket.fileno(),), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL if _QUIET else None, stderr=subprocess.DEVNULL if _QUIET else None)
        finally:
            child_socket.close()
        conn = Connection(parent_socket.detach())
        # Interpreter start + `import ray` + ray.init: allow a little more than the connect timeout.
        if conn.poll(self._connect_timeout_s + 20):
            try:
                kind, value = conn.recv()
            except (EOFError, OSError):
                kind, value = "error", "the connection process exited while connecting"
        else:
            kind, value = "error", f"connecting did not finish within {self._connect_timeout_s:.0f} s"
        with self._lock:
            self._process, self._conn = process, conn
            if kind == "ok" and not self._stop.is_set():
                self._state, self._error, self._ever_connected = "connected", None, True
            else:
                self._lose(value)

    def _lose(self, error: str) -> None:
        self._state = "lost"
        self._error = error
        self._kill()

    def _kill(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        self._process = self._conn = None


# ---- the child ---------------------------------------------------------------------------

def _child_main(conn, address: str, connect_timeout_s: float) -> None:
    """Connects to Ray at ``address`` and answers queries until the socket closes."""
    try:
        from hetero_ray.runtime.auth import prepare_auth_env

        prepare_auth_env(address)  # before Ray is imported: it reads RAY_AUTH_MODE once
        import ray

        from hetero_ray.runtime.cluster import connect

        # An address is always given: connect() never starts a local Ray then.
        connect(address, local_num_cpus=0, timeout_s=connect_timeout_s, include_dashboard=False)
        conn.send(("ok", ray.get_runtime_context().gcs_address))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(("error", str(e) or type(e).__name__))
        return
    handles: dict[str, Any] = {}
    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(_answer(op, args, handles))


def _answer(op: str, args: tuple, handles: dict) -> tuple[str, Any]:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    from hetero_ray.constants import METRICS_STORE_ROLE, RAY_NAMESPACE, actor_name

    timeout_s = DEFAULT_CALL_TIMEOUT_S - 2

    def store(experiment: str):
        if experiment not in handles:
            try:
                handles[experiment] = ray.get_actor(actor_name(experiment, METRICS_STORE_ROLE), namespace=RAY_NAMESPACE)
            except ValueError:
                raise ExperimentGone(f"experiment {experiment!r} is not running") from None
        return handles[experiment]

    try:
        if op == "experiments":
            suffix = "/" + METRICS_STORE_ROLE
            names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                     if a.get("namespace") == RAY_NAMESPACE and a["name"].endswith(suffix)]
            return "ok", sorted(name[: -len(suffix)] for name in names)
        if op == "updates":
            experiment, cursors, limit = args
            return "ok", ray.get(store(experiment).updates_since.remote(cursors, limit), timeout=timeout_s)
        if op == "call":
            experiment, method, kwargs = args
            if method not in STORE_QUERIES:
                return "error", f"{method!r} is not a metrics-store query"
            return "ok", ray.get(getattr(store(experiment), method).remote(**kwargs), timeout=timeout_s)
        if op == "nodes":
            return "ok", [{
                "node_id": n["NodeID"], "ip": n.get("NodeManagerAddress"), "hostname": n.get("NodeManagerHostname"),
                "alive": bool(n.get("Alive")), "resources": dict(n.get("Resources") or {}),
            } for n in ray.nodes()]
        return "error", f"unknown query {op!r}"
    except ExperimentGone as e:
        return "gone", str(e)
    except RayActorError as e:
        handles.pop(args[0] if args else None, None)
        return "gone", f"experiment {args[0]!r} ended ({type(e).__name__})"
    except GetTimeoutError:
        return "lost", f"a query took longer than {timeout_s:.0f} s"
    except ConnectionError as e:
        return "lost", str(e)
    except Exception as e:  # noqa: BLE001 - reported to the parent, the child keeps serving
        return "error", f"{type(e).__name__}: {e}"


if __name__ == "__main__":
    # The child: ``python -m hetero_ray_dashboards.ray_bridge FD ADDRESS CONNECT_TIMEOUT_S``.
    _fd, _address, _timeout = sys.argv[1:4]
    _conn = Connection(int(_fd))
    # The parent ends the child by closing the socket or terminating it; either way, quietly.
    import signal

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    _child_main(_conn, _address, float(_timeout))
    os._exit(0)  # skip Ray's atexit hooks, which may wait on a cluster that is gone
