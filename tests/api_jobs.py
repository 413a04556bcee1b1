"""User-style jobs on the public API, shared by the API tests (importable by Ray workers).

Each is what a person would write: an nn.Module with BatchNorm, a map-style Dataset whose
``__getitem__`` returns one sample, a loop of plain PyTorch. ``one_device`` trains the
same model on the same global batches in one process, with torch's own BatchNorm: the
reference every hetero_ray run must reach.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import ray.train
import torch
import torch.nn.functional as F
from torch import nn

import hetero_ray.train
from hetero_ray.runs import run_files
from hetero_ray.sampler import GlobalSampler

LR, MOMENTUM = 0.1, 0.9


class PatternDataset(torch.utils.data.Dataset):
    """Small 3×8×8 images in 4 classes, fixed by the seed."""

    def __init__(self, num_samples: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, 4, (num_samples,), generator=generator)
        self.inputs = torch.randn(num_samples, 3, 8, 8, generator=generator) + self.targets.view(-1, 1, 1, 1) * 0.3

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.inputs[index], self.targets[index]


def make_model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(),
        nn.Linear(6 * 6 * 6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4),
    )


# Generous: a worker group takes tens of seconds to start on a small idle machine, several times that on a busy one.
WORKERS_START_WAIT_S = 300.0


def model_built_once_the_workers_started(run_dir: str) -> nn.Module:
    """make_model, built only once the run's worker group has registered its start (its
    attempts.json exists): a node profile that is still being made while the workers start,
    whatever the machine's speed. Profiling that came before the workers' start would wait
    here for nothing, and fail saying so."""
    deadline = time.monotonic() + WORKERS_START_WAIT_S
    while not os.path.exists(os.path.join(run_dir, run_files.ATTEMPTS_FILE)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no worker group started within {WORKERS_START_WAIT_S:g} s while the node was "
                               "profiled: profiling did not run beside the workers' start")
        time.sleep(0.1)
    return make_model()


def random_batch(batch_size: int):
    """A batch shaped like PatternDataset's, for ProfileModel(make_batch=...)."""
    return torch.randn(batch_size, 3, 8, 8), torch.randint(0, 4, (batch_size,))


def broken_batch(batch_size: int):
    raise ValueError(f"no batch of {batch_size} today")


def one_device(num_samples: int, global_batch_size: int, epochs: int, seed: int = 0, build=None) -> dict:
    """Weights (and BatchNorm statistics) after training ``build()`` (default: this file's
    model) on one device, global batch by global batch."""
    model, data = (build or make_model)(), PatternDataset(num_samples)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sampler = GlobalSampler(num_samples, global_batch_size, seed)
    for epoch in range(epochs):
        permutation = sampler.permutation(epoch)
        for step in range(sampler.steps_per_epoch):
            start, stop = sampler.window(step)
            indices = permutation[start:stop]
            loss = F.cross_entropy(model(data.inputs[indices]), data.targets[indices])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.state_dict()


def _checkpoint_rank0(model, optimizer, directory: str, **extra):
    if ray.train.get_context().get_world_rank() != 0:
        return None
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), **extra},
               os.path.join(directory, "user_state.pt"))
    return ray.train.Checkpoint.from_directory(directory)


