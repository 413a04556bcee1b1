"""A PyTorch Lightning job on hetero_ray: a small LightningModule with BatchNorm learns to
classify generated points (nothing downloaded), its data coming from a LightningDataModule;
each worker trains on a share of every global batch that follows its speed.

    pip install '.[lightning]'                               # PyTorch Lightning
    python examples/lightning_module.py                               # a local Ray, 3 workers
    python examples/lightning_module.py --emulate-speeds 1,0.5,0.25   # one fast, two slow workers
    ray job submit --working-dir . -- python examples/lightning_module.py
    # on a cluster add --storage-path /shared/runs: every node sees it (./runs: the job's working-dir copy)

Coming from Ray Train, the loop is Ray Train's Lightning recipe (RayDDPStrategy,
RayLightningEnvironment, RayTrainReportCallback, prepare_trainer) with the imports taken
from ``hetero_ray.train.lightning`` and ``HeteroTrainer`` for ``TorchTrainer``.
"""
import argparse
import os
import time

import lightning
import ray.train
import torch
from torch.utils.data import DataLoader, TensorDataset

import hetero_ray.train
from hetero_ray import HeteroConfig, HeteroTrainer, ProfileModel
from hetero_ray.train.lightning import (
    RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer,
)

try:  # from the repository root, under `ray job submit --working-dir .`, and in the tests
    from examples.own_model import placement
except ModuleNotFoundError:  # `python examples/lightning_module.py`: own_model.py sits beside it
    from own_model import placement

FEATURES, CLASSES = 16, 4


def points(num_samples: int, seed: int) -> TensorDataset:
    """Seeded random points, labelled by the quadrant of two of their features: the same on
    every worker for a seed (each picks its share by index)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, FEATURES, generator=generator)
    return TensorDataset(x, (x[:, 0] > 0).long() * 2 + (x[:, 1] > 0).long())


def make_network() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.BatchNorm1d(64), torch.nn.Tanh(),
                               torch.nn.Linear(64, CLASSES))


class Classifier(lightning.LightningModule):
    def __init__(self, lr: float):
        super().__init__()
        self.net, self.lr = make_network(), lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)  # the MEAN over the local batch
        self.log("loss", loss, sync_dist=True, prog_bar=True, on_step=True, on_epoch=True)  # the global batch's
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_accuracy", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.max_epochs)]


class Points(lightning.LightningDataModule):
    def __init__(self, num_samples: int, batch_size: int):
        super().__init__()
        self.num_samples, self.batch_size = num_samples, batch_size

    def train_dataloader(self):
        # batch_size is per worker, as in Ray Train; hetero_ray gives each rank its share of the global batch.
        return DataLoader(points(self.num_samples, seed=0), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(points(self.num_samples // 4, seed=1), batch_size=self.batch_size)


def train_loop(config: dict) -> None:
    on_gpu = hetero_ray.train.get_device().type == "cuda"  # each rank its own kind under --worker-devices
    trainer = lightning.Trainer(
        max_epochs=config["epochs"], devices="auto", accelerator="gpu" if on_gpu else "cpu",
        strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback(every_n_train_steps=config["checkpoint_every"])],
        enable_checkpointing=False, logger=False, precision=config["precision"])
    trainer = prepare_trainer(trainer)
    model, data = Classifier(config["lr"]), Points(config["num_samples"], config["per_device_batch_size"])
    checkpoint = hetero_ray.train.get_checkpoint()  # a restart, or an old --name resumed
    if checkpoint is None:
        trainer.fit(model, datamodule=data)
        return
    with checkpoint.as_directory() as directory:
        trainer.fit(model, datamodule=data, ckpt_path=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME))


def profile_batch(batch_size: int):
    return points(batch_size, seed=2).tensors


# How to build the network and a batch of b samples: each node's devices are timed with it
# before the first step (and, under --emulate-speeds, each worker times itself).
PROFILE = ProfileModel(build=make_network, make_batch=profile_batch, name="points-mlp")  # cross-entropy loss


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-workers", type=int, default=3, help="training workers (Ray actors), one share each")
    p.add_argument("--global-batch-size", type=int, default=96, help="samples per optimiser step, all workers together")
    p.add_argument("--epochs", type=int, default=4, help="enough to see the loss fall, short enough for a laptop")
    p.add_argument("--num-samples", type=int, default=3840, help="dataset size: 40 global steps an epoch at 96")
    p.add_argument("--lr", type=float, default=0.1, help="SGD with momentum; depends on the global batch alone")
    p.add_argument("--checkpoint-every", type=int, default=20, help="a checkpoint in Ray Train's Result every N steps")
    p.add_argument("--precision", default="32-true", help="Lightning's precision, e.g. bf16-mixed or 16-mixed (GPUs)")
    p.add_argument("--emulate-speeds", help="per-worker fraction of real speed, e.g. 1,0.5,0.25 (default: as is)")
    p.add_argument("--storage-path", type=os.path.abspath, default="./runs", help="runs go here (shared on a cluster)")
    p.add_argument("--name", default=time.strftime("lightning-%Y%m%d-%H%M%S"), help="run folder; an old one resumes")
    p.add_argument("--use-gpu", action="store_true", help="every worker on a GPU of its own")
    p.add_argument("--worker-devices", help="a device per worker, e.g. gpu,cpu,cpu: GPU and CPU machines in one job "
                                            "(nodes labelled hetero-ray.io/device=gpu|cpu, see cluster_configs/)")
    return p


def main(argv=None) -> ray.train.Result:
    args = make_parser().parse_args(argv)
    where = placement(args)
    num_workers = where["scaling_config"].num_workers
    speeds = tuple(map(float, args.emulate_speeds.split(","))) if args.emulate_speeds else None
    trainer = HeteroTrainer(
        train_loop,
        train_loop_config={"num_samples": args.num_samples, "epochs": args.epochs, "lr": args.lr,
                           "checkpoint_every": args.checkpoint_every, "precision": args.precision,
                           "per_device_batch_size": max(1, args.global_batch_size // num_workers)},
        scaling_config=where["scaling_config"],
        run_config=ray.train.RunConfig(name=args.name, storage_path=args.storage_path),
        hetero_config=HeteroConfig(global_batch_size=args.global_batch_size, emulate_speeds=speeds,
                                   profile_model=PROFILE, worker_devices=where["worker_devices"]))
    result = trainer.fit()
    print(f"run files: {os.path.join(args.storage_path, args.name)}\nfinal metrics: {result.metrics}")
    return result


if __name__ == "__main__":
    main()
