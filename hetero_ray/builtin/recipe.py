"""The built-in models as :class:`~hetero_ray.profiling.recipe.ProfileModel` recipes: what the
node profiler and the workers' warm-up probe for ``hetero-ray train`` and ``hetero-ray profile``."""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from hetero_ray.builtin.data import random_batch, spec_for
from hetero_ray.builtin.models import build_model, compute_loss
from hetero_ray.profiling.recipe import ProfileModel


def builtin_recipe(model: str, dataset: Optional[str] = None) -> ProfileModel:
    """A built-in model (``hetero-ray train --model``) as a recipe, on synthetic data of ``dataset``'s shapes."""
    spec = spec_for(model, dataset)
    return ProfileModel(build=functools.partial(build_model, model, spec),
                        make_batch=functools.partial(random_batch, spec), compute_loss=builtin_loss, name=model)


def builtin_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """The built-in models' loss (token-level for the language model)."""
    inputs, targets = batch
    return compute_loss(model(inputs), targets)
