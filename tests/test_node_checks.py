"""Multi-node preflight (hetero_ray/runtime/node_checks.py): every node that will host a
worker can write the run directory and sees the driver's dataset.

The decision is tested directly; the whole check on a real 3-node cluster of `ray start`
processes on this machine, where three nodes run in mount namespaces of their own (root
only): one sees the output folder read-only, one sees other CIFAR files at the same
--data-dir, one sees a writable folder of its own at the output folder's path (not shared). Each run picks its nodes with --worker-labels.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

import pytest

from hetero_ray.builtin.data import load_dataset
from hetero_ray.runtime.cluster import NodeResources
from hetero_ray.runtime.node_checks import (
    DatasetFingerprint, DatasetRef, NodeProbe, driver_marker, fingerprint, hosting_nodes, probe, problems,
)
from tests.cifar_files import write_cifar10

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLE = "test-role"  # a node label: which node a run's workers go to


def node(node_id: str, cpus: float = 1, **labels) -> NodeResources:
    return NodeResources(node_id, "10.0.0.1", cpus, 0.0, labels)


# --- the decision, without Ray ------------------------------------------------------------


def test_hosting_nodes_are_those_with_cpus_that_match_some_selector():
    nodes = [node("a" * 16, device="gpu"), node("b" * 16, device="cpu"), node("c" * 16, cpus=0, device="cpu")]
    assert [n.node_id[0] for n in hosting_nodes(nodes, None)] == ["a", "b"]
    assert [n.node_id[0] for n in hosting_nodes(nodes, [{"device": "cpu"}, {"device": "cpu"}])] == ["b"]
    assert [n.node_id[0] for n in hosting_nodes(nodes, [{}, {"device": "gpu"}])] == ["a", "b"]


def test_problems_name_each_node_and_what_to_do():
    nodes = [node("a" * 16), node("b" * 16), node("c" * 16), node("d" * 16)]
    dataset = DatasetRef("cifar10", "/data")
    good = DatasetFingerprint(250, "0" * 32)
    probes = {
        "a" * 16: NodeProbe(dataset=good),
        "b" * 16: NodeProbe(write_error="cannot create files in /runs: Read-only file system", dataset=good),
        "c" * 16: NodeProbe(dataset=DatasetFingerprint(250, "1" * 32)),
    }
    found = problems(probes, nodes, "/runs/x", good, dataset, unanswered=["d" * 16], timeout_s=60)
    assert len(found) == 3
    assert found[0].startswith("node bbbbbbbb (10.0.0.1) cannot write the run directory /runs/x (cannot create")
    assert "shared filesystem" in found[0]
    assert found[1].startswith("node cccccccc (10.0.0.1) sees another cifar10 in --data-dir /data (250 training "
                               "samples, md5 111111111111; the driver's: 250, md5 000000000000)")
    assert found[2].startswith("node dddddddd (10.0.0.1) did not answer within 60 s")
    assert problems(probes, nodes[:1], "/runs/x", good, dataset, [], 60) == []


def test_a_writable_folder_that_is_not_the_drivers_is_named():
    nodes = [node("a" * 16), node("b" * 16)]
    probes = {"a" * 16: NodeProbe(sees_driver_folder=True), "b" * 16: NodeProbe(sees_driver_folder=False)}
    found = problems(probes, nodes, "/runs/x", None, None, unanswered=[], timeout_s=60)
    assert len(found) == 1
    assert found[0].startswith("node bbbbbbbb (10.0.0.1) does not share the run directory /runs/x with the driver")
    assert "shared filesystem" in found[0] and "URI storage" in found[0]


def test_the_drivers_marker_is_read_where_it_was_written_and_removed_after(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    with driver_marker(str(runs / "x")) as marker:
        assert probe(str(runs / "x"), None, marker).sees_driver_folder is True
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        moved = type(marker)(str(elsewhere / os.path.basename(marker.path)), marker.token)
        assert probe(str(elsewhere), None, moved).sees_driver_folder is False  # another disk at that path
    assert list(runs.iterdir()) == []  # nothing left behind


def test_probe_writes_nothing_and_creates_no_folder(tmp_path):
    run_dir = tmp_path / "runs" / "x"
    assert probe(str(run_dir), None) == NodeProbe()
    assert list(tmp_path.iterdir()) == []


def test_fingerprint_tells_copies_apart(tmp_path):
    def of(folder, seed, num_train=250):
        write_cifar10(tmp_path / folder, num_train=num_train, seed=seed)
        data_dir = str(tmp_path / folder)
        return fingerprint(DatasetRef("cifar10", data_dir, functools.partial(
            load_dataset, "cifar10", data_dir=data_dir, verify_checksums=False)))

    same, other, shorter = of("a", 0), of("b", 1), of("c", 0, num_train=200)
    assert same == of("a2", 0) and same.num_samples == 250
    assert other.num_samples == 250 and other.md5 != same.md5
    assert shorter.num_samples == 200


# --- the check on a real multi-node cluster ---------------------------------------------------


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """head (normal), `readonly` (sees --storage-path read-only), `otherdata` (another CIFAR
    at --data-dir), `unshared` (an empty disk of its own at --storage-path); yields (address, paths, {role: node_id})."""
    if os.geteuid() != 0:
        pytest.skip("a node with its own view of the disk needs a mount namespace (root)")
    from benchmarks.local_cluster import free_port, start_node, stop_nodes, wait_for_nodes

    tmp = tmp_path_factory.mktemp("node_checks")
    paths = {"runs": tmp / "runs", "data": write_cifar10(tmp / "data", seed=0),
             "other": write_cifar10(tmp / "other", seed=1)}
    paths["runs"].mkdir()
    port = free_port()
    address = f"127.0.0.1:{port}"
    started = []
    try:
        started.append(start_node(port=port, labels={ROLE: "head"}, log_dir=str(tmp)))
        wait_for_nodes(address, 1, started)
        started.append(start_node(address=address, labels={ROLE: "readonly"}, log_dir=str(tmp),
                                  private_mounts=[f"--bind -o ro {paths['runs']} {paths['runs']}"]))
        started.append(start_node(address=address, labels={ROLE: "otherdata"}, log_dir=str(tmp),
                                  private_mounts=[f"--bind {paths['other']} {paths['data']}"]))
        started.append(start_node(address=address, labels={ROLE: "unshared"}, log_dir=str(tmp),
                                  private_mounts=[f"-t tmpfs tmpfs {paths['runs']}"]))
        wait_for_nodes(address, 4, started)
        yield address, paths, _node_ids(address)
    finally:
        stop_nodes(started)


def _node_ids(address: str) -> dict[str, str]:
    script = ("import json,ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
              f"print(json.dumps({{n['Labels']['{ROLE}']: n['NodeID'] for n in ray.nodes() if n['Alive']}}))")
    env = dict(os.environ, RAY_ADDRESS="")
    if os.path.exists(os.path.expanduser("~/.ray/auth_token")):
        env["RAY_AUTH_MODE"] = "token"
    out = subprocess.run([sys.executable, "-c", script, address], capture_output=True, text=True, env=env,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def train(address: str, paths: dict, roles: str, name: str, *extra: str) -> subprocess.CompletedProcess:
    """`hetero-ray train` with one worker on each node of ``roles`` (';'-separated)."""
    workers = roles.split(";")
    command = [sys.executable, "-m", "hetero_ray", "train", "--address", address, "--model", "mlp",
               "--num-samples", "256", "--eval-samples", "64", "--global-batch-size", "32", "--epochs", "1",
               "--no-profile", "--policy", "static", "--num-workers", str(len(workers)),
               "--worker-labels", ";".join(f"{ROLE}={r}" for r in workers),
               "--storage-path", str(paths["runs"]), "--name", name, *extra]
    return subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "RAY_ADDRESS": ""}, text=True,
                          capture_output=True, timeout=300)


@pytest.mark.ray
@pytest.mark.slow
def test_two_nodes_that_can_write_pass_and_train(nodes):
    address, paths, ids = nodes
    done = train(address, paths, "head;otherdata", "both-write")  # synthetic data: the other CIFAR is not read
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"2 nodes can write {paths['runs'] / 'both-write'}" in done.stdout
    assert (paths["runs"] / "both-write" / "summary.json").exists()


@pytest.mark.ray
@pytest.mark.slow
def test_a_node_that_cannot_write_the_run_directory_is_named(nodes):
    address, paths, ids = nodes
    done = train(address, paths, "head;readonly", "readonly")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    message = done.stderr
    assert re.search(rf"node {ids['readonly'][:8]} \(\S+\) cannot write the run directory", message), message
    assert "Read-only file system" in message and ids["head"][:8] not in message
    assert not (paths["runs"] / "readonly").exists()  # nothing written


@pytest.mark.ray
@pytest.mark.slow
def test_a_node_with_other_cifar_files_is_named(nodes):
    address, paths, ids = nodes
    done = train(address, paths, "head;otherdata", "otherdata", "--dataset", "cifar10",
                 "--data-dir", str(paths["data"]), "--no-verify-checksums")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    message = done.stderr
    assert re.search(rf"node {ids['otherdata'][:8]} \(\S+\) sees another cifar10 in --data-dir "
                     rf"{re.escape(str(paths['data']))} \(250 training samples", message), message
    assert ids["head"][:8] not in message
    assert not (paths["runs"] / "otherdata").exists()


@pytest.mark.ray
@pytest.mark.slow
def test_a_node_whose_run_directory_is_another_disk_is_stopped_before_the_first_step(nodes):
    """The default --storage-path exists at the same path on every node; writable everywhere, it
    need not be shared. A restart elsewhere would not find the checkpoint: exit 2 first."""
    address, paths, ids = nodes
    done = train(address, paths, "head;unshared", "unshared")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    message = done.stderr
    assert re.search(rf"node {ids['unshared'][:8]} \(\S+\) does not share the run directory", message), message
    assert ids["head"][:8] not in message
    assert not (paths["runs"] / "unshared").exists()  # nothing written
    assert [p.name for p in paths["runs"].iterdir() if p.name.startswith(".hetero_ray_shared")] == []
