"""The public API's cost, measured: figures and ratios, not a timed test.

1. **Overhead.** The same user loop (simple_cnn on in-memory synthetic images, the same
   global batch, equal shares) under plain Ray Train (``TorchTrainer`` +
   ``ray.train.torch.prepare_model`` + a ``DataLoader`` with a ``DistributedSampler``) and
   under ``HeteroTrainer`` (``policy="static"``). Rounds alternate, so the machine's drift
   hits both alike; each run's rate is its steady part (steps after ``--warmup``) timed by
   rank 0 inside the loop. Target: hetero ÷ plain ≥ 0.97.
2. **Loader workers.** One training worker; a dataset whose ``__getitem__`` costs about as
   much CPU as the model's step per sample. ``prepare_data_loader(num_workers=2)`` against
   ``num_workers=0``; the data time per step comes from the run's steps.parquet. Target ≥ 1.5×.

    python benchmarks/bench_api.py                 # both, 3 rounds
    python benchmarks/bench_api.py --only loader --rounds 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

GLOBAL_BATCH, STEPS, WARMUP = 128, 60, 10  # --steps raises STEPS for the overhead figure


class Images(torch.utils.data.Dataset):
    """Synthetic 3×32×32 images; ``work`` extra matmuls per sample make loading cost CPU."""

    def __init__(self, num_samples: int, work: int = 0):
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(num_samples, 3, 32, 32, generator=generator)
        self.targets = torch.randint(0, 10, (num_samples,), generator=generator)
        self.work = work

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        image = self.inputs[index]
        for _ in range(self.work):  # stands for decoding and augmentation
            image = (image.view(96, 32) @ torch.eye(32)).view(3, 32, 32)
        return image, self.targets[index]


def _model():
    from hetero_ray.builtin.data import DataSpec
    from hetero_ray.builtin.models import build_model

    torch.manual_seed(0)
    return build_model("simple_cnn", DataSpec("image", 10, (3, 32, 32)))


def _steady_rate(step_end_times: list[float], batch: int, warmup: int) -> float:
    times = step_end_times[warmup:]
    return (len(times) - 1) * batch / (times[-1] - times[0])


def plain_loop(config):
    import ray.train
    import ray.train.torch
    import torch.nn.functional as F

    from hetero_ray.training.rank.allocator import keep_freed_memory

    torch.set_num_threads(1)
    keep_freed_memory()  # hetero_ray's workers get this too: the ratio is then the machinery's cost alone
    context = ray.train.get_context()
    model = ray.train.torch.prepare_model(_model())
    dataset = Images(config["num_samples"], config["work"])
    sampler = torch.utils.data.DistributedSampler(dataset, seed=0)
    loader = ray.train.torch.prepare_data_loader(torch.utils.data.DataLoader(
        dataset, batch_size=GLOBAL_BATCH // context.get_world_size(), sampler=sampler,
        num_workers=config["loader_workers"]), add_dist_sampler=False)
    ends = _train(model, loader, config["steps"], F)
    _report(ray.train.report, ends, context.get_world_rank())


def hetero_loop(config):
    import torch.nn.functional as F

    import hetero_ray.train

    torch.set_num_threads(1)
    model = hetero_ray.train.prepare_model(_model())
    loader = hetero_ray.train.prepare_data_loader(Images(config["num_samples"], config["work"]),
                                                  num_workers=config["loader_workers"])
    ends = _train(model, loader, config["steps"], F)
    _report(hetero_ray.train.report, ends, hetero_ray.train.get_context().get_world_rank())


def _report(report, ends: list[float], rank: int) -> None:
    """Result.metrics holds only reports that carried a checkpoint (Ray Train's rule)."""
    import ray.train

    with tempfile.TemporaryDirectory() as directory:
        checkpoint = None
        if rank == 0:
            open(os.path.join(directory, "done"), "w").close()
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        report({"samples_per_s": _steady_rate(ends, GLOBAL_BATCH, WARMUP)}, checkpoint=checkpoint)


def _train(model, loader, steps: int, F) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ends: list[float] = []
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ends.append(time.perf_counter())
        if len(ends) == steps:
            break
    return ends


def _fit(kind: str, storage: str, name: str, num_workers: int, config: dict):
    from ray.train import RunConfig, ScalingConfig

    scaling = ScalingConfig(num_workers=num_workers)
    if kind == "plain":
        from ray.train.torch import TorchTrainer

        trainer = TorchTrainer(plain_loop, train_loop_config=config, scaling_config=scaling,
                               run_config=RunConfig(name=name, storage_path=storage))
    else:
        from hetero_ray import HeteroConfig, HeteroTrainer

        trainer = HeteroTrainer(hetero_loop, train_loop_config=config, scaling_config=scaling,
                                run_config=RunConfig(name=name, storage_path=storage),
                                hetero_config=HeteroConfig(global_batch_size=GLOBAL_BATCH, policy="static"),
                                emit=lambda line: None)
    return trainer.fit()


def overhead(storage: str, rounds: int, num_workers: int, steps: int) -> None:
    config = {"num_samples": GLOBAL_BATCH * steps, "work": 0, "loader_workers": 0, "steps": steps}
    rates: dict[str, list[float]] = {"plain": [], "hetero": []}
    for round_ in range(rounds):
        # Each round runs both; who goes first alternates, so a drift of the machine's
        # speed over the benchmark favours neither.
        for kind in (("plain", "hetero") if round_ % 2 == 0 else ("hetero", "plain")):
            result = _fit(kind, storage, f"overhead-{kind}-{round_}", num_workers, config)
            rates[kind].append(result.metrics["samples_per_s"])
            print(f"round {round_}: {kind:6s} {rates[kind][-1]:8.1f} samples/s", flush=True)
    ratios = [h / p for h, p in zip(rates["hetero"], rates["plain"])]
    print(f"overhead: {num_workers} equal workers, batch {GLOBAL_BATCH}, steady part of {steps} steps")
    print(f"  plain Ray Train  median {statistics.median(rates['plain']):8.1f} samples/s")
    print(f"  HeteroTrainer    median {statistics.median(rates['hetero']):8.1f} samples/s")
    print(f"  hetero ÷ plain per round {', '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f} (target ≥ 0.97)")


def loader_workers(storage: str, rounds: int, work: int) -> None:
    import pandas as pd

    rates: dict[int, list[float]] = {0: [], 2: []}
    data_ms: dict[int, list[float]] = {0: [], 2: []}
    for round_ in range(rounds):
        for workers in (0, 2):
            name = f"loader-{workers}-{round_}"
            config = {"num_samples": GLOBAL_BATCH * STEPS, "work": work, "loader_workers": workers, "steps": STEPS}
            result = _fit("hetero", storage, name, 1, config)
            rates[workers].append(result.metrics["samples_per_s"])
            steps = pd.read_parquet(os.path.join(storage, name, "steps.parquet"))
            data_ms[workers].append(1000 * steps[steps["global_step"] >= WARMUP]["data_time_s"].median())
            print(f"round {round_}: num_workers={workers} {rates[workers][-1]:8.1f} samples/s, "
                  f"data time {data_ms[workers][-1]:.1f} ms/step", flush=True)
    ratios = [a / b for a, b in zip(rates[2], rates[0])]
    print(f"loader workers: 1 training worker, __getitem__ with {work} matmuls per sample")
    for workers in (0, 2):
        print(f"  num_workers={workers}  median {statistics.median(rates[workers]):8.1f} samples/s, "
              f"data time {statistics.median(data_ms[workers]):6.1f} ms/step (steps.parquet)")
    print(f"  2 ÷ 0 per round {', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f} "
          "(target ≥ 1.5)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("overhead", "loader"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=2, help="training workers for the overhead figure")
    parser.add_argument("--steps", type=int, default=200, help="steps per overhead run (the first 10 are warm-up)")
    parser.add_argument("--work", type=int, default=50, help="matmuls per sample in __getitem__: 50 cost about what simple_cnn's step costs per sample here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.num_workers < 1 or args.work < 0 or args.steps <= WARMUP:
        parser.error(f"--rounds and --num-workers must be ≥ 1, --work ≥ 0, --steps > {WARMUP}")
    import ray

    from hetero_ray.runtime.cluster import QUIET_ENV

    os.environ.update(QUIET_ENV)
    ray.init(num_cpus=max(4, args.num_workers + 2), logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}})
    with tempfile.TemporaryDirectory(prefix="bench_api_") as storage:
        if args.only in (None, "overhead"):
            overhead(storage, args.rounds, args.num_workers, args.steps)
        if args.only in (None, "loader"):
            loader_workers(storage, args.rounds, args.work)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
