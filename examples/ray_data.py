"""Ray Data on hetero_ray: a Ray Train job that reads `datasets={"train": ..., "val": ...}`
with `get_dataset_shard(...).iter_torch_batches()`, where each worker's share of every global
batch follows its speed. The images are made and augmented by `map_batches` on the cluster's
CPUs (CPU-only nodes included) while the workers train; nothing is downloaded.

    python examples/ray_data.py                              # a local Ray, 3 workers
    python examples/ray_data.py --emulate-speeds 1,0.5,0.25  # one fast, two slow workers
    ray job submit --working-dir . -- python examples/ray_data.py --storage-path /shared/runs
"""
import os
import tempfile

import numpy as np
import ray
import ray.train
import torch
import torch.nn.functional as F

import hetero_ray.train
from hetero_ray import HeteroConfig, HeteroTrainer

try:  # the same CNN and flags as own_model.py
    from examples.own_model import PROFILE, make_model, make_parser, placement
except ModuleNotFoundError:  # `python examples/ray_data.py`: own_model.py sits beside it
    from own_model import PROFILE, make_model, make_parser, placement


def noisy_shapes(batch: dict) -> dict:
    """Rows → 3×16×16 images of 4 classes, class k brightened by 0.5·k (seeded by the row id)."""
    ids = batch["id"]
    labels = ids % 4
    images = np.stack([np.random.default_rng(int(i)).standard_normal((3, 16, 16), dtype=np.float32) for i in ids])
    return {"id": ids, "image": images + 0.5 * labels[:, None, None, None].astype(np.float32), "label": labels}


def flip(batch: dict) -> dict:
    """Augmentation on the cluster: every other image mirrored (by row id, so every reading is the same)."""
    images = batch["image"].copy()
    images[batch["id"] % 2 == 1] = images[batch["id"] % 2 == 1, :, :, ::-1]
    return {**batch, "image": images}


def rows(count: int) -> ray.data.Dataset:
    """Row ids 0…count-1 in blocks of up to 256 rows. (Left to itself, ray.data.range cuts a
    small range into up to 200 blocks of a row or a few: a task each, which costs more than
    the rows. Data read from files comes in blocks of its files' size instead.)"""
    return ray.data.range(count, override_num_blocks=max(1, -(-count // 256)))


def train_loop(config: dict) -> None:
    model = hetero_ray.train.prepare_model(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    if (checkpoint := hetero_ray.train.get_checkpoint()) is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    train = hetero_ray.train.get_dataset_shard("train")
    val = hetero_ray.train.get_dataset_shard("val")
    for epoch in range(train.epoch, config["epochs"]):  # train.epoch: where a checkpoint left off
        model.train()
        for batch in train.iter_torch_batches(local_shuffle_buffer_size=256):  # this rank's share of each step
            loss = F.cross_entropy(model(batch["image"]), batch["label"])  # the mean over the LOCAL batch
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        correct = seen = torch.zeros(1)
        with torch.no_grad():
            for batch in val.iter_torch_batches(batch_size=64):  # every validation row once across workers
                correct = correct + (model(batch["image"]).argmax(1) == batch["label"]).sum()
                seen = seen + len(batch["label"])
        totals = torch.cat([correct, seen])
        torch.distributed.all_reduce(totals)
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                           os.path.join(directory, "state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(directory)
            hetero_ray.train.report({"epoch": epoch, "loss": loss.item(),
                                     "val_accuracy": (totals[0] / totals[1]).item()}, checkpoint=checkpoint)


def main(argv=None) -> ray.train.Result:
    args = make_parser(__doc__).parse_args(argv)
    speeds = tuple(map(float, args.emulate_speeds.split(","))) if args.emulate_speeds else None
    where = placement(args)
    datasets = {"train": rows(args.num_samples).map_batches(noisy_shapes).map_batches(flip),
                "val": rows(args.num_samples // 4).map_batches(noisy_shapes)}
    trainer = HeteroTrainer(
        train_loop, train_loop_config={"epochs": args.epochs, "lr": args.lr},
        scaling_config=where["scaling_config"], datasets=datasets,
        run_config=ray.train.RunConfig(name=args.name, storage_path=args.storage_path),
        hetero_config=HeteroConfig(global_batch_size=args.global_batch_size, emulate_speeds=speeds,
                                   profile_model=PROFILE, worker_devices=where["worker_devices"]))
    result = trainer.fit()
    print(f"run files: {os.path.join(args.storage_path, args.name)}\nfinal metrics: {result.metrics}")
    return result


if __name__ == "__main__":
    main()
