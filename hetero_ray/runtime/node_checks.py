"""Multi-node preflight: every node that will host a worker can write the run's folder, sees
the driver's copy of it, and sees the dataset the driver checked.

After connecting and before anything is written, one small task per hosting node (pinned to
it, no CPU reserved) probes that node's view: it writes in the run's folder, reads there the
random token of a marker file the driver leaves for the time of the check, and fingerprints
the dataset as a worker loads it. The driver compares: any difference is a
:class:`UserError` naming the nodes. A one-node cluster on the driver's own node needs no
fan-out. Three parts: :func:`probe` runs on a node (plain Python), :func:`problems` decides
(pure), :func:`check_nodes` fans out with Ray.
Why: docs/operations.md#why-every-node-is-checked
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Optional

from hetero_ray.constants import DEFAULT_NODE_CHECK_TIMEOUT_S, NODE_CHECK_TIMEOUT_S_ENV_VAR, env_float
from hetero_ray.errors import UserError
from hetero_ray.runtime.cluster import NodeResources

NODE_ID_PREFIX_LEN = 8  # as `ray status` and the progress lines shorten node ids


@dataclass(frozen=True)
class DatasetRef:
    """A file dataset as the run reads it (synthetic datasets need no check)."""

    name: str
    data_dir: str
    # Loads it as a worker does, on whichever node calls it: something with ``train`` and
    # ``eval`` splits, each with ``inputs`` and ``targets`` tensors. The job gives it
    # (for the built-in job, :func:`hetero_ray.builtin.data.load_dataset`).
    load: Optional[Callable[[], Any]] = None


@dataclass(frozen=True)
class DatasetFingerprint:
    num_samples: int  # training samples: what the ranks' loaders all-reduce
    md5: str  # over the samples and labels as loaded (train, then eval)


@dataclass(frozen=True)
class NodeProbe:
    """What one node saw; ``None`` fields were not asked or went fine."""

    write_error: Optional[str] = None
    dataset: Optional[DatasetFingerprint] = None
    dataset_error: Optional[str] = None
    sees_driver_folder: Optional[bool] = None  # None: not asked (no marker) or the folder is unusable


@dataclass(frozen=True)
class Marker:
    """The driver's file in the run's folder (or its nearest existing parent) and its token."""

    path: str
    token: str


# --- on the node ----------------------------------------------------------------------


def probe(run_dir: str, dataset: Optional[DatasetRef], marker: Optional[Marker] = None) -> NodeProbe:
    """Runs on one node: can it write where the run's files go, is that the driver's folder,
    and what data does it see?

    Writes one anonymous temporary file in ``run_dir`` or, before the run exists, in its
    nearest existing parent (Ray Train creates the rest from there); the file has no name
    and vanishes when closed, so nothing is left behind and no folder is created.
    """
    sees = _reads_marker(marker) if marker is not None else None
    write_error = None
    existing = _nearest_existing(run_dir)
    try:
        if not os.path.isdir(existing):
            raise NotADirectoryError(f"{existing} is not a directory")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:  # root passes os.access everywhere: only a real write tells
        write_error = f"cannot create files in {existing}: {e.strerror or e}"
    if dataset is None:
        return NodeProbe(write_error, sees_driver_folder=sees)
    try:
        return NodeProbe(write_error, dataset=fingerprint(dataset), sees_driver_folder=sees)
    except UserError as e:  # missing or malformed files on that node: its own message
        return NodeProbe(write_error, dataset_error=str(e), sees_driver_folder=sees)


def _reads_marker(marker: Marker) -> bool:
    try:
        with open(marker.path) as f:
            return f.read() == marker.token
    except OSError:
        return False


@contextlib.contextmanager
def driver_marker(run_dir: str):
    """The driver's marker in ``run_dir``'s nearest existing folder while the block runs
    (None where the driver cannot write there: the write check then names the folder)."""
    folder = _nearest_existing(run_dir)
    marker = Marker(os.path.join(folder, f".hetero_ray_shared_{secrets.token_hex(8)}"), secrets.token_hex(16))
    try:
        with open(marker.path, "x") as f:
            f.write(marker.token)
    except OSError:
        yield None
        return
    try:
        yield marker
    finally:
        with contextlib.suppress(OSError):
            os.remove(marker.path)


def fingerprint(dataset: DatasetRef) -> DatasetFingerprint:
    """Loads the dataset as a worker does and hashes what training would see.

    Hashing the loaded arrays rather than the folder ignores files training never reads
    (the downloaded archive beside the batches) and catches any change to samples, labels
    or their order. Full CIFAR: ~180 MB read once, about a second.
    """
    import numpy as np

    bundle = dataset.load()
    digest = hashlib.md5()
    for split in (bundle.train, bundle.eval):
        for tensor in (split.inputs, split.targets):
            digest.update(np.ascontiguousarray(tensor.numpy()).data)
    return DatasetFingerprint(len(bundle.train), digest.hexdigest())


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


# --- deciding -------------------------------------------------------------------------


def hosting_nodes(nodes: list[NodeResources], selectors: Optional[list[dict]]) -> list[NodeResources]:
    """Nodes a worker may land on: they have CPUs and match some worker's label selector."""
    wanted = [s or {} for s in selectors] if selectors else [{}]
    return [n for n in nodes if n.cpus > 0
            and any(all(n.labels.get(k) == v for k, v in s.items()) for s in wanted)]


