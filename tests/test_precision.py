"""Mixed precision keeps the weighting and the one-device math (issue: GPU jobs train in bf16/fp16).

- end to end (real local Ray, the built-in job with --precision): bf16 on 3 uneven workers
  with a plan change follows one worker in fp32 within bf16's tolerance;
- on a real gloo group: under fp16 autocast with a GradScaler, the hook's gradient is
  exactly Σ_i (b_i / B)·g_i of the ranks' own fp16 gradients.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from hetero_ray.training.precision import PRECISIONS, Precision
from hetero_ray.training.weighting import WeightedAllReduceState, rank_weight, weighted_allreduce_hook
from tests.helpers import free_port

STEPS = 50
# bf16 keeps 8 bits of mantissa (relative rounding 2^-8 ≈ 0.4 %); a loss of ~1 that drifts
# through 50 steps of rounded forward passes stays within a few hundredths.
BF16_LOSS_TOLERANCE = 0.05


def _step_losses(run_dir: str) -> np.ndarray:
    """The loss of each global step over the whole global batch: Σ b_i·loss_i / B."""
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    steps = steps[steps["local_batch_size"] > 0]
    weighted = (steps["loss"] * steps["local_batch_size"]).groupby(steps["global_step"]).sum()
    return (weighted / steps.groupby("global_step")["local_batch_size"].sum()).sort_index().to_numpy()


@pytest.mark.ray
@pytest.mark.slow
def test_bf16_on_uneven_workers_follows_one_worker_in_fp32(ray_session, fast_config):
    """The --precision flag through the built-in job on Ray: bf16 on 3 uneven workers with a
    plan change against one worker in fp32. (That uneven ranks in bf16 are one device in bf16
    is the promise matrix's, without Ray: tests/test_promise_matrix.py.)"""
    from hetero_ray.builtin.driver import run_training

    common = dict(model="mlp", num_samples=960, batch_size=48, epochs=3, max_steps=STEPS, seed=5, lr=0.05)
    bf16 = run_training(fast_config(experiment_name="bf16", precision="bf16", num_workers=3, batch_split=[26, 14, 8],
                                    plan_changes=[{"global_step": 20, "local_batch_sizes": [8, 16, 24]}], **common))
    fp32_one = run_training(fast_config(experiment_name="fp32-one", num_workers=1, **common))

    bf16_loss, one_loss = _step_losses(bf16.run_dir), _step_losses(fp32_one.run_dir)
    assert len(bf16_loss) == len(one_loss) == STEPS
    assert one_loss[-1] < one_loss[0] - 0.1, "training did not lower the loss; the comparison would be empty"
    assert np.abs(bf16_loss - one_loss).max() < BF16_LOSS_TOLERANCE
    assert not np.array_equal(bf16_loss, one_loss), "bf16 computed exactly as fp32: autocast did not run"


LOCAL_BATCH_SIZES = [7, 3, 2]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(sum(LOCAL_BATCH_SIZES), 10, generator=generator), torch.randint(0, 4, (12,), generator=generator)


def _piece(rank: int):
    inputs, targets = _batch()
    start = sum(LOCAL_BATCH_SIZES[:rank])
    return inputs[start:start + LOCAL_BATCH_SIZES[rank]], targets[start:start + LOCAL_BATCH_SIZES[rank]]


def _own_fp16_gradient(rank: int) -> list[torch.Tensor]:
    """What rank ``rank`` computes alone (no DDP), in fp16 autocast: its g_i."""
    model, precision = _model(), Precision.named("fp16", torch.device("cpu"))
    inputs, targets = _piece(rank)
    with precision.autocast():
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        model = DistributedDataParallel(_model(), bucket_cap_mb=0.001)
        model.register_comm_hook(WeightedAllReduceState(weight=rank_weight(LOCAL_BATCH_SIZES[rank], 12)),
                                 weighted_allreduce_hook)
        precision = Precision.named("fp16", torch.device("cpu"))
        scaler = precision.make_scaler()
        inputs, targets = _piece(rank)
        with precision.autocast():
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        scaler.scale(loss).backward()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        scaler.unscale_(optimizer)  # what scaler.step does first
        torch.save({"grads": [p.grad for p in model.parameters()], "scale": scaler.get_scale()},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_fp16_with_a_grad_scaler_keeps_the_weighting_exact(tmp_path):
    port = free_port()
    mp.spawn(_worker, args=(3, port, str(tmp_path)), nprocs=3, join=True)
    expected = [sum(rank_weight(b, 12) * g for b, g in zip(LOCAL_BATCH_SIZES, grads))
                for grads in zip(*(_own_fp16_gradient(rank) for rank in range(3)))]
    for rank in range(3):
        saved = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert saved["scale"] > 1.0, "the scaler did not scale: the test would not exercise it"
        worst = max((g - e).abs().max().item() for g, e in zip(saved["grads"], expected))
        assert worst < 1e-6, f"rank {rank}: the unscaled, weighted gradient is off by {worst}"


def test_precision_names_are_the_configs():
    from hetero_ray.config import PRECISIONS as FLAG_CHOICES

    assert PRECISIONS == FLAG_CHOICES
    assert Precision.named("fp32", torch.device("cpu")).make_scaler() is None
    assert Precision.named("bf16", torch.device("cpu")).make_scaler() is None
