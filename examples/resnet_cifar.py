"""torchvision's ResNet-18 on CIFAR-10 with hetero_ray: each worker trains on a share of every
global batch that follows its speed; BatchNorm normalises over the whole global batch.

Reads the python-pickle batches (cifar-10-batches-py, as in cifar-10-python.tar.gz) from --data-dir;
nothing is downloaded. Each file must have its published md5 unless --no-verify-checksums.

    python examples/resnet_cifar.py --data-dir ./data                # a local Ray, 3 workers
    python examples/resnet_cifar.py --data-dir ./data --emulate-speeds 1,0.5,0.25
    ray job submit --working-dir . -- python examples/resnet_cifar.py --data-dir /shared/data
    # on a cluster add --storage-path /shared/runs: every node sees it (./runs: the job's working-dir copy)
"""
import argparse
import os
import tempfile
import time

import ray.train
import torch
import torch.nn.functional as F
from torchvision.models import resnet18

import hetero_ray.train
from hetero_ray import HeteroConfig, HeteroTrainer
from hetero_ray.datasets import CIFAR10  # training images normalised per channel as they are read (no augmentation)


def train_loop(config: dict) -> None:
    model = hetero_ray.train.prepare_model(resnet18(num_classes=10))  # BatchNorm exact over the global batch
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9, weight_decay=5e-4)
    if (checkpoint := hetero_ray.train.get_checkpoint()) is not None:  # a restart, or an old --name resumed
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    dataset = CIFAR10(config["data_dir"], verify_checksums=config["verify_checksums"])
    loader = hetero_ray.train.prepare_data_loader(dataset, num_workers=config["loader_workers"])
    for epoch in range(loader.epoch, config["epochs"]):  # loader.epoch: where a checkpoint left off
        for images, labels in loader:  # this rank's share of each global step
            loss = F.cross_entropy(model(images), labels)  # the mean over the LOCAL batch
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


def main(argv=None) -> ray.train.Result:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=os.path.abspath, default="./data",
                   help="the folder that holds cifar-10-batches-py (at this path on every node)")
    p.add_argument("--no-verify-checksums", dest="verify_checksums", action="store_false",
                   help="accept files without the published md5 (a copy you made and trust, e.g. a subset)")
    p.add_argument("--num-workers", type=int, default=3, help="training workers (Ray actors), one share each")
    p.add_argument("--global-batch-size", type=int, default=128, help="the usual CIFAR batch; all workers together")
    p.add_argument("--epochs", type=int, default=2, help="a first look; the CIFAR recipe trains ~200 with a schedule")
    p.add_argument("--lr", type=float, default=0.1, help="the usual CIFAR recipe at batch 128 (momentum 0.9, wd 5e-4)")
    p.add_argument("--loader-workers", type=int, default=2, help="DataLoader processes per worker that prefetch")
    p.add_argument("--emulate-speeds", help="per-worker fraction of real speed, e.g. 1,0.5,0.25 (default: as is)")
    p.add_argument("--storage-path", type=os.path.abspath, default="./runs", help="runs go here (shared on a cluster)")
    p.add_argument("--name", default=time.strftime("resnet-%Y%m%d-%H%M%S"), help="run folder; an old one resumes")
    p.add_argument("--use-gpu", action="store_true", help="every worker on a GPU of its own")
    p.add_argument("--worker-devices", help="a device per worker, e.g. gpu,cpu,cpu: GPU and CPU machines in one job "
                                            "(nodes labelled hetero-ray.io/device=gpu|cpu, see cluster_configs/)")
    args = p.parse_args(argv)
    devices = tuple(args.worker_devices.split(",")) if args.worker_devices else None
    CIFAR10.check(args.data_dir, verify_checksums=args.verify_checksums)  # fail here, not in N workers
    speeds = tuple(map(float, args.emulate_speeds.split(","))) if args.emulate_speeds else None
    trainer = HeteroTrainer(
        train_loop, train_loop_config={"data_dir": args.data_dir, "verify_checksums": args.verify_checksums,
                                       "epochs": args.epochs, "lr": args.lr, "loader_workers": args.loader_workers},
        scaling_config=ray.train.ScalingConfig(num_workers=len(devices) if devices else args.num_workers,
                                               use_gpu=args.use_gpu),
        run_config=ray.train.RunConfig(name=args.name, storage_path=args.storage_path),
        hetero_config=HeteroConfig(global_batch_size=args.global_batch_size, emulate_speeds=speeds,
                                   worker_devices=devices))
    result = trainer.fit()
    print(f"run files: {os.path.join(args.storage_path, args.name)}\nfinal metrics: {result.metrics}")
    return result


if __name__ == "__main__":
    main()