def describe(node: NodeResources) -> str:
    return f"node {node.node_id[:NODE_ID_PREFIX_LEN]} ({node.address})"


def problems(probes: dict[str, NodeProbe], nodes: list[NodeResources], run_dir: str,
             expected: Optional[DatasetFingerprint], dataset: Optional[DatasetRef],
             unanswered: list[str], timeout_s: float) -> list[str]:
    """One line per node that cannot host workers, with what to do; empty when all can.

    ``expected`` is the driver's view of the dataset (the copy :mod:`hetero_ray.builtin.preflight`
    already checked): a node that differs from it trains on other samples.
    """
    found = []
    for node in nodes:
        if node.node_id in unanswered:
            found.append(f"{describe(node)} did not answer within {timeout_s:g} s; check it with `ray status` "
                         f"or stop it (waiting longer: {NODE_CHECK_TIMEOUT_S_ENV_VAR})")
            continue
        seen = probes.get(node.node_id)
        if seen is None:
            continue
        if seen.write_error:
            found.append(f"{describe(node)} cannot write the run directory {run_dir} ({seen.write_error}); workers "
                         "there write checkpoints into it: give every node the same writable --storage-path (a "
                         "shared filesystem mounted at the same path)")
        elif seen.sees_driver_folder is False:
            found.append(f"{describe(node)} does not share the run directory {run_dir} with the driver (a file the "
                         "driver wrote there is not there on that node: another disk at the same path); a worker "
                         "restarted on another node could not find its checkpoint: give every node the same "
                         "shared filesystem at that path (--storage-path / RunConfig(storage_path=...)), or a URI "
                         "storage such as s3://")
        if dataset is None:
            continue
        if seen.dataset_error:
            found.append(f"{describe(node)} cannot read --data-dir {dataset.data_dir}: {seen.dataset_error}")
        elif seen.dataset is not None and expected is not None and seen.dataset != expected:
            found.append(f"{describe(node)} sees another {dataset.name} in --data-dir {dataset.data_dir} "
                         f"({seen.dataset.num_samples} training samples, md5 {seen.dataset.md5[:12]}; the driver's: "
                         f"{expected.num_samples}, md5 {expected.md5[:12]}); copy the same files to every node "
                         "(or use a shared folder)")
    return found


# --- fanning out ----------------------------------------------------------------------


def check_nodes(run_dir: str, selectors: Optional[list[dict]] = None, dataset: Optional[DatasetRef] = None,
                emit: Optional[Callable[[str], None]] = None) -> None:
    """Probes every hosting node (see the module docstring); raises :class:`UserError`
    naming the nodes that cannot write ``run_dir`` or see another ``dataset``.

    Runs on the driver, connected, before anything is written.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from hetero_ray.runtime.cluster import alive_nodes

    nodes = hosting_nodes(alive_nodes(), selectors)
    if [n.node_id for n in nodes] in ([], [ray.get_runtime_context().get_node_id()]):
        return  # the driver's own node: preflight already checked this disk
    timeout_s = env_float(NODE_CHECK_TIMEOUT_S_ENV_VAR, DEFAULT_NODE_CHECK_TIMEOUT_S)
    remote_probe = ray.remote(probe)
    with driver_marker(run_dir) as marker:
        refs = {remote_probe.options(num_cpus=0, max_retries=0, name="hetero_ray_node_check",
                                     scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
                .remote(run_dir, dataset, marker): n.node_id for n in nodes}
        expected = fingerprint(dataset) if dataset is not None else None  # meanwhile, the driver's own view
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    probes = {}
    for ref in ready:
        try:
            probes[refs[ref]] = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - a node that cannot even run the probe cannot run workers
            probes[refs[ref]] = NodeProbe(write_error=f"the check could not run there: {type(e).__name__}: {e}")
    for ref in pending:
        ray.cancel(ref, force=True)
    found = problems(probes, nodes, run_dir, expected, dataset, [refs[r] for r in pending], timeout_s)
    if found:
        raise UserError(f"{len(found)} problem(s) on the nodes that would host workers (nothing was written): "
                        + "; ".join(found))
    if emit is not None:
        emit(f"[hetero_ray] {len(nodes)} nodes can write {run_dir}"
             + (f" and see the same {dataset.name} ({expected.num_samples} training samples)" if dataset else ""))