def batchnorm_loop(config: dict) -> None:
    """The user loop of the issue: BatchNorm model, own Dataset, DataLoader worker processes,
    a report with a checkpoint every epoch (or every ``checkpoint_every`` steps), resume."""
    model = hetero_ray.train.prepare_model(make_model())
    loader = hetero_ray.train.prepare_data_loader(PatternDataset(config["num_samples"]),
                                                  num_workers=config.get("loader_workers", 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    restored_from = -1
    checkpoint = hetero_ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "user_state.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        restored_from = state["global_step"]
    for epoch in range(loader.epoch, config["epochs"]):
        for inputs, targets in loader:
            completed_step = loader.position.global_step  # the step of this batch
            loss = F.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            _maybe_crash(config, completed_step)
            every = config.get("checkpoint_every")
            if every and completed_step % every == 0 and completed_step > 0:
                with tempfile.TemporaryDirectory() as directory:
                    hetero_ray.train.report(
                        {"epoch": epoch, "loss": loss.item(), "restored_from": restored_from,
                         "process_group": _process_group()},
                        checkpoint=_checkpoint_rank0(model, optimizer, directory, global_step=completed_step))
        with tempfile.TemporaryDirectory() as directory:
            hetero_ray.train.report(
                {"epoch": epoch, "loss": loss.item(), "restored_from": restored_from,
                 "process_group": _process_group()},
                checkpoint=_checkpoint_rank0(model, optimizer, directory,
                                             global_step=loader.position.global_step - 1))


def _process_group() -> str:
    """The workers' process group as the run's TorchConfig set it up: its backend, and how
    the ranks met (Ray Train sets MASTER_ADDR for ``init_method="env"`` only)."""
    import torch.distributed as dist

    return f"{dist.get_backend()} via {'env' if 'MASTER_ADDR' in os.environ else 'tcp'}"


def _maybe_crash(config: dict, completed_step: int) -> None:
    """Rank 1 SIGKILLs itself once, at ``crash_at_step``, as soon as Ray Train has
    registered the checkpoint before it (so the restart must resume from that one)."""
    crash = config.get("crash")
    if not crash or completed_step != crash["at_step"] or ray.train.get_context().get_world_rank() != 1:
        return
    marker = os.path.join(crash["run_dir"], "crashed_once")
    if os.path.exists(marker):
        return
    wait_until_registered(crash["run_dir"], crash["after_checkpoint"])
    open(marker, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)


def wait_until_registered(run_dir: str, checkpoint_name: str, timeout_s: float = 60.0) -> None:
    """Until Ray Train has registered ``checkpoint_name`` as its latest. A loop that fails
    right after a report waits for this first: Ray Train registers a checkpoint once every
    rank's report of it is in, and a rank that fails before a slower one has reported
    leaves a restart with no checkpoint."""
    deadline = time.monotonic() + timeout_s
    while not (_latest_checkpoint_dir(run_dir) or "").endswith(checkpoint_name):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{checkpoint_name} was never registered")
        time.sleep(0.05)


def _latest_checkpoint_dir(run_dir: str):
    """Ray Train's latest checkpoint; None while its snapshot file is being rewritten (a
    torn read once made the crash helper itself fail, spending the run's one restart)."""
    from hetero_ray.runs.checkpoints import latest_checkpoint_dir

    try:
        return latest_checkpoint_dir(run_dir)
    except ValueError:  # json.JSONDecodeError: caught mid-write
        return None


class IndexedPatternDataset(PatternDataset):
    """PatternDataset whose samples also carry their index: the loop can say which samples
    it actually trained on, beside what the loader recorded."""

    def __getitem__(self, index: int):
        return self.inputs[index], self.targets[index], index


def trained_ids_loop(config: dict) -> None:
    """A user loop that writes what it trained: each rank the sample indices that went
    through a backward pass and an optimiser step (``trained_dir/rank<r>.json``), rank 0
    the final weights (``trained_dir/weights.pt``).

    ``loader_workers_by_rank``: each rank's own DataLoader ``num_workers`` (as one would
    choose per node on a mixed cluster); ``peek_ranks``: the ranks that look at one batch
    (``next(iter(loader))``) before training; ``break_before_step``: every rank leaves the
    loop once at that global step, before training it, and iterates again."""
    import json

    rank = ray.train.get_context().get_world_rank()
    model = hetero_ray.train.prepare_model(make_model())
    loader = hetero_ray.train.prepare_data_loader(IndexedPatternDataset(config["num_samples"]),
                                                  num_workers=config["loader_workers_by_rank"][rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    if rank in config.get("peek_ranks", ()):
        inputs, targets, _ = next(iter(loader))
        assert inputs.shape[1:] == (3, 8, 8)
    trained, left_at = [], None
    while loader.epoch < config["epochs"]:
        epoch = loader.epoch
        for inputs, targets, indices in loader:
            if loader.position.global_step == config.get("break_before_step") and left_at is None:
                left_at = epoch
                break  # before training: the next iteration hands this step out again
            loss = F.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if loader.local_batch_size > 0:  # else one placeholder sample, weight 0
                trained.append({"epoch": epoch, "indices": indices.tolist()})
        hetero_ray.train.report({"epoch": epoch})
    with open(os.path.join(config["trained_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(trained, f)
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(config["trained_dir"], "weights.pt"))


class GeneratedImages(torch.utils.data.Dataset):
    """A small stand-in for Fashion-MNIST (1×8×8 images, 10 classes), generated here."""

    def __init__(self, num_samples: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, 10, (num_samples,), generator=generator)
        prototypes = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(99))
        self.images = prototypes[self.targets] + torch.randn(num_samples, 1, 8, 8, generator=generator)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.images[index], self.targets[index]


class FashionNetwork(nn.Module):
    """The example's NeuralNetwork, smaller, with dropout off (its masks would differ between runs)."""

    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(nn.Linear(8 * 8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                                               nn.Linear(32, 10))

    def forward(self, inputs):
        return self.linear_relu_stack(self.flatten(inputs))


def _twins(config: dict):
    """Ray Train's calls, or their hetero_ray twins: the one thing a port changes."""
    from types import SimpleNamespace

    import ray.train.torch

    if config["api"] == "ray":
        return SimpleNamespace(prepare_data_loader=ray.train.torch.prepare_data_loader,
                               prepare_model=ray.train.torch.prepare_model, report=ray.train.report,
                               get_context=ray.train.get_context)
    return SimpleNamespace(prepare_data_loader=hetero_ray.train.prepare_data_loader,
                           prepare_model=hetero_ray.train.prepare_model, report=hetero_ray.train.report,
                           get_context=hetero_ray.train.get_context)


def fashion_mnist_loop(config: dict) -> None:
    """Ray Train's ``torch_fashion_mnist_example.py`` training function, as its docs write
    it (a DataLoader for training and one for testing, both through prepare_data_loader),
    on generated images; ``train`` is Ray Train or hetero_ray. Rank 0 also appends each
    epoch's test loss to ``losses_file``: plain Ray Train keeps no metrics reported without
    a checkpoint."""
    import json

    from torch.utils.data import DataLoader

    train = _twins(config)
    lr, epochs, batch_size = config["lr"], config["epochs"], config["batch_size_per_worker"]

    training_data, test_data = GeneratedImages(256, seed=1), GeneratedImages(64, seed=2)
    train_dataloader = DataLoader(training_data, batch_size=batch_size, shuffle=True)
    test_dataloader = DataLoader(test_data, batch_size=batch_size)
    train_dataloader = train.prepare_data_loader(train_dataloader)
    test_dataloader = train.prepare_data_loader(test_dataloader)

    torch.manual_seed(3)  # the same first weights in both runs
    model = train.prepare_model(FashionNetwork())
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    for epoch in range(epochs):
        if train.get_context().get_world_size() > 1:
            train_dataloader.sampler.set_epoch(epoch)
        model.train()
        for inputs, targets in train_dataloader:
            loss = loss_fn(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        test_loss, num_correct, num_total = 0, 0, 0
        with torch.no_grad():
            for inputs, targets in test_dataloader:
                pred = model(inputs)
                test_loss += loss_fn(pred, targets).item()
                num_total += targets.shape[0]
                num_correct += (pred.argmax(1) == targets).sum().item()
        test_loss /= len(test_dataloader)
        accuracy = num_correct / num_total

        train.report(metrics={"loss": test_loss, "accuracy": accuracy})
        if train.get_context().get_world_rank() == 0:
            with open(config["losses_file"], "a") as f:
                f.write(json.dumps({"epoch": epoch, "loss": test_loss, "num_total": num_total}) + "\n")
