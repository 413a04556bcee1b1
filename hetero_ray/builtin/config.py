"""``hetero-ray train``'s configuration: the built-in job's menus (its models, datasets,
optimisers), the parts only it has (what to train, how to optimise), and
:class:`TrainConfig`, which joins them to the parts it shares with the library
(:mod:`hetero_ray.config`) into one typed object built by the CLI, the job entrypoints and a
run's config.json alike, validated when it is made. What a ``--resume`` may change is
decided here too.

:func:`hetero_ray.builtin.preflight.check` then checks files, directories and the cluster
before anything is written.
"""

from __future__ import annotations

import dataclasses
import operator
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from hetero_ray import validate
from hetero_ray.config import (
    BatchConfig, ClusterConfig, EmulationConfig, FaultToleranceConfig, OutputConfig, PlanConfig, ProfilingConfig,
    check_ranks, check_shares, one_of,
)
from hetero_ray.errors import ConfigError
from hetero_ray.flags import flag_name, setting
from hetero_ray.profile_defaults import probe_batch_sizes_around
from hetero_ray.validate import named

MODELS = ("mlp", "simple_cnn", "resnet18", "resnet50", "gpt_tiny")
DATASETS = ("synthetic_image", "synthetic_text", "cifar10", "cifar100")
TEXT_MODELS = frozenset({"gpt_tiny"})
TEXT_DATASETS = frozenset({"synthetic_text"})
FILE_DATASETS = frozenset({"cifar10", "cifar100"})  # read from --data-dir
OPTIMIZERS = ("sgd", "adamw")
PRECISIONS = ("fp32", "bf16", "fp16")  # = training.gradients.precision.PRECISIONS
LR_SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class DataConfig:
    """What to train, on which data."""

    model: str = setting("simple_cnn", one_of(MODELS))  # small enough for a CPU demo, real convolutions
    dataset: str = setting("synthetic_image", one_of(DATASETS))  # needs no download
    data_dir: Optional[str] = setting(None, "folder with the CIFAR python-pickle batches (cifar10/cifar100)")
    download: bool = setting(False, "download CIFAR into --data-dir (needs internet)")
    # CIFAR files must have the published md5; off only for copies you trust.
    verify_checksums: bool = setting(
        True, "accept CIFAR files whose md5 is not the published one (a copy or subset you made and trust); "
              "they are still unpickled with only the format's types allowed")
    num_samples: int = setting(4096, "synthetic datasets: training samples", type=int)
    eval_samples: int = setting(512, "synthetic datasets: held-out samples", type=int)

    def __post_init__(self):
        validate.choice(named("model"), self.model, MODELS)
        validate.choice(named("dataset"), self.dataset, DATASETS)
        if self.is_text != (self.dataset in TEXT_DATASETS):
            kind = "a text dataset (synthetic_text)" if self.is_text else "an image dataset"
            raise ConfigError(f"{named('model')} {self.model} needs {kind}, got {named('dataset')} {self.dataset}")
        if self.dataset in FILE_DATASETS and not self.data_dir:
            raise ConfigError(
                f"{named('dataset')} {self.dataset} reads its files from {named('data_dir')}; pass the folder "
                f"that holds (or should receive, with {named('download')}) the {self.dataset} batches"
            )
        validate.positive_int(named("num_samples"), self.num_samples)
        validate.positive_int(named("eval_samples"), self.eval_samples)

    @property
    def is_text(self) -> bool:
        return self.model in TEXT_MODELS



@dataclass(frozen=True)
class OptimizationConfig:
    """How the built-in job optimises: like the batch, never depends on the workers or their speeds."""

    epochs: int = setting(1, "passes over the training samples", type=int)
    max_steps: Optional[int] = setting(None, "stop after this many global steps", type=int)  # ≤ epochs' worth
    lr: float = setting(0.05, "learning rate", type=float)
    optimizer: str = setting("sgd", one_of(OPTIMIZERS))  # SGD with momentum 0.9
    lr_schedule: str = setting("cosine", one_of(LR_SCHEDULES))  # cosine decay over the run's total steps
    drop_last: bool = setting(False, "drop each epoch's last short window")  # default: cut it by the same rule
    # fp32 unless asked: bf16/fp16 autocast changes the numbers a run produces.
    precision: str = setting("fp32", "the forward pass in fp32, bf16 or fp16 (autocast; fp16 with a gradient scaler)")

    def __post_init__(self):
        validate.positive_int(named("epochs"), self.epochs)
        if self.max_steps is not None:
            validate.positive_int(named("max_steps"), self.max_steps)
        validate.positive_number(named("lr"), self.lr)
        validate.choice(named("optimizer"), self.optimizer, OPTIMIZERS)
        validate.choice(named("lr_schedule"), self.lr_schedule, LR_SCHEDULES)
        validate.choice(named("precision"), self.precision, PRECISIONS)


