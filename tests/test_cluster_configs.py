"""cluster_configs/: the start scripts and the cluster-launcher YAML (the KubeRay
manifests: tests/test_cluster_configs_kuberay.py).

The scripts run for real, with a stand-in `ray` that records how it was called, a
stand-in `nvidia-smi` (a GPU machine or a machine without a driver) and a stand-in `ip`
(a machine with two networks), so every check here is fast and needs no cluster;
tests/test_ray_job_submit.py starts a real one with them.
The YAML is checked against what the code reads (the label names in
hetero_ray.constants) and against Ray's own validation.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import socket
import stat
import subprocess

import pytest
import yaml

from hetero_ray.constants import DEVICE_LABEL, GPU_MODEL_LABEL
from tests.helpers import free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO_ROOT, "cluster_configs")
START_HEAD = os.path.join(CONFIGS, "start_head.sh")
START_WORKER = os.path.join(CONFIGS, "start_worker.sh")
SCRIPTS = [os.path.join(CONFIGS, name) for name in ("common.sh", "start_head.sh", "start_worker.sh")]
LAUNCHER_YAML = os.path.join(CONFIGS, "onprem-cluster.yaml")
LOOPBACK = ("127.0.0.1", "localhost", "::1")

FAKE_RAY = """#!/bin/sh
# Stands in for `ray`: records the environment that matters and the arguments.
{ echo "RAY_AUTH_MODE=${RAY_AUTH_MODE:-}"; echo "PATH=$PATH"
  echo "GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-}"; echo "NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-}"
  for a in "$@"; do echo "ARG=$a"; done; } > "$FAKE_RAY_LOG"
"""
# Stands in for `ip` on a machine with two networks: eth0 (10.1.0.7) carries the default
# route, ens5 (192.168.1.11) the cluster's LAN, where the head 192.168.1.10 is. With
# FAKE_IP_NO_ROUTE=1 no route exists (an air-gapped host); FAKE_IP_ONE_NIC=1 leaves ens5 its
# only network.
FAKE_IP = r"""#!/bin/sh
case "$*" in
  "-o route get "*)
    [ -z "$FAKE_IP_NO_ROUTE" ] || { echo "RTNETLINK answers: Network is unreachable" >&2; exit 2; }
    case "$4" in
      127.*) echo "local $4 dev lo src 127.0.0.1 uid 1000 \    cache <local> " ;;
      192.168.1.*) echo "$4 dev ens5 src 192.168.1.11 uid 1000 \    cache " ;;
      *) echo "$4 via 10.1.0.1 dev eth0 src 10.1.0.7 uid 1000 \    cache " ;;
    esac ;;
  "-o addr show"*)
    case "$*" in *global*) ;; *) echo "1: lo    inet 127.0.0.1/8 scope host lo\       valid_lft forever preferred_lft forever" ;; esac
    [ -n "$FAKE_IP_ONE_NIC" ] || echo "2: eth0    inet 10.1.0.7/24 brd 10.1.0.255 scope global eth0\       valid_lft forever preferred_lft forever"
    echo "3: ens5    inet 192.168.1.11/24 brd 192.168.1.255 scope global ens5\       valid_lft forever preferred_lft forever" ;;
  *) echo "fake ip: unexpected arguments: $*" >&2; exit 1 ;;
esac
"""
A100_SMI = """#!/bin/sh
printf 'NVIDIA A100-SXM4-40GB\\nNVIDIA A100-SXM4-40GB\\n'
"""
NO_DRIVER_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
"""


