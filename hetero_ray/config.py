"""The training configuration: one typed object built by the CLI, the job entrypoints and
the Python API alike, validated when it is made.

:class:`TrainConfig` checks everything that can be checked without touching the disk or
the cluster (``__post_init__``); :func:`hetero_ray.preflight.check` then checks files,
directories and the cluster before anything is written.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from typing import Optional

from hetero_ray.errors import ConfigError

MODELS = ("mlp", "simple_cnn", "resnet18", "resnet50", "gpt_tiny")
DATASETS = ("synthetic_image", "synthetic_text", "cifar10", "cifar100")
TEXT_MODELS = frozenset({"gpt_tiny"})
TEXT_DATASETS = frozenset({"synthetic_text"})
FILE_DATASETS = frozenset({"cifar10", "cifar100"})  # read from --data-dir
POLICIES = ("static", "proportional", "dynamic", "optimal")  # = balancing.policies.POLICY_NAMES
OPTIMIZERS = ("sgd", "adamw")
LR_SCHEDULES = ("cosine", "constant")
USE_GPU_CHOICES = ("auto", "yes", "no")
BACKENDS = ("auto", "nccl", "gloo")

_EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def default_experiment_name() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S")


@dataclass
class TrainConfig:
    """Everything a training run needs; defaults carry their reason."""

    # --- what to train
    model: str = "simple_cnn"  # small enough for a CPU demo, real convolutions
    dataset: str = "synthetic_image"  # needs no download
    data_dir: Optional[str] = None  # for cifar10/cifar100 (python-pickle batches)
    download: bool = False  # fetch CIFAR into --data-dir (needs internet)
    verify_checksums: bool = True  # CIFAR files must have the published md5; off only for copies you trust
    num_samples: int = 4096  # synthetic datasets: training samples
    eval_samples: int = 512  # synthetic datasets: held-out samples for evaluation

    # --- optimisation: depends on the global batch only, never on workers or speeds
    batch_size: int = 64  # global batch B
    epochs: int = 1
    max_steps: Optional[int] = None  # stop after this many global steps (≤ epochs' worth)
    lr: float = 0.05
    optimizer: str = "sgd"  # SGD with momentum 0.9
    lr_schedule: str = "cosine"  # cosine decay over the run's total steps
    drop_last: bool = False  # keep the last short window (cut by the same rule)
    seed: int = 0

    # --- the cluster
    address: Optional[str] = None  # None: RAY_ADDRESS or a local Ray
    num_workers: int = 2  # ranks; with min_workers, the most there may be
    min_workers: Optional[int] = None  # elastic: keep training with this many or more
    cpus_per_worker: float = 1.0
    use_gpu: str = "auto"  # auto: GPU workers when the cluster has GPUs
    backend: str = "auto"  # auto: nccl when every rank has a GPU, else gloo
    # Per-worker Ray label selectors, e.g. [{"gpu": "h100"}, {"cpu-only": "1"}]: which node
    # each rank may run on (one TorchTrainer gives every worker the same resources).
    worker_label_selectors: Optional[list[dict]] = None
    # Per-worker device kinds ["gpu", "gpu", "cpu"]: mixed GPU and CPU workers in one job
    # (placed on nodes labelled hetero-ray.io/device=gpu|cpu; gloo between them).
    worker_devices: Optional[list[str]] = None

    # --- the plan
    policy: str = "optimal"  # minimise the predicted step time with the fitted cost model
    batch_split: Optional[list[int]] = None  # explicit initial plan, e.g. [40, 24]
    rebalance_interval: int = 20  # steps between plan checks (rank 0 fetch + broadcast)
    rebalance_threshold: float = 0.05  # adopt only if the predicted step time drops > 5 %
    rebalance_cooldown: int = 0  # steps after a change before the next may be adopted
    emulate_speeds: Optional[list[float]] = None  # per-rank fraction of real speed
    # Scripted plan changes {"global_step", "local_batch_sizes"} (tests and demos).
    plan_changes: Optional[list[dict]] = None

    # --- profiling
    profile: bool = True  # profile every node (hardware + this model) before the first step
    profile_batch_sizes: Optional[list[int]] = None  # probe sizes; default around B/n
    profile_interval: int = 10  # in-training readings (GPU, CPU, RSS) every N steps; 0: off
    profile_timeout_s: float = 120.0  # for the whole cluster; slower nodes are reported failed

    # --- fault tolerance
    checkpoint_every: int = 100  # steps; also at every epoch end
    max_failures: int = 3  # worker-group restarts from the last checkpoint
    resume: bool = False  # continue the run of the same name in --output-dir

    # --- output
    experiment_name: str = field(default_factory=default_experiment_name)
    output_dir: str = "runs"
    record_sample_ids: bool = False  # write sample_ids.parquet (for exactly-once audits)

    def __post_init__(self):
        _choice("--model", self.model, MODELS)
        _choice("--dataset", self.dataset, DATASETS)
        _choice("--policy", self.policy, POLICIES)
        _choice("--optimizer", self.optimizer, OPTIMIZERS)
        _choice("--lr-schedule", self.lr_schedule, LR_SCHEDULES)
        _choice("--use-gpu", self.use_gpu, USE_GPU_CHOICES)
        _choice("--backend", self.backend, BACKENDS)
        is_text_model = self.model in TEXT_MODELS
        if is_text_model != (self.dataset in TEXT_DATASETS):
            kind = "a text dataset (synthetic_text)" if is_text_model else "an image dataset"
            raise ConfigError(f"--model {self.model} needs {kind}, got --dataset {self.dataset}")
        if self.dataset in FILE_DATASETS and not self.data_dir:
            raise ConfigError(
                f"--dataset {self.dataset} reads its files from --data-dir; pass the folder "
                f"that holds (or should receive, with --download) the {self.dataset} batches"
            )
        for name in ("num_samples", "eval_samples", "batch_size", "epochs", "num_workers",
                     "rebalance_interval", "checkpoint_every"):
            _positive_int(_flag(name), getattr(self, name))
        if self.max_steps is not None:
            _positive_int("--max-steps", self.max_steps)
        _non_negative_int("--max-failures", self.max_failures)
        _non_negative_int("--profile-interval", self.profile_interval)
        if not (isinstance(self.profile_timeout_s, (int, float)) and self.profile_timeout_s > 0):
            raise ConfigError(f"--profile-timeout must be a positive number of seconds, got {self.profile_timeout_s!r}")
        if self.profile_batch_sizes is not None:
            self.profile_batch_sizes = _int_list("--profile-batch-sizes", self.profile_batch_sizes)
            if not self.profile_batch_sizes or any(b < 1 for b in self.profile_batch_sizes):
                raise ConfigError(f"--profile-batch-sizes must be positive integers, got {self.profile_batch_sizes}")
        _non_negative_int("--seed", self.seed)
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < float("inf")):
            raise ConfigError(f"--lr must be a positive number, got {self.lr!r}")
        if isinstance(self.rebalance_threshold, bool) or not isinstance(self.rebalance_threshold, (int, float)) \
                or not 0 <= self.rebalance_threshold < 1:
            raise ConfigError(f"--rebalance-threshold must be in [0, 1) (a fraction of the step time), "
                              f"got {self.rebalance_threshold!r}")
        _non_negative_int("--rebalance-cooldown", self.rebalance_cooldown)
        if not (isinstance(self.cpus_per_worker, (int, float)) and self.cpus_per_worker > 0):
            raise ConfigError(f"--cpus-per-worker must be positive, got {self.cpus_per_worker!r}")
        if self.min_workers is not None:
            _positive_int("--num-workers (minimum)", self.min_workers)
            if self.min_workers > self.num_workers:
                raise ConfigError(f"--num-workers {self.min_workers}-{self.num_workers}: the minimum must not "
                                  "exceed the maximum")
        if self.batch_size < self.num_workers:
            raise ConfigError(
                f"--batch-size {self.batch_size} is smaller than --num-workers {self.num_workers}: "
                "every worker needs at least one sample per step; raise the global batch or use fewer workers"
            )
        if self.dataset not in FILE_DATASETS and self.num_samples < self.batch_size:
            raise ConfigError(
                f"--num-samples {self.num_samples} is smaller than --batch-size {self.batch_size}; "
                "one epoch would not fill one global batch"
            )
        if self.batch_split is not None:
            self.batch_split = _int_list("--batch-split", self.batch_split)
            _per_rank_length("--batch-split", self.batch_split, self.num_workers)
            if any(b < 1 for b in self.batch_split):
                raise ConfigError(f"--batch-split values must be ≥ 1, got {self.batch_split}")
            if sum(self.batch_split) != self.batch_size:
                raise ConfigError(
                    f"--batch-split {','.join(map(str, self.batch_split))} sums to "
                    f"{sum(self.batch_split)}, but --batch-size is {self.batch_size}"
                )
        if self.worker_label_selectors is not None:
            _per_rank_length("--worker-labels", self.worker_label_selectors, self.num_workers)
            for selector in self.worker_label_selectors:
                if not isinstance(selector, dict) or not all(
                        isinstance(k, str) and k and isinstance(v, str) for k, v in selector.items()):
                    raise ConfigError(f"--worker-labels: each worker's selector must map label names to "
                                      f"values (KEY=VALUE), got {selector!r}")
        if self.worker_devices is not None:
            _per_rank_length("--worker-devices", self.worker_devices, self.num_workers)
            if any(kind not in ("gpu", "cpu") for kind in self.worker_devices):
                raise ConfigError(f"--worker-devices values must be gpu or cpu, got {self.worker_devices}")
            if self.worker_label_selectors is not None:
                raise ConfigError("--worker-devices and --worker-labels both place workers; give one of them")
            if self.use_gpu == "no" and "gpu" in self.worker_devices:
                raise ConfigError("--worker-devices asks for GPU workers but --use-gpu is no")
        for change in self.plan_changes or ():
            sizes = _int_list("--plan-change", change.get("local_batch_sizes", []))
            _per_rank_length("--plan-change", sizes, self.num_workers)
            if any(b < 1 for b in sizes) or sum(sizes) != self.batch_size:
                raise ConfigError(
                    f"--plan-change at step {change.get('global_step')}: shares {sizes} must be ≥ 1 "
                    f"and sum to --batch-size {self.batch_size}"
                )
        if self.emulate_speeds is not None:
            self.emulate_speeds = [float(v) for v in self.emulate_speeds]
            _per_rank_length("--emulate-speeds", self.emulate_speeds, self.num_workers)
            if any(not 0 < v <= 1 for v in self.emulate_speeds):
                raise ConfigError(
                    f"--emulate-speeds values must be in (0, 1] (a fraction of the real speed), "
                    f"got {self.emulate_speeds}"
                )
        if not isinstance(self.experiment_name, str) or not _EXPERIMENT_NAME.match(self.experiment_name):
            raise ConfigError(
                f"--experiment-name {self.experiment_name!r} must be 1-100 characters of letters, "
                "digits, '.', '_' or '-', starting with a letter or digit"
            )
        if not self.output_dir:
            raise ConfigError("--output-dir must not be empty")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown configuration keys: {', '.join(unknown)}")
        return cls(**d)

    @property
    def elastic(self) -> bool:
        return self.min_workers is not None and self.min_workers < self.num_workers

    @property
    def mixed_devices(self) -> bool:
        return self.worker_devices is not None and len(set(self.worker_devices)) > 1

    def label_selectors(self) -> Optional[list[dict]]:
        """Per-worker placement: explicit selectors, or the device label for each worker."""
        if self.worker_devices is not None:
            from hetero_ray.constants import DEVICE_LABEL

            return [{DEVICE_LABEL: kind} for kind in self.worker_devices]
        return self.worker_label_selectors

    def policy_config(self) -> dict:
        """Keyword arguments of :class:`hetero_ray.balancing.policies.PolicyConfig`."""
        return {"rebalance_threshold": float(self.rebalance_threshold),
                "cooldown_steps": self.rebalance_cooldown}

    def probe_batch_sizes(self) -> list[int]:
        """Probe sizes around the mean local batch ``b = B/n``: b/4, b/2, b, 2b (distinct, ≥ 1)."""
        from hetero_ray.profiling.defaults import probe_batch_sizes_around

        if self.profile_batch_sizes:
            return sorted(set(self.profile_batch_sizes))
        return probe_batch_sizes_around(self.batch_size, self.num_workers)

    @property
    def is_text(self) -> bool:
        return self.model in TEXT_MODELS


# --- --resume: what a resumed run may change
#
# A resumed run must go on training the way it started. The optimiser's trajectory depends
# on the global batch only (its size, the samples in it, their order), never on the ranks,
# their speeds or the plan, so settings of those may change and take effect at the
# resume. Every other field changes the math, the data order or what each epoch is
# measured on, and must repeat the run's first value (hetero_ray.preflight refuses
# otherwise, naming each). A field added to TrainConfig is compared unless listed here.
RESUME_MAY_CHANGE = frozenset({
    # how long: training continues to the new end (a cosine schedule decays over the new total)
    "epochs", "max_steps",
    # where the ranks run: the math depends on the global batch only
    "address", "num_workers", "min_workers", "cpus_per_worker", "use_gpu", "backend",
    "worker_label_selectors", "worker_devices",
    # the plan: each rank's share of the same global batch
    "policy", "batch_split", "rebalance_interval", "rebalance_threshold", "rebalance_cooldown",
    "emulate_speeds", "plan_changes",
    # measuring, recording, fault tolerance
    "profile", "profile_batch_sizes", "profile_interval", "profile_timeout_s", "record_sample_ids",
    "checkpoint_every", "max_failures",
    # where the data files are read from and how they are checked (the same files)
    "data_dir", "download", "verify_checksums",
})
# Which run this is, not how it trains: the same by construction on a --resume.
RUN_IDENTITY = frozenset({"experiment_name", "output_dir", "resume"})


def resume_fixed_fields() -> tuple[str, ...]:
    """The fields a --resume must repeat: all but :data:`RESUME_MAY_CHANGE` and
    :data:`RUN_IDENTITY`, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(TrainConfig)
                 if f.name not in RESUME_MAY_CHANGE and f.name not in RUN_IDENTITY)