@dataclass(frozen=True)
class ProbeChoice:
    """``hetero-ray profile --model M [--dataset D]``: a built-in model to probe on every
    node, its recipe made by :func:`hetero_ray.builtin.recipe.builtin_recipe`."""

    model: Optional[str] = setting(None, f"also probe this model: {one_of(MODELS)}")
    dataset: Optional[str] = setting(  # shapes of its samples
        None, f"sample shapes for --model: {one_of(DATASETS)} (default: the model's synthetic data)")

    def __post_init__(self):
        if self.model is not None:
            validate.choice(named("model"), self.model, MODELS)
        if self.dataset is not None:
            validate.choice(named("dataset"), self.dataset, DATASETS)
            if self.model is None:
                raise ConfigError(f"{named('dataset')} only shapes the {named('model')} probe; "
                                  f"pass {named('model')} too")


TITLE = "hetero_ray.title"  # a part's heading in --help


def _part(title: str) -> Any:
    return field(metadata={TITLE: title})


@dataclass(frozen=True, init=False)
class TrainConfig:
    """Everything a training run needs, in parts that check themselves.

    Built from settings by name, as the CLI's flags, the job entrypoints and config.json
    name them — ``TrainConfig(model="mlp", global_batch_size=64, num_workers=2)`` — each going
    to the part that declares it; read the same way (``config.global_batch_size``) or by part
    (``config.cluster.elastic``).

    Raises:
        ConfigError: a value, or a combination of values, no run can have (naming the flag).
        TypeError: a setting no part declares.
    """

    data: DataConfig = _part("what to train")
    batch: BatchConfig = _part("the global batch (what the optimiser's trajectory depends on, never the workers)")
    optimization: OptimizationConfig = _part("optimisation")
    cluster: ClusterConfig = _part("cluster")
    plan: PlanConfig = _part("the plan (each rank's share of the global batch)")
    emulation: EmulationConfig = _part("emulation (heterogeneity on one machine)")
    profiling: ProfilingConfig = _part("profiling")
    fault_tolerance: FaultToleranceConfig = _part("fault tolerance")
    output: OutputConfig = _part("output")

    def __init__(self, **settings: Any):
        unknown = sorted(set(settings) - set(_PART_OF))
        if unknown:
            raise TypeError(f"TrainConfig() got unknown settings: {', '.join(unknown)}")
        for name, part in parts().items():
            object.__setattr__(self, name, part(**{k: v for k, v in settings.items() if _PART_OF[k] == name}))
        self._check_across_parts()

    def _check_across_parts(self) -> None:
        """The rules that join parts (each part has checked its own fields)."""
        check_ranks(self.plan, self.emulation, self.global_batch_size, self.num_workers)
        if self.dataset not in FILE_DATASETS and self.num_samples < self.global_batch_size:
            raise ConfigError(
                f"{named('num_samples')} {self.num_samples} is smaller than {named('global_batch_size')} "
                f"{self.global_batch_size}; one epoch would not fill one global batch"
            )
        check_shares(self.plan, self.global_batch_size)

    @classmethod
    def from_dict(cls, settings: dict) -> "TrainConfig":
        """From :meth:`to_dict`'s shape (a run's config.json, of this version or an older one)."""
        settings = renamed_settings(settings)
        unknown = sorted(set(settings) - set(_PART_OF))
        if unknown:
            raise ConfigError(f"unknown configuration keys: {', '.join(unknown)}")
        return cls(**settings)

    def to_dict(self) -> dict:
        """Every setting by name (config.json): flat, as the flags and the dashboard name them."""
        return {name: value for part in parts() for name, value in dataclasses.asdict(getattr(self, part)).items()}

    def replace(self, **settings: Any) -> "TrainConfig":
        """A copy with these settings changed, checked as a new configuration."""
        return TrainConfig(**{**self.to_dict(), **settings})

    def probe_batch_sizes(self) -> list[int]:
        """The profile's sizes, else sizes around the mean local batch ``b = B/n``: b/4, b/2, b, 2b."""
        if self.profile_batch_sizes:
            return list(self.profile_batch_sizes)
        return probe_batch_sizes_around(self.global_batch_size, self.num_workers)