def _write_executable(path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def node(tmp_path):
    """Runs a start script on a pretend machine; `gpu` says whether nvidia-smi finds an A100."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ray_dir = tmp_path / "venv-bin"
    ray_dir.mkdir()
    fake_ray = _write_executable(ray_dir / "ray", FAKE_RAY)
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "ray-call.log"

    class Node:
        token_file = home / ".ray" / "auth_token"

        def run(self, script: str, *args: str, gpu: bool = False, env: dict | None = None,
                dry_run: bool = False) -> subprocess.CompletedProcess:
            _write_executable(bin_dir / "nvidia-smi", A100_SMI if gpu else NO_DRIVER_SMI)
            _write_executable(bin_dir / "ip", FAKE_IP)
            full_env = {
                "PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "FAKE_RAY_LOG": str(log),
                "HETERO_RAY_RAY_BIN": fake_ray, "HETERO_RAY_NODE_ENV": str(tmp_path / "no-node.env"),
            }
            full_env.update(env or {})
            if log.exists():
                log.unlink()
            argv = ["bash", script, *(["--dry-run"] if dry_run else []), *args]
            return subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=30)

        def give_token(self) -> None:
            self.token_file.parent.mkdir(parents=True, exist_ok=True)
            self.token_file.write_text("ab" * 32)
            self.token_file.chmod(0o600)

        def ray_call(self) -> tuple[dict, list[str]]:
            """(environment, arguments) of the last `ray` call; arguments start with `start`."""
            lines = log.read_text().splitlines()
            env = dict(line.split("=", 1) for line in lines if not line.startswith("ARG="))
            return env, [line[4:] for line in lines if line.startswith("ARG=")]

    return Node()


def _options(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in args if a.startswith("--"))


def _labels(args: list[str]) -> dict[str, str]:
    from ray._private.label_utils import parse_node_labels_string

    return parse_node_labels_string(_options(args)["labels"])  # Ray's own parser and validation


def _dry_run_words(output: str) -> list[str]:
    """The `VAR=value ... ray start ...` line a --dry-run printed, as words."""
    line = next(line for line in output.splitlines() if ": RAY_AUTH_MODE=" in line)
    return shlex.split(line.split(": ", 1)[1])


def _dry_run_args(output: str) -> list[str]:
    """The `ray start` arguments a --dry-run printed."""
    words = _dry_run_words(output)
    return words[words.index("start"):]


def _dry_run_env(output: str) -> dict[str, str]:
    """The environment a --dry-run says `ray start` would get."""
    words = _dry_run_words(output)
    return dict(w.split("=", 1) for w in words[:words.index("start")] if "=" in w)


# --- the scripts


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_scripts_parse_and_run_scripts_are_executable(script):
    subprocess.run(["bash", "-n", script], check=True)
    if not script.endswith("common.sh"):
        assert os.stat(script).st_mode & stat.S_IXUSR
        assert "set -euo pipefail" in open(script).read()


def test_script_label_names_are_the_ones_the_code_reads():
    common = open(os.path.join(CONFIGS, "common.sh")).read()
    assert f'HR_DEVICE_LABEL="{DEVICE_LABEL}"' in common
    assert f'HR_GPU_MODEL_LABEL="{GPU_MODEL_LABEL}"' in common


@pytest.mark.parametrize("script", [START_HEAD, START_WORKER], ids=os.path.basename)
def test_help_names_the_token_and_the_labels(node, script):
    result = node.run(script, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout and "auth_token" in result.stdout and DEVICE_LABEL in result.stdout


def test_head_on_a_cpu_machine_generates_a_private_token_and_binds_the_dashboard_to_loopback(node):
    result = node.run(START_HEAD)
    assert result.returncode == 0, result.stderr
    env, args = node.ray_call()
    options = _options(args)
    assert args[0] == "start" and "head" in options
    assert options["dashboard-host"] == "127.0.0.1" and options["dashboard-port"] == "8265"
    assert options["port"] == "6379" and options["metrics-export-port"] == "8080"
    assert options["ray-client-server-port"] == "10001" and options["include-dashboard"] == "true"
    assert _labels(args) == {DEVICE_LABEL: "cpu"}
    assert options["num-gpus"] == "0"  # a CPU node offers no GPU to Ray either
    # Token authentication: on, with a fresh token only the owner can read.
    assert env["RAY_AUTH_MODE"] == "token"
    token = node.token_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert stat.S_IMODE(node.token_file.stat().st_mode) == 0o600
    assert "scp" in result.stdout and "export RAY_AUTH_MODE=token" in result.stdout
    assert "ssh -N -L 8265:127.0.0.1:8265" in result.stdout
    # Jobs run `python ...` through PATH: the Python next to `ray` comes first.
    assert env["PATH"].split(":")[0].endswith("venv-bin")
    # A second start keeps the token the workers already have.
    assert node.run(START_HEAD).returncode == 0
    assert node.token_file.read_text() == token


def test_worker_on_a_gpu_machine_is_labelled_with_its_model(node):
    node.give_token()
    with socket.socket() as head:  # something listening where the head would be
        head.bind(("127.0.0.1", 0))
        head.listen()
        port = head.getsockname()[1]
        result = node.run(START_WORKER, f"127.0.0.1:{port}", "--", "--object-store-memory=1000000000", gpu=True)
    assert result.returncode == 0, result.stderr
    env, args = node.ray_call()
    options = _options(args)
    assert options["address"] == f"127.0.0.1:{port}" and "head" not in options
    assert _labels(args) == {DEVICE_LABEL: "gpu", GPU_MODEL_LABEL: "nvidia-a100-sxm4-40gb"}
    assert "num-gpus" not in options  # Ray counts the GPUs itself
    assert "dashboard-host" not in options  # only the head serves the dashboard
    assert options["object-store-memory"] == "1000000000"  # arguments after -- reach ray start
    assert env["RAY_AUTH_MODE"] == "token"


def test_worker_without_a_token_refuses_and_says_where_to_get_it(node):
    result = node.run(START_WORKER, "10.0.0.5")
    assert result.returncode == 2
    assert str(node.token_file) in result.stderr and "scp HEAD:~/.ray/auth_token" in result.stderr
    assert "ray get-auth-token" in result.stderr
    assert not node.token_file.exists()  # a worker never makes up its own token


def test_worker_with_an_unreachable_head_fails_fast(node):
    node.give_token()
    port = free_port()
    result = node.run(START_WORKER, f"127.0.0.1:{port}")
    assert result.returncode == 2 and "cannot reach the head" in result.stderr


def test_worker_adds_the_default_port_and_rejects_urls(node):
    node.give_token()
    result = node.run(START_WORKER, "10.0.0.5", dry_run=True)
    assert result.returncode == 0, result.stderr
    assert _options(_dry_run_args(result.stdout))["address"] == "10.0.0.5:6379"
    result = node.run(START_WORKER, "http://10.0.0.5:8265", dry_run=True)
    assert result.returncode == 2 and "not a URL" in result.stderr


def test_dry_run_writes_nothing_and_starts_nothing(node):
    result = node.run(START_HEAD, "--temp-dir", "/tmp/hr-x", env={"HETERO_RAY_NUM_CPUS": "3"}, dry_run=True)
    assert result.returncode == 0, result.stderr
    assert not node.token_file.exists() and "would generate" in result.stdout
    options = _options(_dry_run_args(result.stdout))
    assert options["temp-dir"] == "/tmp/hr-x" and options["num-cpus"] == "3"


@pytest.mark.parametrize("name, label", [
    ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090"),
    ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
    ("Tesla V100-SXM2-16GB", "tesla-v100-sxm2-16gb"),
    ("  (weird) GPU / model  ", "weird-gpu-model"),
    ("x" * 80, "x" * 63),
])
def test_gpu_model_override_becomes_a_valid_label_value(node, name, label):
    node.give_token()
    result = node.run(START_WORKER, "10.0.0.5", env={"HETERO_RAY_GPU_MODEL": name}, gpu=True, dry_run=True)
    assert result.returncode == 0, result.stderr
    assert _labels(_dry_run_args(result.stdout))[GPU_MODEL_LABEL] == label


def test_device_overrides_and_contradictions(node):
    node.give_token()
    # A GPU machine declared a CPU node offers no GPU to Ray.
    result = node.run(START_WORKER, "10.0.0.5", env={"HETERO_RAY_DEVICE": "cpu"}, gpu=True, dry_run=True)
    args = _dry_run_args(result.stdout)
    assert _labels(args) == {DEVICE_LABEL: "cpu"} and _options(args)["num-gpus"] == "0"
    # A GPU node with no detectable model must be told its model.
    result = node.run(START_WORKER, "10.0.0.5", env={"HETERO_RAY_DEVICE": "gpu"}, dry_run=True)
    assert result.returncode == 2 and "HETERO_RAY_GPU_MODEL" in result.stderr
    for env, says in [({"HETERO_RAY_DEVICE": "tpu"}, "must be gpu or cpu"),
                      ({"HETERO_RAY_DEVICE": "cpu", "HETERO_RAY_NUM_GPUS": "2"}, "labelled cpu"),
                      ({"HETERO_RAY_LABELS": f"{DEVICE_LABEL}=gpu"}, "may not set hetero-ray.io/"),
                      ({"RAY_AUTH_MODE": "none"}, "must be token")]:
        result = node.run(START_WORKER, "10.0.0.5", env=env, dry_run=True)
        assert result.returncode == 2 and says in result.stderr, (env, result.stderr)
    # Extra labels ride along.
    result = node.run(START_WORKER, "10.0.0.5", env={"HETERO_RAY_LABELS": "rack=r1"}, dry_run=True)
    assert _labels(_dry_run_args(result.stdout)) == {DEVICE_LABEL: "cpu", "rack": "r1"}


def test_per_machine_settings_file_is_read(node, tmp_path):
    node.give_token()
    settings = tmp_path / "node.env"
    settings.write_text("HETERO_RAY_NUM_CPUS=6\nHETERO_RAY_GPU_MODEL='NVIDIA L4'\n")
    result = node.run(START_WORKER, "10.0.0.5", env={"HETERO_RAY_NODE_ENV": str(settings)}, gpu=True, dry_run=True)
    args = _dry_run_args(result.stdout)
    assert _options(args)["num-cpus"] == "6" and _labels(args)[GPU_MODEL_LABEL] == "nvidia-l4"


def test_unsafe_settings_are_loud(node):
    result = node.run(START_HEAD, env={"HETERO_RAY_DASHBOARD_HOST": "0.0.0.0"}, dry_run=True)
    assert result.returncode == 0 and "WARNING" in result.stderr and "0.0.0.0" in result.stderr
    result = node.run(START_WORKER, "10.0.0.5", env={"RAY_AUTH_MODE": "disabled"}, dry_run=True)
    assert result.returncode == 0 and "WARNING" in result.stderr and "run code" in result.stderr
    assert "RAY_AUTH_MODE=disabled" in result.stdout


def test_a_token_file_others_can_read_is_reported(node):
    node.give_token()
    node.token_file.chmod(0o644)
    result = node.run(START_WORKER, "10.0.0.5", dry_run=True)
    assert result.returncode == 0 and "chmod 600" in result.stderr


# --- the network interface for gloo and NCCL
#
# Without GLOO_SOCKET_IFNAME, gloo binds to the address the host name resolves to, often
# 127.0.1.1, and every other node's connection is refused. The fake `ip` above describes a
# machine whose default route (eth0) is not the cluster's network (ens5).


def test_worker_gives_gloo_and_nccl_the_interface_of_its_route_to_the_head(node):
    node.give_token()
    result = node.run(START_WORKER, "192.168.1.10", dry_run=True)
    assert result.returncode == 0, result.stderr
    assert _dry_run_env(result.stdout) == {
        "RAY_AUTH_MODE": "token", "GLOO_SOCKET_IFNAME": "ens5", "NCCL_SOCKET_IFNAME": "=ens5"}
    assert "route to 192.168.1.10" in result.stdout  # says how it chose
    # For real: `ray start`, and so every worker process Ray starts, has them exported.
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        result = node.run(START_WORKER, f"127.0.0.1:{head.getsockname()[1]}")
    assert result.returncode == 0, result.stderr
    env, _ = node.ray_call()
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("lo", "=lo")  # a head on this machine


@pytest.mark.parametrize("env, ifname", [
    ({}, "eth0"),  # where Ray's own address lies: the route to 8.8.8.8
    ({"HETERO_RAY_NODE_IP": "192.168.1.11"}, "ens5"),  # the interface holding the address given
    ({"FAKE_IP_NO_ROUTE": "1", "FAKE_IP_ONE_NIC": "1"}, "ens5"),  # air-gapped, one network
], ids=["default route", "node ip", "only network"])
def test_head_gives_gloo_and_nccl_the_interface_of_its_address(node, env, ifname):
    result = node.run(START_HEAD, env=env)
    assert result.returncode == 0, result.stderr
    ray_env, _ = node.ray_call()
    assert (ray_env["GLOO_SOCKET_IFNAME"], ray_env["NCCL_SOCKET_IFNAME"]) == (ifname, f"={ifname}")


def test_socket_interfaces_set_by_the_user_are_kept(node, tmp_path):
    node.give_token()
    result = node.run(START_WORKER, "192.168.1.10", env={"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib"},
                      dry_run=True)
    env = _dry_run_env(result.stdout)
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("ib0", "ib")
    # One set by the user, the other found; and from node.env, where they need no `export`.
    settings = tmp_path / "node.env"
    settings.write_text("GLOO_SOCKET_IFNAME=bond0\n")
    result = node.run(START_HEAD, env={"HETERO_RAY_NODE_ENV": str(settings)})
    env, _ = node.ray_call()
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("bond0", "=eth0")


@pytest.mark.parametrize("env, says", [
    ({"FAKE_IP_NO_ROUTE": "1"}, "could not tell which network interface"),  # two networks, no route
    ({"HETERO_RAY_NODE_IP": "10.9.9.9"}, "no network interface of this machine holds HETERO_RAY_NODE_IP=10.9.9.9"),
])
def test_an_unknown_interface_is_a_warning_that_says_what_to_set(node, env, says):
    result = node.run(START_HEAD, env=env)
    assert result.returncode == 0, result.stderr
    assert "WARNING" in result.stderr and says in result.stderr and "GLOO_SOCKET_IFNAME" in result.stderr
    ray_env, _ = node.ray_call()
    assert ray_env["GLOO_SOCKET_IFNAME"] == ray_env["NCCL_SOCKET_IFNAME"] == ""  # no guess


# --- the head's address is data, never code


def _hostile_addresses(marker) -> list[str]:
    return [f"$(touch {marker}):6379", f"`touch {marker}`:6379", f"127.0.0.1/$(touch {marker}):6379",
            f"x\";touch {marker};\":6379", f"x';touch {marker}':6379", f"127.0.0.1:6379;touch {marker}"]


def test_a_head_address_with_shell_syntax_runs_nothing_and_is_refused(node, tmp_path):
    node.give_token()
    marker = tmp_path / "ran"
    for address in _hostile_addresses(marker):
        for args, env in (([address], {}), ([], {"HETERO_RAY_HEAD_ADDRESS": address})):
            result = node.run(START_WORKER, *args, env=env)
            assert not marker.exists(), address
            assert result.returncode == 2 and "the head's" in result.stderr and "must be" in result.stderr, address
    for address, says in [("10.0.0.5:abc", "port must be a number"), ("10.0.0.5:99999", "port must be a number"),
                          ("gpu a:6379", "host name or IPv4 address")]:
        result = node.run(START_WORKER, address, dry_run=True)
        assert result.returncode == 2 and says in result.stderr, (address, result.stderr)


def test_the_reachability_probe_gets_host_and_port_as_arguments(tmp_path):
    """The probe itself, below the address check: what it is given stays data."""
    marker = tmp_path / "ran"
    common = os.path.join(CONFIGS, "common.sh")

    def probe(host: str, port: str) -> int:
        script = f'HR_SCRIPT=test; . {shlex.quote(common)}; hr_tcp_reachable "$1" "$2"'
        return subprocess.run(["bash", "-c", script, "probe", host, port], timeout=30).returncode

    for host, port in [(f"$(touch {marker})", "1"), (f"127.0.0.1/1; touch {marker}; #", "1"),
                       ("127.0.0.1", f"1; touch {marker}"), ("127.0.0.1", f"$(touch {marker})")]:
        assert probe(host, port) != 0 and not marker.exists(), (host, port)
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        assert probe("127.0.0.1", str(head.getsockname()[1])) == 0


# --- the cluster-launcher YAML (on-premise machines)


def _launcher() -> dict:
    with open(LAUNCHER_YAML) as f:
        return yaml.safe_load(f)


def test_launcher_yaml_is_accepted_by_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = _launcher()
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert config["provider"]["type"] == "local"
    assert config["provider"]["head_ip"] and len(config["provider"]["worker_ips"]) == 2
    assert prepared["available_node_types"]["local.cluster.node"]["min_workers"] == 2


def test_launcher_yaml_cannot_declare_node_types_so_the_scripts_label_each_machine():
    """Ray's on-premise provider aborts on available_node_types: the per-machine device
    labels can only come from the start scripts, which the start commands must call."""
    from ray.autoscaler._private.util import prepare_config

    config = _launcher()
    assert "available_node_types" not in config
    with pytest.raises(BaseException, match="available_node_types is not supported"):
        prepare_config(dict(config, available_node_types={"gpu": {"node_config": {}, "resources": {}}}))
    head = " ".join(config["head_start_ray_commands"])
    worker = " ".join(config["worker_start_ray_commands"])
    assert "cluster_configs/start_head.sh" in head and "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
    assert "cluster_configs/start_worker.sh $RAY_HEAD_IP:6379" in worker
    assert "ray start" not in head + worker  # every node goes through the scripts (labels, token)


def test_launcher_yaml_ships_the_token_and_keeps_the_dashboard_on_loopback():
    config = _launcher()
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert config["file_mounts"]["~/hetero_ray"] == "."
    assert ".gitignore" in config["rsync_filter"]  # .venv/ and runs/ stay home
    commands = " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    hosts = re.findall(r"HETERO_RAY_DASHBOARD_HOST=(\S+)", commands)
    assert hosts and all(h in LOOPBACK for h in hosts)
    assert "0.0.0.0" not in open(LAUNCHER_YAML).read()
    assert "RAY_AUTH_MODE=disabled" not in commands