def changed_on_resume(recorded: dict, config: TrainConfig) -> list[str]:
    """``--flag was OLD, now NEW`` for every field of :func:`resume_fixed_fields` that
    differs between ``recorded`` (a run's config.json) and ``config``.

    A field ``recorded`` lacks (a run of an older version) is not compared.
    """
    missing = object()
    changes = []
    for name in resume_fixed_fields():
        before, now = recorded.get(name, missing), getattr(config, name)
        if before is not missing and before != now:
            changes.append(f"{_flag(name)} was {_flag_value(before)}, now {_flag_value(now)}")
    return changes


def _flag_value(value) -> str:
    """A value as it reads on the command line (on/off for switches)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _choice(flag: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{flag} must be one of {', '.join(choices)}; got {value!r}")


def _positive_int(flag: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{flag} must be a positive integer, got {value!r}")


def _non_negative_int(flag: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{flag} must be a non-negative integer, got {value!r}")


def _int_list(flag: str, values) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{flag} values must be integers, got {list(values)}")
        out.append(int(v))
    return out


def _per_rank_length(flag: str, values, num_workers: int) -> None:
    if len(values) != num_workers:
        raise ConfigError(
            f"{flag} has {len(values)} values but --num-workers is {num_workers}; give one value per rank"
        )
