"""Real Ray nodes on this machine: multi-node tests and benchmarks without more machines.

Each node is a `ray start --block` in its own process group and its own short temp dir:
`ray start` writes `ray_current_cluster` into its temp dir, and in the shared /tmp/ray
that file would make every later plain `ray.init()` on this machine try to join this
(soon dead) cluster. Optionally the node runs inside a cgroup with a CPU quota (a real,
unannounced straggler). Everything is torn down on exit, also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator, Optional, Sequence

import psutil

RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")
CGROUP_CPU_ROOT = "/sys/fs/cgroup/cpu"
CFS_PERIOD_US = 100_000
NODE_STARTS = 3  # tries of a node's `ray start` before a test cluster gives up on it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def wait_for_port(port: int, head: "RayNode", timeout_s: float = 60) -> None:
    """Until the head's GCS listens on ``port``, before nodes join it; a head whose `ray start`
    exited is started again, as :func:`wait_for_nodes` does for every node."""
    deadline = time.monotonic() + timeout_s
    while not listening(port):
        if not head.start_again_if_exited():
            raise RuntimeError(f"the head node exited while starting, {head.starts} times:\n{head.log()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on 127.0.0.1:{port} {timeout_s:g} s after the head started:\n"
                               f"{head.log()}")
        time.sleep(0.1)


def cgroup_unusable_reason() -> Optional[str]:
    """Why a cgroup-capped node cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to create a cgroup"
    if not os.access(os.path.join(CGROUP_CPU_ROOT, "cpu.cfs_quota_us"), os.W_OK):
        return f"no writable cgroup v1 cpu controller at {CGROUP_CPU_ROOT}"
    if not os.path.exists(RAY_CLI):
        return "the `ray` command is not next to this Python"
    return None


