"""``ProfileModel``: how the node profiler builds and runs a model — the user's, or a built-in one.

Profiling measures the model that will train: on every node, its forward, loss and
backward at a few batch sizes (the busy-time line ``t(b) = α + β·b``) and its largest batch.
A user of :class:`~hetero_ray.HeteroTrainer` hands the recipe over in
``HeteroConfig(profile_model=ProfileModel(...))``; the built-in CLI models are recipes too
(:func:`hetero_ray.builtin.recipe.builtin_recipe`), so there is one probe for both.

    ProfileModel(build=MyNet,                                    # () -> nn.Module
                 make_batch=lambda b: (torch.randn(b, 3, 32, 32), # batch size -> (inputs, targets)
                                       torch.randint(0, 10, (b,))))

The recipe is sent to a profiler actor on every node, so its functions must be picklable
by Ray (module-level functions, lambdas and ``functools.partial`` all are).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from hetero_ray.errors import ConfigError

if TYPE_CHECKING:  # torch loads where a model is built or stepped, not where a recipe is named
    import torch


def cross_entropy_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """The default step: ``cross_entropy(model(inputs), targets)`` for a batch ``(inputs, targets)``."""
    import torch.nn.functional as F

    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


@dataclass(frozen=True)
class ProfileModel:
    """A model the profiler can build and step on any node.

    Args:
        build: makes a fresh model (on the host; the profiler moves it to each device).
        make_batch: ``batch_size -> batch`` of that many random samples shaped like the
            training data (tensors in tuples, lists or dicts; the profiler moves them).
        compute_loss: ``(model, batch) -> scalar loss`` — what one training step computes
            before ``backward()``; default :func:`cross_entropy_loss`.
        name: how nodes.json and the progress lines call the model.
    """

    build: Callable[[], torch.nn.Module]
    make_batch: Callable[[int], Any]
    compute_loss: Callable[[torch.nn.Module, Any], torch.Tensor] = cross_entropy_loss
    name: str = "user model"

    def __post_init__(self):
        for field_name in ("build", "make_batch", "compute_loss"):
            if not callable(getattr(self, field_name)):
                raise ConfigError(f"ProfileModel({field_name}=...) must be a function, got "
                                  f"{type(getattr(self, field_name)).__name__}")
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"ProfileModel(name=...) must be a non-empty string, got {self.name!r}")

