"""examples/own_model.py with TensorBoard: rank 0 alone writes (as Ray Train recommends) its loss
and its share of the global batch every step, and the epoch's mean loss and time every epoch.

    pip install tensorboard
    python examples/tensorboard_logging.py --emulate-speeds 1,0.5,0.25
    ray job submit --working-dir . -- python examples/tensorboard_logging.py
    tensorboard --logdir runs                 # then open http://localhost:6006
    # on a cluster add --storage-path /shared/runs: every node sees it (./runs: the job's working-dir copy)
"""
import os
import tempfile
import time

import ray.train
import torch
import torch.nn.functional as F
from torch.utils.tensorboard import SummaryWriter

import hetero_ray.train
from hetero_ray import HeteroConfig, HeteroTrainer

try:  # from the repository root, under `ray job submit --working-dir .`, and in the tests
    from examples.own_model import PROFILE, NoisyShapes, make_model, make_parser, placement
except ModuleNotFoundError:  # `python examples/tensorboard_logging.py`: own_model.py sits beside it
    from own_model import PROFILE, NoisyShapes, make_model, make_parser, placement


def train_loop(config: dict) -> None:
    model = hetero_ray.train.prepare_model(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    if (checkpoint := hetero_ray.train.get_checkpoint()) is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    dataset = NoisyShapes(config["num_samples"])
    loader = hetero_ray.train.prepare_data_loader(dataset, num_workers=config["loader_workers"])
    rank0 = ray.train.get_context().get_world_rank() == 0
    # One writer. purge_step: after a restart, TensorBoard hides what was logged past the checkpoint.
    writer = SummaryWriter(config["logdir"], purge_step=loader.position.global_step) if rank0 else None
    for epoch in range(loader.epoch, config["epochs"]):
        started, losses = time.perf_counter(), []
        for inputs, labels in loader:
            step = loader.position.global_step  # this batch's global step: the same x axis on every run
            loss = F.cross_entropy(model(inputs), labels)  # the mean over the LOCAL batch
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if writer is not None:
                losses.append(loss.item())
                writer.add_scalar("train/loss", losses[-1], step)  # over rank 0's local batch
                writer.add_scalar("train/local_batch_size", len(labels), step)  # rank 0's share: follows its speed
        if writer is not None:
            writer.add_scalar("epoch/loss", sum(losses) / len(losses), epoch)
            writer.add_scalar("epoch/time_s", time.perf_counter() - started, epoch)
            writer.flush()  # visible in TensorBoard now, not when the run ends
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if rank0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                           os.path.join(directory, "state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(directory)
            hetero_ray.train.report({"epoch": epoch, "loss": loss.item(), "global_steps": loader.position.global_step},
                                    checkpoint=checkpoint)
    if writer is not None:
        writer.close()


def main(argv=None) -> ray.train.Result:
    parser = make_parser(__doc__)
    parser.add_argument("--logdir", help="TensorBoard's folder (default: tensorboard/ in the run's folder)")
    args = parser.parse_args(argv)
    run_dir = os.path.join(args.storage_path, args.name)  # --storage-path is absolute: workers start elsewhere
    speeds = tuple(map(float, args.emulate_speeds.split(","))) if args.emulate_speeds else None
    logdir = os.path.abspath(args.logdir) if args.logdir else os.path.join(run_dir, "tensorboard")
    where = placement(args)
    trainer = HeteroTrainer(
        train_loop, train_loop_config={"num_samples": args.num_samples, "epochs": args.epochs, "lr": args.lr,
                                       "loader_workers": args.loader_workers, "logdir": logdir},
        scaling_config=where["scaling_config"],
        run_config=ray.train.RunConfig(name=args.name, storage_path=args.storage_path),
        hetero_config=HeteroConfig(global_batch_size=args.global_batch_size, emulate_speeds=speeds,
                                   profile_model=PROFILE, worker_devices=where["worker_devices"]))
    result = trainer.fit()
    print(f"run files: {run_dir}\nTensorBoard: tensorboard --logdir {logdir}\nfinal metrics: {result.metrics}")
    return result


if __name__ == "__main__":
    main()
