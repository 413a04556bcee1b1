"""Models with BatchNorm, their data and one device's training on it: what the batch-norm and
left-out-rank tests hold their ranks to (tests/test_sync_batchnorm.py,
tests/test_leave_out_gloo.py). Identical in every process (seeded)."""

from __future__ import annotations

import torch
from torch import nn

LEARNING_RATE = 0.1
CONV_INPUT_SHAPE = (3, 5, 5)  # per sample
LINEAR_INPUT_SHAPE = (10,)
NUM_CLASSES = 3


def perturb_batchnorm(model: nn.Module) -> nn.Module:
    """γ ≠ 1, β ≠ 0 and running stats ≠ (0, 1), so a formula that drops one of them shows."""
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, nn.modules.batchnorm._BatchNorm):
                size = layer.num_features
                if layer.affine:
                    layer.weight.copy_(0.5 + torch.rand(size, generator=generator))
                    if layer.bias is not None:
                        layer.bias.copy_(0.1 * torch.randn(size, generator=generator))
                if layer.track_running_stats:
                    layer.running_mean.copy_(0.1 * torch.randn(size, generator=generator))
                    layer.running_var.copy_(0.5 + torch.rand(size, generator=generator))
    return model


def make_conv_model() -> nn.Module:
    torch.manual_seed(0)
    return perturb_batchnorm(nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, NUM_CLASSES)))


def make_linear_model() -> nn.Module:
    torch.manual_seed(0)
    return perturb_batchnorm(nn.Sequential(
        nn.Linear(10, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, NUM_CLASSES)))


MODELS = {"conv": (make_conv_model, CONV_INPUT_SHAPE), "linear": (make_linear_model, LINEAR_INPUT_SHAPE)}


def make_batches(input_shape: tuple, splits: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One global batch of sum(split) real samples per step."""
    generator = torch.Generator().manual_seed(1)
    batches = []
    for split in splits:
        global_batch_size = sum(split)
        inputs = 1.5 + 2.0 * torch.randn(global_batch_size, *input_shape, generator=generator)  # mean ≠ 0, std ≠ 1
        targets = torch.randint(0, NUM_CLASSES, (global_batch_size,), generator=generator)
        batches.append((inputs, targets))
    return batches


def statistics(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: buffer.detach().clone() for name, buffer in model.named_buffers()}


# --- one device: torch's own BatchNorm on the whole global batch ----------------------

def train_on_one_device(model_name: str, splits: list[list[int]], lr: float = 0.0) -> dict:
    make_model, input_shape = MODELS[model_name]
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    record = {"grads": [], "losses": []}
    for inputs, targets in make_batches(input_shape, splits):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        record["grads"].append([p.grad.clone() for p in model.parameters()])
        record["losses"].append(loss.detach())
        optimizer.step()
    record["params"] = [p.detach().clone() for p in model.parameters()]
    record["statistics"] = statistics(model)
    return record
