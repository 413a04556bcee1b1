"""Your own model, Dataset and loop on hetero_ray: a small CNN with BatchNorm learns seeded
synthetic images; each worker trains on a share of every global batch that follows its speed.

    python examples/own_model.py                              # a local Ray, 3 workers
    python examples/own_model.py --emulate-speeds 1,0.5,0.25  # one fast, two slow workers
    ray job submit --working-dir . -- python examples/own_model.py
    # on a cluster add --storage-path /shared/runs: every node sees it (./runs: the job's working-dir copy)
"""
import argparse
import os
import tempfile
import time

import ray.train
import torch
import torch.nn.functional as F
from torch import nn

import hetero_ray.train
from hetero_ray import HeteroConfig, HeteroTrainer, ProfileModel


class NoisyShapes(torch.utils.data.Dataset):
    """3×16×16 noise images in 4 classes, class k brightened by 0.5·k; the same everywhere for a seed."""

    def __init__(self, num_samples: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (num_samples,), generator=generator)
        self.images = torch.randn(num_samples, 3, 16, 16, generator=generator) + 0.5 * self.labels.view(-1, 1, 1, 1)

    def __len__(self): return len(self.labels)
    def __getitem__(self, i): return self.images[i], self.labels[i]  # one sample; the loader batches them


def make_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))


# How to build the model and a batch of b samples: each node's devices are timed with it
# before the first step (and, under --emulate-speeds, each worker times itself), so the
# first plan already follows the speeds.
PROFILE = ProfileModel(build=make_model, make_batch=lambda b: (torch.randn(b, 3, 16, 16), torch.randint(0, 4, (b,))),
                       name="own-cnn")


def train_loop(config: dict) -> None:
    model = hetero_ray.train.prepare_model(make_model())  # DDP; BatchNorm over the whole global batch
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    if (checkpoint := hetero_ray.train.get_checkpoint()) is not None:  # a restart, or an old --name resumed
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    dataset = NoisyShapes(config["num_samples"])
    loader = hetero_ray.train.prepare_data_loader(dataset, num_workers=config["loader_workers"])
    for epoch in range(loader.epoch, config["epochs"]):  # loader.epoch: where a checkpoint left off
        for inputs, labels in loader:  # this rank's share of each global step
            loss = F.cross_entropy(model(inputs), labels)  # the mean over the LOCAL batch
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:  # one copy of the weights is enough
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                           os.path.join(directory, "state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(directory)
            hetero_ray.train.report({"epoch": epoch, "loss": loss.item(), "global_steps": loader.position.global_step},
                                    checkpoint=checkpoint)  # every rank reports: it is a barrier


def make_parser(doc: str = __doc__) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-workers", type=int, default=3, help="training workers (Ray actors), one share each")
    p.add_argument("--global-batch-size", type=int, default=96, help="samples per optimiser step, all workers together")
    p.add_argument("--epochs", type=int, default=2, help="enough to see the loss fall, short enough for a laptop")
    p.add_argument("--num-samples", type=int, default=1920, help="dataset size: 20 global steps an epoch at 96")
    p.add_argument("--lr", type=float, default=0.05, help="SGD, momentum 0.9; depends on the global batch alone")
    p.add_argument("--loader-workers", type=int, default=2, help="DataLoader processes per worker that prefetch")
    p.add_argument("--emulate-speeds", help="per-worker fraction of real speed, e.g. 1,0.5,0.25 (default: as is)")
    p.add_argument("--storage-path", type=os.path.abspath, default="./runs", help="runs go here (shared on a cluster)")
    p.add_argument("--name", default=time.strftime("run-%Y%m%d-%H%M%S"), help="run folder; an old one resumes")
    p.add_argument("--use-gpu", action="store_true", help="every worker on a GPU of its own")
    p.add_argument("--worker-devices", help="a device per worker, e.g. gpu,cpu,cpu: GPU and CPU machines in one job "
                                            "(nodes labelled hetero-ray.io/device=gpu|cpu, see cluster_configs/)")
    return p


def placement(args) -> dict:
    """The run's ScalingConfig and HeteroConfig(worker_devices=...) from --use-gpu / --worker-devices."""
    devices = tuple(args.worker_devices.split(",")) if args.worker_devices else None
    num_workers = len(devices) if devices else args.num_workers
    return {"scaling_config": ray.train.ScalingConfig(num_workers=num_workers, use_gpu=args.use_gpu),
            "worker_devices": devices}


def main(argv=None) -> ray.train.Result:
    args = make_parser().parse_args(argv)
    speeds = tuple(map(float, args.emulate_speeds.split(","))) if args.emulate_speeds else None
    where = placement(args)
    trainer = HeteroTrainer(
        train_loop, train_loop_config={"num_samples": args.num_samples, "epochs": args.epochs, "lr": args.lr,
                                       "loader_workers": args.loader_workers},
        scaling_config=where["scaling_config"],
        run_config=ray.train.RunConfig(name=args.name, storage_path=args.storage_path),
        hetero_config=HeteroConfig(global_batch_size=args.global_batch_size, emulate_speeds=speeds,
                                   profile_model=PROFILE, worker_devices=where["worker_devices"]))
    result = trainer.fit()
    print(f"run files: {os.path.join(args.storage_path, args.name)}\nfinal metrics: {result.metrics}")
    return result


if __name__ == "__main__":
    main()