# config.json keys of older versions, whose settings were renamed to their flags' names.
_OLD_KEYS = {"batch_size": "global_batch_size", "experiment_name": "name", "output_dir": "storage_path",
             "worker_label_selectors": "worker_labels"}


def renamed_settings(settings: dict) -> dict:
    """A config.json's settings under this version's names (an older run's keys renamed)."""
    return {_OLD_KEYS.get(key, key): value for key, value in settings.items()}


def parts() -> dict[str, type]:
    """TrainConfig's parts by name, in order: ``{"data": DataConfig, …}``."""
    return dict(_PARTS)


def setting_names() -> tuple[str, ...]:
    """Every setting of :class:`TrainConfig` (the keys of config.json), in declaration order."""
    return tuple(_PART_OF)


def part_title(name: str) -> str:
    """A part's heading (``--help`` groups its flags under it)."""
    return next(f.metadata[TITLE] for f in dataclasses.fields(TrainConfig) if f.name == name)


_PARTS: dict[str, type] = typing.get_type_hints(TrainConfig)
_PART_OF: dict[str, str] = {f.name: part for part, cls in _PARTS.items() for f in dataclasses.fields(cls)}
for _name, _part_name in _PART_OF.items():  # config.seed reads config.batch.seed
    setattr(TrainConfig, _name, property(operator.attrgetter(f"{_part_name}.{_name}")))


# --- --resume: what a resumed run may change
#
# A resumed run must go on training the way it started. The optimiser's trajectory depends
# on the global batch only (its size, the samples in it, their order), never on the ranks,
# their speeds or the plan, so settings of those may change and take effect at the
# resume. Every other setting changes the math, the data order or what each epoch is
# measured on, and must repeat the run's first value (hetero_ray.builtin.preflight refuses
# otherwise, naming each). A setting added to TrainConfig is compared unless listed here.
RESUME_MAY_CHANGE = frozenset({
    # how long: training continues to the new end (a cosine schedule decays over the new total)
    "epochs", "max_steps",
    # where the ranks run: the math depends on the global batch only
    "address", "num_workers", "min_workers", "cpus_per_worker", "use_gpu", "backend",
    "worker_labels", "worker_devices",
    # the plan: each rank's share of the same global batch
    "policy", "policy_module", "batch_split", "rebalance_interval", "rebalance_threshold", "rebalance_cooldown",
    "plan_changes",
    "emulate_speeds", "emulate_speed_changes", "emulate_devices", "emulate_devices_factor",
    # how each step computes: the gradient scaler's state travels in the checkpoint
    "precision",
    # measuring, recording, fault tolerance
    "profile", "profile_batch_sizes", "profile_interval", "profile_timeout_s", "record_sample_ids",
    "checkpoint_every", "max_failures", "allow_non_finite_loss",  # a run a NaN stopped may go on past it
    # where the data files are read from and how they are checked (the same files)
    "data_dir", "download", "verify_checksums",
})
# Which run this is, not how it trains: the same by construction on a --resume.
RUN_IDENTITY = frozenset({"name", "storage_path", "resume"})


def resume_fixed_fields() -> tuple[str, ...]:
    """The settings a --resume must repeat: all but :data:`RESUME_MAY_CHANGE` and
    :data:`RUN_IDENTITY`, in declaration order."""
    return tuple(name for name in setting_names() if name not in RESUME_MAY_CHANGE and name not in RUN_IDENTITY)


def changed_on_resume(recorded: dict, config: TrainConfig) -> list[str]:
    """``--flag was OLD, now NEW`` for every setting of :func:`resume_fixed_fields` that
    differs between ``recorded`` (a run's config.json) and ``config``.

    A setting ``recorded`` lacks (a run of an older version) is not compared.
    """
    missing = object()
    changes = []
    recorded = renamed_settings(recorded)
    for name in resume_fixed_fields():
        before, now = recorded.get(name, missing), getattr(config, name)
        if before is not missing and before != now:
            changes.append(f"{setting_flag(name)} was {_flag_value(before)}, now {_flag_value(now)}")
    return changes


def setting_flag(name: str) -> str:
    """The flag that sets ``name`` (``profile_timeout_s`` → ``--profile-timeout-s``)."""
    fields = dataclasses.fields(parts()[_PART_OF[name]])
    return flag_name(next(f for f in fields if f.name == name))


def _flag_value(value) -> str:
    """A value as it reads on the command line (on/off for switches)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)
