"""Synthetic datasets, generated from the seed alone: ``(inputs, targets)`` tensors per split.

They come out identical on every process and every machine: only integer draws and
uniform floats (exact on every CPU) feed plain element-wise arithmetic, never a
transcendental function whose last bit could differ between an x86 and an ARM node.
:func:`hetero_ray.builtin.data.load_dataset` wraps them as a dataset.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from hetero_ray.builtin.cifar import IMAGE_SHAPE

Samples = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), one row per sample

# synthetic_image: 10 classes of 3×32×32, like CIFAR-10, so every image model runs on it.
SYNTHETIC_IMAGE_CLASSES = 10
# Each class is a fixed low-resolution pattern (upsampled by pixel repetition) plus
# per-pixel noise. The pattern is much weaker than the noise (0.08 vs 1), so with the
# default batch of 64 simple_cnn climbs from 10 % to ~95 % eval accuracy over ~200 steps
# (and mlp to ~85 %) instead of reaching 100 % within a few steps (as it does at 0.25).
_PROTOTYPE_RESOLUTION = 8
_PROTOTYPE_SCALE = 0.08
_NOISE_SCALE = 1.0

# synthetic_text: a byte-sized vocabulary and a context nanoGPT-style models handle on CPU.
SYNTHETIC_TEXT_VOCAB = 256
SYNTHETIC_TEXT_SEQ_LEN = 64
# A sparse Markov chain: each token is followed by one of 4 fixed successors chosen with
# probabilities 10/20, 5/20, 3/20, 2/20, so the best possible next-token accuracy is 50 %
# and a model that learns the chain gets visibly close to it.
_SUCCESSOR_THRESHOLDS = (10, 15, 18, 20)  # cumulative weights out of 20


def image_samples(num_samples: int, eval_samples: int, seed: int) -> tuple[Samples, Samples]:
    """Training and eval images (float, ``IMAGE_SHAPE``) with their class labels (int64)."""
    c, h, w = IMAGE_SHAPE
    r = _PROTOTYPE_RESOLUTION
    low_res = _centered_uniform((SYNTHETIC_IMAGE_CLASSES, c, r, r), _generator(seed, 0))
    prototypes = low_res.repeat_interleave(h // r, dim=2).repeat_interleave(w // r, dim=3)
    prototypes = prototypes * _PROTOTYPE_SCALE

    def split(n: int, stream: int) -> Samples:
        generator = _generator(seed, stream)
        labels = torch.randint(0, SYNTHETIC_IMAGE_CLASSES, (n,), generator=generator)
        noise = _centered_uniform((n, c, h, w), generator) * _NOISE_SCALE
        return prototypes[labels] + noise, labels

    return split(num_samples, 1), split(eval_samples, 2)


def text_samples(num_samples: int, eval_samples: int, seed: int) -> tuple[Samples, Samples]:
    """Training and eval token sequences (int64, ``SYNTHETIC_TEXT_SEQ_LEN``) and their next tokens."""
    vocab, seq_len = SYNTHETIC_TEXT_VOCAB, SYNTHETIC_TEXT_SEQ_LEN
    successors = torch.randint(0, vocab, (vocab, len(_SUCCESSOR_THRESHOLDS)), generator=_generator(seed, 0))
    thresholds = torch.tensor(_SUCCESSOR_THRESHOLDS)

    def split(n: int, stream: int) -> Samples:
        generator = _generator(seed, stream)
        tokens = torch.empty((n, seq_len + 1), dtype=torch.long)
        tokens[:, 0] = torch.randint(0, vocab, (n,), generator=generator)
        draws = torch.randint(0, int(thresholds[-1]), (n, seq_len), generator=generator)
        slots = torch.bucketize(draws, thresholds, right=True)  # draw d → first slot with d < threshold
        for t in range(seq_len):
            tokens[:, t + 1] = successors[tokens[:, t], slots[:, t]]
        # A sample is T+1 tokens; input and target are views of the same storage.
        return tokens[:, :-1], tokens[:, 1:]

    return split(num_samples, 1), split(eval_samples, 2)


def _generator(seed: int, stream: int) -> torch.Generator:
    """An independent generator per (seed, purpose): eval data does not move when
    ``num_samples`` changes, and no global RNG state is read or touched."""
    state = np.random.SeedSequence([seed, stream]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _centered_uniform(shape: tuple, generator: torch.Generator) -> torch.Tensor:
    """Uniform noise with mean 0 and variance 1: (u − ½)·√12."""
    return (torch.rand(shape, generator=generator) - 0.5) * math.sqrt(12.0)
