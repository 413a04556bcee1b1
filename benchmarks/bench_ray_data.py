"""Ray Data against the map-style loader, and against plain Ray Train, on one local Ray.

1. Throughput: the same model, rows and emulated speeds, trained by hetero_ray once from a
   map-style dataset (``prepare_data_loader``) and once from Ray Data
   (``datasets={"train": ...}`` + ``get_dataset_shard``), each with a CPU-heavy transform
   (``--transform-ms`` of work per row, done by the DataLoader's workers in the first, by a
   ``map_batches`` on the cluster's CPUs in the second). Prints both runs' steady samples/s
   and their ratio (goal ≥ 0.9).
2. Final loss on identical workers: hetero_ray on Ray Data against plain Ray Train's
   ``TorchTrainer`` on the same Ray Data pipeline (``streaming_split``, equal shares),
   dropout off; and hetero_ray again with another row order (``local_shuffle_seed``), which
   says how much of the difference row order alone makes.

    python benchmarks/bench_ray_data.py                  # minutes; run it alone on the machine
    python benchmarks/bench_ray_data.py --skip-loss      # throughput only
    python benchmarks/bench_ray_data.py --two-nodes      # 3. below (root: cgroup v1 CPU quotas)
    RAY_ADDRESS=... python benchmarks/bench_ray_data.py --gpu   # 4. below (gpu_check.py's ray-data stage)

3. A CPU-only node beside a training node (``--two-nodes``): two real Ray nodes on this
   machine, each held to ``--node-cores`` by a cgroup CPU quota; the same CPU-heavy
   pipeline with its ``map_batches`` on the CPU-only node (feeding), on the training node
   itself, and anywhere, and the CPU-only node as a second training rank instead. Prints
   the samples/s of each and which is fastest; then one more run with both nodes' ranks
   in which the run decides itself (``HeteroConfig.feed_trial``: rank 1 measured training
   and left out, the faster kept) and prints that decision from its decisions.parquet,
   and whether it picked what the separate runs found faster.

4. A GPU rank fed by the cluster's CPUs (``--gpu``, on a cluster with nodes labelled
   ``hetero-ray.io/device=gpu|cpu``): the same transform in the GPU rank's own DataLoader
   (``--loader-workers`` processes on the GPU node), against a ``map_batches`` on the
   CPU-only node, and anywhere. Prints the samples/s of each and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Optional

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FEATURES = 64
# Both sides report every epoch, and a report waits for Ray Train's controller to take the
# one before it: at its default look every 2 s, epochs shorter than that were paced at 2 s
# from the third on, whatever trained them. Every run here looks every 0.1 s.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
# The workers import this checkout, and whatever else PYTHONPATH holds here (a GPU machine's Ray bundle).
WORKER_ENV = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}}


def rows_of(ids: np.ndarray) -> dict:
    """Each row's features and label, made from its id (the same in every reading)."""
    generator = np.random.default_rng(0)
    centres = generator.standard_normal((4, FEATURES)).astype(np.float32)
    labels = ids % 4
    noise = np.stack([np.random.default_rng(int(i)).standard_normal(FEATURES, dtype=np.float32) for i in ids])
    return {"x": centres[labels] + 2.0 * noise, "label": labels.astype(np.int64)}


def transform(batch: dict, transform_ms: float) -> dict:
    """A CPU-heavy per-row step (an augmentation's cost), then the row's features."""
    deadline = time.perf_counter() + transform_ms * 1e-3 * len(batch["id"])
    while time.perf_counter() < deadline:
        pass
    return {"id": batch["id"], **rows_of(batch["id"])}


class Rows(torch.utils.data.Dataset):
    """The same rows as a map-style dataset; the transform runs in the DataLoader's workers."""

    def __init__(self, num_rows: int, transform_ms: float):
        self.num_rows, self.transform_ms = num_rows, transform_ms

    def __len__(self):
        return self.num_rows

    def __getitem__(self, i):
        row = transform({"id": np.array([i])}, self.transform_ms)
        return torch.from_numpy(row["x"][0]), int(row["label"][0])


