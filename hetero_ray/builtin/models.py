"""The models a run can train, and the loss and evaluation sums the training loop uses.

The loop does not care which kind of model it holds: image classifiers map
``(B, C, H, W)`` floats to ``(B, classes)`` logits with ``(B,)`` targets, the language
model maps ``(B, T)`` tokens to ``(B, T, vocab)`` logits with ``(B, T)`` targets, and
:func:`compute_loss` / :func:`eval_batch_stats` treat both alike.

Construction draws from the global RNG only, so ``torch.manual_seed(s)`` right before
:func:`build_model` gives the same weights on every rank.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hetero_ray.builtin.config import MODELS, TEXT_MODELS
from hetero_ray.builtin.data import DataSpec
from hetero_ray.errors import ConfigError

MODEL_NAMES = MODELS

# mlp: two hidden layers of 256 (≈0.85 M parameters on 3×32×32) — large enough to learn the
# synthetic images, small enough that gradient-equivalence tests run in milliseconds.
MLP_HIDDEN = 256

# simple_cnn: 32 and 64 channels, 3×3 kernels; ≈5 M multiply-adds per 32×32 sample, about
# a millisecond on one CPU core.
CNN_CHANNELS = (32, 64)

# gpt_tiny: 2 blocks of width 128 with 4 heads; ≈0.43 M parameters at vocab 256, seq 64.
GPT_LAYERS = 2
GPT_WIDTH = 128
GPT_HEADS = 4
GPT_INIT_STD = 0.02  # GPT-2's initialisation


def build_model(name: str, spec: DataSpec) -> nn.Module:
    """A freshly initialised model for data described by ``spec``.

    Raises:
        ConfigError: unknown name, or a model that does not fit the kind of data.
    """
    if name not in MODEL_NAMES:
        raise ConfigError(f"--model must be one of {', '.join(MODEL_NAMES)}; got {name!r}")
    wanted = "text" if name in TEXT_MODELS else "image"
    if spec.kind != wanted:
        raise ConfigError(f"--model {name} needs {wanted} data, but the dataset gives {spec.kind} data")
    if name == "mlp":
        return MLP(spec)
    if name == "simple_cnn":
        return SimpleCNN(spec)
    if name in ("resnet18", "resnet50"):
        return _cifar_resnet(name, spec)
    return GPTTiny(spec)


def compute_loss(model_output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the local batch.

    For the language model the mean is over all tokens; every sample has the same T, so
    this equals the mean over samples of per-sample means, which is what the gradient
    weighting ``w_i = b_i / B`` assumes.
    """
    logits, flat_targets = _flatten(model_output, targets)
    return F.cross_entropy(logits, flat_targets)


@torch.no_grad()
def eval_batch_stats(model_output: torch.Tensor, targets: torch.Tensor) -> dict:
    """Sums over the batch that ranks can all-reduce and divide at the end.

    Returns:
        ``loss_sum`` (float), ``correct`` (top-1 hits; next-token hits for the language
        model) and ``count`` (samples, or tokens for the language model).
    """
    logits, flat_targets = _flatten(model_output, targets)
    loss_sum = F.cross_entropy(logits.float(), flat_targets, reduction="sum")
    correct = (logits.argmax(dim=-1) == flat_targets).sum()
    return {"loss_sum": float(loss_sum), "correct": int(correct), "count": int(flat_targets.numel())}


def _flatten(model_output: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if model_output.shape[:-1] != targets.shape:
        raise ValueError(
            f"model output of shape {tuple(model_output.shape)} does not match targets of shape "
            f"{tuple(targets.shape)}: expected output = targets' shape + (classes,)"
        )
    return model_output.reshape(-1, model_output.shape[-1]), targets.reshape(-1)


class MLP(nn.Module):
    """flatten → Linear → ReLU → Linear → ReLU → Linear; no batch-norm, no dropout, so a
    sample's gradient does not depend on which other samples share its batch."""

    def __init__(self, spec: DataSpec):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(spec.input_shape), MLP_HIDDEN),
            nn.ReLU(),
            nn.Linear(MLP_HIDDEN, MLP_HIDDEN),
            nn.ReLU(),
            nn.Linear(MLP_HIDDEN, spec.num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SimpleCNN(nn.Module):
    """Two conv/ReLU/max-pool blocks and a linear head; no batch-norm, no dropout."""

    def __init__(self, spec: DataSpec):
        super().__init__()
        channels, height, width = spec.input_shape
        c1, c2 = CNN_CHANNELS
        self.features = nn.Sequential(
            nn.Conv2d(channels, c1, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(c2 * (height // 4) * (width // 4), spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def _cifar_resnet(name: str, spec: DataSpec) -> nn.Module:
    """torchvision's ResNet for 32×32 input: a 3×3 stride-1 stem and no max-pool, so the
    last stage still sees 4×4 feature maps instead of 1×1."""
    from torchvision import models

    model = getattr(models, name)(weights=None, num_classes=spec.num_classes)
    model.conv1 = nn.Conv2d(spec.input_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    # The same initialisation torchvision gives every other convolution of the network.
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    return model


class GPTTiny(nn.Module):
    """A small causal transformer language model (pre-LN, GPT-2 style, dropout 0)."""

    def __init__(self, spec: DataSpec):
        super().__init__()
        self.seq_len = spec.seq_len
        self.token_embedding = nn.Embedding(spec.vocab_size, GPT_WIDTH)
        self.position_embedding = nn.Embedding(spec.seq_len, GPT_WIDTH)
        self.blocks = nn.ModuleList(_Block(GPT_WIDTH, GPT_HEADS) for _ in range(GPT_LAYERS))
        self.final_norm = nn.LayerNorm(GPT_WIDTH)
        self.head = nn.Linear(GPT_WIDTH, spec.vocab_size, bias=False)  # untied: no shared parameters
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=GPT_INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, length = tokens.shape
        if length > self.seq_len:
            raise ValueError(f"gpt_tiny takes at most {self.seq_len} tokens per sample, got {length}")
        positions = torch.arange(length, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.final_norm(x))


class _Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attention_norm = nn.LayerNorm(width)
        self.attention = _CausalSelfAttention(width, heads)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class _CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        # (B, T, 3W) → three (B, heads, T, W/heads)
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, width))