class RayNode:
    """A running `ray start --block` process (head or worker)."""

    def __init__(self, command: str, env: dict, temp_dir: str, log_path: str, cgroup: Optional[str]):
        self.command = command
        self.env = env
        self.temp_dir = temp_dir
        self.log_path = log_path
        self.cgroup = cgroup
        self.starts = 0
        self.process = self._popen()

    def _popen(self) -> subprocess.Popen:
        self.starts += 1
        with open(self.log_path, "a") as log:
            return subprocess.Popen(["bash", "-c", self.command], env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def start_again_if_exited(self, starts: int = NODE_STARTS) -> bool:
        """Starts the node again if its `ray start` exited, ``starts`` times in all (the same
        command and log): on a loaded machine a raylet that joins beside others can miss the
        GCS's 30 s deadline for its node info ("The current node timed out during startup"),
        and a second try joins. False once the node exited with no start left."""
        if self.process.poll() is None:
            return True
        if self.starts >= starts:
            return False
        print(f"[local cluster] a Ray node exited while starting (try {self.starts} of {starts}); "
              f"starting it again", file=sys.stderr)
        self.kill()
        self.process = self._popen()
        return True

    def log(self) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the node and everything it started: a machine that vanished."""
        pids = {self.process.pid}
        try:
            pids |= {p.pid for p in psutil.Process(self.process.pid).children(recursive=True)}
        except psutil.Error:
            pass
        if self.cgroup:
            pids |= set(_cgroup_pids(self.cgroup))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM to `ray start --block` first (it stops its processes in order), then kill."""
        stop_nodes([self])

    def _terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()

    def _clean_up(self, deadline: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(max(0.0, deadline - time.monotonic()))
        self.kill()
        if self.cgroup:
            deadline = time.monotonic() + 20
            while _cgroup_pids(self.cgroup) and time.monotonic() < deadline:
                time.sleep(0.2)
            with contextlib.suppress(OSError):
                os.rmdir(self.cgroup)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def stop_nodes(nodes: Sequence[RayNode], timeout_s: float = 30) -> None:
    """Stops the nodes together: each `ray start --block` stops its processes in seconds,
    and one after another they added up to most of a multi-node test's teardown."""
    for node in nodes:
        node._terminate()
    deadline = time.monotonic() + timeout_s
    for node in nodes:
        node._clean_up(deadline)


def start_node(*, address: Optional[str] = None, port: Optional[int] = None, num_cpus: int = 1,
               resources: Optional[dict] = None, labels: Optional[dict] = None,
               cpu_quota: Optional[float] = None, private_mounts: Sequence[str] = (), log_dir: str) -> RayNode:
    """A head (``address`` None, listening on ``port``) or a worker node joining ``address``.

    Args:
        private_mounts: arguments of `mount` (e.g. ``"--bind -o ro /runs /runs"``) applied
            in a mount namespace of the node's own (root only): the node and its workers
            see another disk at the same path, as a separate machine would.
        cpu_quota: cap the node's processes at this many cores (cgroup v1), set once the
            node has registered (start-up under a small quota would take a minute).
    """
    temp_dir = tempfile.mkdtemp(prefix="hrnode")
    log_path = os.path.join(log_dir, f"ray_start_{os.path.basename(temp_dir)}.log")
    # The head's dashboard: Ray Train's placement-group cleaner finds the controller through
    # it, and without one its stop waits out 12 s at every run's end.
    role = f"--head --port={port} --dashboard-host=127.0.0.1 --dashboard-port={free_port()}" if address is None \
        else f"--address={address}"
    command = (f"exec {RAY_CLI} start --block {role} --num-cpus={num_cpus} "
               f"--object-store-memory=200000000 --temp-dir={temp_dir} --disable-usage-stats")
    if resources:
        command += f" --resources='{json.dumps(resources)}'"
    if labels:
        command += " --labels=" + ",".join(f"{k}={v}" for k, v in labels.items())
    if private_mounts:
        setup = " && ".join(f"mount {m}" for m in private_mounts)
        command = f"exec unshare --mount --propagation private bash -c {shlex.quote(setup + ' && ' + command)}"
    cgroup = None
    if cpu_quota is not None:  # the process joins the cgroup first; the quota comes with set_cpu_quota
        cgroup = os.path.join(CGROUP_CPU_ROOT, f"hetero_ray_test_{os.path.basename(temp_dir)}")
        os.makedirs(cgroup, exist_ok=True)
        _write(os.path.join(cgroup, "cpu.cfs_quota_us"), -1)  # set_cpu_quota sets the period with the quota
        command = f"echo $$ > {cgroup}/cgroup.procs && {command}"
    # RAY_ADDRESS names this cluster to the node's processes: with several clusters on one
    # machine, Ray Train's placement-group cleaner would otherwise not know which to ask.
    env = dict(os.environ, RAY_ADDRESS=address or f"127.0.0.1:{port}")
    env.setdefault("RAY_health_check_period_ms", "1000")  # as cluster_configs/start_head.sh: a lost node seen in ~5 s
    # A SIGTERMed node drains for up to 30 s first (Ray 2.60); a head whose worker node was
    # killed waits all of it. These nodes hold nothing a drain would save.
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    if os.path.exists(os.path.expanduser("~/.ray/auth_token")):
        env["RAY_AUTH_MODE"] = "token"
    return RayNode(command, env, temp_dir, log_path, cgroup)


def set_cpu_quota(node: RayNode, cores: float, period_us: int = CFS_PERIOD_US) -> None:
    """Caps the node's processes at ``cores`` on average over every ``period_us``.

    The period sets how the cap feels: with the kernel's 100 ms a node runs at full speed
    until its share of the period is spent, then stalls for the rest (steps of ~100 ms are
    either fast or very slow, as under Kubernetes CPU limits); a 10 ms period spreads the
    same cap evenly over a step, like a device that is simply slower.
    """
    _write(os.path.join(node.cgroup, "cpu.cfs_period_us"), int(period_us))
    _write(os.path.join(node.cgroup, "cpu.cfs_quota_us"), int(cores * period_us))


def wait_for_nodes(address: str, count: int, nodes: list[RayNode], timeout_s: float = 120) -> None:
    """Waits until the cluster at ``address`` has ``count`` alive nodes (asks in a subprocess,
    so this test process stays free to run its own Ray); a node whose `ray start` exits is
    started again (:meth:`RayNode.start_again_if_exited`)."""
    deadline = time.monotonic() + timeout_s
    probe = ("import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
             "print(sum(1 for n in ray.nodes() if n['Alive']))")
    env = dict(os.environ, RAY_ADDRESS="")
    if os.path.exists(os.path.expanduser("~/.ray/auth_token")):
        env["RAY_AUTH_MODE"] = "token"
    while time.monotonic() < deadline:
        for node in nodes:
            if not node.start_again_if_exited():
                raise RuntimeError(f"a Ray node exited while starting, {node.starts} times:\n{node.log()}")
        out = subprocess.run([sys.executable, "-c", probe, address], capture_output=True, text=True, env=env,
                             timeout=60)
        if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(1)
    raise TimeoutError(f"{count} nodes did not come up at {address}:\n" + "\n".join(n.log() for n in nodes))


@contextlib.contextmanager
def local_cluster(log_dir: str, worker_cpus: list[int], head_cpus: int = 1,
                  cpu_quota_last: Optional[float] = None) -> Iterator[tuple[str, list[RayNode]]]:
    """A head plus worker nodes on this machine; yields (address, [head, *workers]).
    ``cpu_quota_last``: the last worker node runs in a cgroup (see :func:`start_node`)."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    nodes: list[RayNode] = []
    try:
        nodes.append(start_node(port=port, num_cpus=head_cpus, log_dir=log_dir))
        wait_for_port(port, nodes[0])  # the GCS must listen before workers join
        for i, cpus in enumerate(worker_cpus):
            quota = cpu_quota_last if i == len(worker_cpus) - 1 else None
            nodes.append(start_node(address=address, num_cpus=cpus, cpu_quota=quota, log_dir=log_dir))
        wait_for_nodes(address, len(nodes), nodes)
        yield address, nodes
    finally:
        stop_nodes(nodes)


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(f"{value}\n")


def _cgroup_pids(cgroup: str) -> list[int]:
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return [int(line) for line in f if line.strip()]
    except OSError:
        return []