def make_model(hidden: int = 256) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                               torch.nn.Tanh(), torch.nn.Linear(hidden, 4))


def hetero_loop(config: dict) -> None:
    import hetero_ray.train

    model = hetero_ray.train.prepare_model(make_model(config["hidden"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    if config["source"] == "ray_data":
        shard = hetero_ray.train.get_dataset_shard("train")
        batches = lambda: ((b["x"], b["label"]) for b in shard.iter_torch_batches(  # noqa: E731
            local_shuffle_buffer_size=256, local_shuffle_seed=config.get("order_seed")))
    else:
        loader = hetero_ray.train.prepare_data_loader(Rows(config["num_rows"], config["transform_ms"]),
                                                      num_workers=config["loader_workers"], shuffle=False)
        batches = lambda: iter(loader)  # noqa: E731
    device = hetero_ray.train.get_device()
    for epoch in range(config["epochs"]):
        total, count = torch.zeros(1, device=device), torch.zeros(1)
        for x, y in batches():
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if not hetero_ray.train.is_probe_step():
                total += loss.detach() * len(y)
                count += len(y)
        total = total.cpu()  # gloo between GPU and CPU ranks: the sums travel on the CPU
        torch.distributed.all_reduce(total)
        torch.distributed.all_reduce(count)
        hetero_ray.train.report({"epoch": epoch, "loss": (total / count).item()})


def plain_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch

    model = ray.train.torch.prepare_model(make_model(config["hidden"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    shard = ray.train.get_dataset_shard("train")
    local_batch = config["global_batch_size"] // ray.train.get_context().get_world_size()
    for epoch in range(config["epochs"]):
        total, count = torch.zeros(1), torch.zeros(1)
        for batch in shard.iter_torch_batches(batch_size=local_batch):
            loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(batch["label"])
            count += len(batch["label"])
        torch.distributed.all_reduce(total)
        torch.distributed.all_reduce(count)
        ray.train.report({"epoch": epoch, "loss": (total / count).item()})
    if ray.train.get_context().get_world_rank() == 0:  # Result.metrics keeps only reports with a checkpoint
        with open(config["result_path"], "w") as f:
            json.dump({"loss": (total / count).item()}, f)


def pipeline(num_rows: int, transform_ms: float, on: Optional[str] = None, labels: Optional[dict] = None):
    """The rows through the CPU-heavy transform; ``on``: the custom resource of the node it
    must run on; ``labels``: the node labels it must run on."""
    import ray

    where = {"resources": {on: 0.01}} if on else {}
    if labels:
        where["label_selector"] = labels
    return ray.data.range(num_rows).map_batches(transform, fn_kwargs={"transform_ms": transform_ms}, **where)


def hetero_fit(args, storage: str, name: str, source: str, speeds, order_seed=None, *, datasets=None,
               workers: Optional[dict] = None, **hetero) -> dict:
    from ray.train import RunConfig, ScalingConfig

    from hetero_ray import HeteroConfig, HeteroTrainer

    config = {"source": source, "num_rows": args.num_rows, "transform_ms": args.transform_ms, "lr": args.lr,
              "hidden": args.hidden,
              "epochs": args.epochs, "loader_workers": args.loader_workers, "order_seed": order_seed}
    if datasets is None and source == "ray_data":
        datasets = {"train": pipeline(args.num_rows, args.transform_ms)}
    trainer = HeteroTrainer(hetero_loop, train_loop_config=config, datasets=datasets,
                            scaling_config=ScalingConfig(num_workers=len(speeds), resources_per_worker=workers),
                            run_config=RunConfig(name=name, storage_path=storage),
                            hetero_config=HeteroConfig(global_batch_size=args.global_batch_size,
                                                       emulate_speeds=None if set(speeds) == {1.0} else speeds,
                                                       policy="optimal", **hetero),
                            emit=lambda line: None)
    trainer.fit()
    run_dir = os.path.join(storage, name)
    reports = pd.read_parquet(os.path.join(run_dir, "reports.parquet")).sort_values("global_step")
    return {"samples_per_s": _samples_per_s(run_dir), "loss": json.loads(reports["metrics"].iloc[-1])["loss"],
            "decision": _feeding_decision(run_dir)}


def _feeding_decision(run_dir: str) -> Optional[dict]:
    """The run's feeding trial, from its decisions.parquet: ``{"feeds", "reason"}`` of its
    verdict, or ``{"feeds": None, "reason"}`` of the row that says why there was none; None
    without a trial."""
    path = os.path.join(run_dir, "decisions.parquet")
    if not os.path.exists(path):
        return None
    decisions = pd.read_parquet(path).sort_values("global_step")
    if "samples_per_s_feeding" not in decisions.columns:
        return None
    verdicts = decisions[decisions["samples_per_s_feeding"].notna()]
    if len(verdicts):
        row = verdicts.iloc[-1]
        return {"feeds": len(row["feeding_ranks"]) > 0, "reason": row["reason"]}
    trial = decisions[decisions["reason"].str.contains("feeding trial")]
    return {"feeds": None, "reason": trial["reason"].iloc[-1]} if len(trial) else None


def _samples_per_s(run_dir: str) -> float:
    """Samples per wall-clock second from the end of the first step to the end of the last
    (every epoch's pipeline included: Ray Data reads ahead, so a window of late steps would
    find them already read)."""
    from hetero_ray.metrics.summary import per_step

    table = per_step(pd.read_parquet(os.path.join(run_dir, "steps.parquet")))
    return float(table["samples"].iloc[1:].sum() / (table["end_wall_time"].iloc[-1] - table["end_wall_time"].iloc[0]))


def plain_fit(args, storage: str, num_workers: int) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    result_path = os.path.join(storage, "plain.json")
    trainer = TorchTrainer(plain_loop, train_loop_config={"lr": args.lr, "epochs": args.epochs, "hidden": args.hidden,
                                                          "global_batch_size": args.global_batch_size,
                                                          "result_path": result_path},
                           datasets={"train": pipeline(args.num_rows, args.transform_ms)},
                           scaling_config=ScalingConfig(num_workers=num_workers),
                           run_config=RunConfig(name="plain", storage_path=storage))
    trainer.fit()
    with open(result_path) as f:
        return json.load(f)["loss"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-rows", type=int, default=4096)
    p.add_argument("--global-batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--transform-ms", type=float, default=0.2, help="CPU work per row, in the pipeline")
    p.add_argument("--hidden", type=int, default=256, help="the model's hidden width (its weights grow as its square)")
    p.add_argument("--loader-workers", type=int, default=1, help="the map-style run's DataLoader processes")
    p.add_argument("--emulate-speeds", default="1,0.5", help="the throughput runs' workers")
    p.add_argument("--identical-workers", type=int, default=2, help="the final-loss runs' workers")
    p.add_argument("--skip-loss", action="store_true")
    p.add_argument("--two-nodes", action="store_true", help="only 3.: a CPU-only node feeding or training")
    p.add_argument("--node-cores", type=float, default=1.0, help="each node's CPU quota, in cores")
    p.add_argument("--gpu", action="store_true",
                   help="only 4.: on the Ray cluster at RAY_ADDRESS (nodes labelled hetero-ray.io/device=gpu|cpu, "
                        "as benchmarks/gpu_check.py starts them), a GPU rank fed by Ray Data against its own DataLoader")
    p.add_argument("--json", help="with --gpu: also write the figures to this JSON file")
    p.add_argument("--decide-epochs", type=int, default=8, help="--two-nodes: epochs of the run that decides itself")
    p.add_argument("--decide-only", action="store_true", help="--two-nodes: only the run that decides itself")
    args = p.parse_args(argv)
    if args.two_nodes:
        return two_nodes(args)
    if args.gpu:
        return gpu_fed(args)
    import ray

    ray.init(num_cpus=max(4, os.cpu_count() or 1), logging_level="ERROR",
             runtime_env=WORKER_ENV)
    speeds = tuple(float(s) for s in args.emulate_speeds.split(","))
    with tempfile.TemporaryDirectory() as storage:
        print(f"throughput: {args.num_rows} rows × {args.epochs} epochs, global batch {args.global_batch_size}, "
              f"{args.transform_ms} ms of CPU work per row, emulated speeds {speeds}", flush=True)
        mapped = hetero_fit(args, storage, "map-style", "map", speeds)
        fed = hetero_fit(args, storage, "ray-data", "ray_data", speeds)
        ratio = fed["samples_per_s"] / mapped["samples_per_s"]
        print(f"  map-style (prepare_data_loader, {args.loader_workers} loader worker(s)): "
              f"{mapped['samples_per_s']:.0f} samples/s")
        print(f"  Ray Data (get_dataset_shard):                    {fed['samples_per_s']:.0f} samples/s")
        print(f"  Ray Data ÷ map-style: {ratio:.2f} (goal ≥ 0.9)", flush=True)
        if args.skip_loss:
            return
        same = (1.0,) * args.identical_workers
        hetero = hetero_fit(args, storage, "identical", "ray_data", same)["loss"]
        reordered = hetero_fit(args, storage, "identical-reordered", "ray_data", same, order_seed=1)["loss"]
        plain = plain_fit(args, storage, args.identical_workers)
        print(f"final loss, {args.identical_workers} identical workers: hetero_ray {hetero:.4f}, plain Ray Train "
              f"{plain:.4f} ({abs(hetero - plain) / plain * 100:.1f} %; goal ≤ 2 %); another row order alone "
              f"moves hetero_ray's by {abs(hetero - reordered) / hetero * 100:.1f} % ({reordered:.4f})")


def two_nodes(args) -> None:
    if os.path.exists(os.path.expanduser("~/.ray/auth_token")):  # as `ray start` finds it (read when Ray loads)
        os.environ["RAY_AUTH_MODE"] = "token"
    import ray

    from benchmarks.local_cluster import (cgroup_unusable_reason, free_port, set_cpu_quota, start_node, stop_nodes,
                                          wait_for_nodes, wait_for_port)

    reason = cgroup_unusable_reason()
    if reason:
        print(f"--two-nodes: {reason}; skipped")
        return
    port = free_port()
    address = f"127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as logs, tempfile.TemporaryDirectory() as storage:
        nodes = [start_node(port=port, num_cpus=2, resources={"train_node": 1, "slot": 1}, cpu_quota=args.node_cores,
                            log_dir=logs)]
        try:
            wait_for_port(port, nodes[0])  # the GCS must listen before the other node joins
            nodes.append(start_node(address=address, num_cpus=2, resources={"data_node": 1, "slot": 1},
                                    cpu_quota=args.node_cores, log_dir=logs))
            wait_for_nodes(address, 2, nodes)
            for node in nodes:
                set_cpu_quota(node, args.node_cores)
            ray.init(address=address, logging_level="ERROR", runtime_env=WORKER_ENV)
            print(f"two nodes of {args.node_cores:g} core(s) each; {args.transform_ms} ms of CPU work per row in "
                  f"map_batches; global batch {args.global_batch_size}", flush=True)
            train_node = {"CPU": 1, "train_node": 0.5}
            runs = {
                "CPU-only node feeds (map_batches there), training node trains": dict(
                    datasets={"train": pipeline(args.num_rows, args.transform_ms, on="data_node")}, workers=train_node),
                "transform on the training node itself": dict(
                    datasets={"train": pipeline(args.num_rows, args.transform_ms, on="train_node")}, workers=train_node),
                "transform anywhere, training node trains": dict(
                    datasets={"train": pipeline(args.num_rows, args.transform_ms)}, workers=train_node),
            }
            figures = {}
            for i, (label, run) in enumerate(runs.items() if not args.decide_only else ()):
                figures[label] = hetero_fit(args, storage, f"node-{i}", "ray_data", (1.0,), **run)["samples_per_s"]
                print(f"  {label}: {figures[label]:.0f} samples/s", flush=True)
            label = "CPU-only node as a second training rank (transform anywhere)"
            if not args.decide_only:
                figures[label] = hetero_fit(args, storage, "node-train", "ray_data", (1.0, 1.0),
                                            workers={"CPU": 1, "slot": 1})["samples_per_s"]
                print(f"  {label}: {figures[label]:.0f} samples/s", flush=True)
                feeding = list(figures.values())[0]
                print(f"  feeding ÷ training: {feeding / figures[label]:.2f}; fastest: "
                      f"{max(figures, key=figures.get)}", flush=True)
            # The run decides itself: both nodes' ranks; epochs enough for the policy to settle
            # and for both of the trial's windows (periods are counted within an epoch).
            longer = argparse.Namespace(**{**vars(args), "epochs": args.decide_epochs})
            decided = hetero_fit(longer, storage, "node-decides", "ray_data", (1.0, 1.0),
                                 workers={"CPU": 1, "slot": 1}, rebalance_interval=4, feed_trial_steps=10)["decision"]
            if decided is None or decided["feeds"] is None:
                print(f"  the run's decision: none ({decided['reason'] if decided else 'no feeding trial ran'})")
            else:
                agrees = "" if args.decide_only else (
                    f"; {'the same as' if decided['feeds'] == (feeding > figures[label]) else 'NOT'} the faster of "
                    "the separate runs above")
                print(f"  the run's decision: {'feeding' if decided['feeds'] else 'training'} — "
                      f"{decided['reason']}{agrees}")
        finally:
            ray.shutdown()
            stop_nodes(nodes)


def gpu_fed(args) -> None:
    """4. One GPU rank on the node labelled gpu, its batches made by the CPU-heavy transform:
    in its own DataLoader's ``--loader-workers`` processes (the GPU node's cores), or by a
    ``map_batches`` on the CPU-only node (label cpu) or anywhere on the cluster."""
    if os.path.exists(os.path.expanduser("~/.ray/auth_token")):  # as `ray start` finds it (read when Ray loads)
        os.environ["RAY_AUTH_MODE"] = "token"
    import ray

    from hetero_ray.constants import DEVICE_LABEL

    address = os.environ.get("RAY_ADDRESS")
    if not address:
        raise SystemExit("--gpu: set RAY_ADDRESS to a cluster with nodes labelled hetero-ray.io/device=gpu|cpu "
                         "(benchmarks/gpu_check.py starts one)")
    ray.init(address=address, logging_level="ERROR", runtime_env=WORKER_ENV)
    cpus = {label: sum(n["Resources"].get("CPU", 0) for n in ray.nodes()
                       if n["Alive"] and n.get("Labels", {}).get(DEVICE_LABEL) == label) for label in ("gpu", "cpu")}
    print(f"one GPU rank, {args.transform_ms} ms of CPU work per row, {args.num_rows} rows × {args.epochs} epochs, "
          f"global batch {args.global_batch_size}; GPU node {cpus['gpu']:g} CPUs, CPU-only node {cpus['cpu']:g}",
          flush=True)
    gpu_rank = {"CPU": args.loader_workers}
    runs = {
        f"own DataLoader ({args.loader_workers} worker processes on the GPU node)": dict(source="map"),
        "Ray Data, map_batches on the CPU-only node": dict(
            source="ray_data", datasets={"train": pipeline(args.num_rows, args.transform_ms,
                                                           labels={DEVICE_LABEL: "cpu"})}),
        "Ray Data, map_batches anywhere": dict(source="ray_data"),
    }
    figures = {}
    with tempfile.TemporaryDirectory() as storage:
        for i, (label, run) in enumerate(runs.items()):
            figures[label] = hetero_fit(args, storage, f"gpu-{i}", run["source"], (1.0,), datasets=run.get("datasets"),
                                        workers=gpu_rank, worker_devices=("gpu",))["samples_per_s"]
            print(f"  {label}: {figures[label]:,.0f} samples/s", flush=True)
    own = next(iter(figures.values()))
    for label, value in list(figures.items())[1:]:
        print(f"  {label} ÷ own DataLoader: {value / own:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": cpus, "transform_ms": args.transform_ms, "samples_per_s": figures}, f, indent=1)
    ray.shutdown()


if __name__ == "__main__":
    main()
