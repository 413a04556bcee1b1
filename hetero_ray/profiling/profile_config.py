"""``ProfileConfig``: what to profile, validated when it is made, so ``hetero-ray profile``
and a run's profiling reject the same values.

The fields with a flag (:func:`hetero_ray.flags.setting`) are ``hetero-ray profile``'s
settings: its parser is generated from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hetero_ray import validate
from hetero_ray.errors import ConfigError
from hetero_ray.flags import int_list, setting
from hetero_ray.profile_defaults import (
    DEFAULT_MICROBENCH_S, DEFAULT_PROBE_BATCH_SIZES, DEFAULT_PROFILE_TIMEOUT_S, DEFAULT_RAM_FRACTION,
)
from hetero_ray.profiling.recipe import ProfileModel


@dataclass(frozen=True)
class ProfileConfig:
    """What to profile (see the module docstring)."""

    # A ProfileModel to probe on every node (`hetero-ray profile --model` names a built-in
    # one, hetero_ray.builtin.config.ProbeChoice); None: inventory and micro-benchmarks only.
    model: Optional[ProfileModel] = None
    batch_sizes: tuple[int, ...] = setting(
        DEFAULT_PROBE_BATCH_SIZES, "probe batch sizes", type=int_list, metavar="B1,B2,...")
    cpus_per_worker: float = setting(  # what one training worker gets, so that is what is measured
        1.0, "CPUs one training worker gets; each profiler takes (and measures with) that many", type=float)
    ram_fraction: float = setting(  # CPU cap: share of available RAM for one batch
        DEFAULT_RAM_FRACTION, "CPU nodes: share of available RAM one worker's batch may use", type=float)
    timeout_s: float = setting(
        DEFAULT_PROFILE_TIMEOUT_S, "seconds for the whole cluster; nodes not done are reported as failed",
        type=float, metavar="SECONDS", aliases=("--timeout",))
    # No flag: set from Python only (tests shorten the micro-benchmarks).
    microbench_s: float = DEFAULT_MICROBENCH_S
    probe_cpu_on_gpu_nodes: bool = False  # GPU nodes train on their GPUs; skip the CPU probe

    def __post_init__(self):
        if self.model is not None and not isinstance(self.model, ProfileModel):
            raise ConfigError(f"ProfileConfig.model must be a hetero_ray.ProfileModel(build=..., make_batch=...) "
                              f"or None (a built-in model's: hetero_ray.builtin.recipe.builtin_recipe("
                              f"{self.model!r})), got {type(self.model).__name__}")
        sizes = validate.probe_sizes(validate.named("batch_sizes"), self.batch_sizes or ())
        object.__setattr__(self, "batch_sizes", tuple(sizes))
        validate.positive_number(validate.named("cpus_per_worker"), self.cpus_per_worker)
        validate.positive_number(validate.named("timeout_s"), self.timeout_s, unit="seconds")
        validate.positive_number("microbench_s", self.microbench_s, unit="seconds")
        validate.fraction(validate.named("ram_fraction"), self.ram_fraction, of="the available RAM")

    @property
    def num_threads(self) -> int:
        return max(1, int(round(self.cpus_per_worker)))

    @property
    def model_name(self) -> Optional[str]:
        return model_name(self.model)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def model_name(model) -> Optional[str]:
    """What nodes.json and the progress lines call ``model`` (a name or a ProfileModel)."""
    return getattr(model, "name", model)
