"""The training configuration: one typed object built by the CLI, the job entrypoints and
the Python API alike, validated when it is made.

:class:`TrainConfig` is made of small parts (what to train, optimisation, cluster, plan,
emulation, profiling, fault tolerance, output), each a frozen dataclass that checks its
own fields when it is built; :class:`TrainConfig` then checks the rules that join parts
(the global batch against the workers, one share per rank, …). The checks are
:mod:`hetero_ray.validate`'s, shared with :class:`~hetero_ray.hetero_config.HeteroConfig`
and the profiler's :class:`~hetero_ray.profiling.profile_config.ProfileConfig`. Every field
also declares its flag (:func:`hetero_ray.flags.setting`): ``hetero-ray train``'s
parser is built from these parts.

:func:`hetero_ray.builtin.preflight.check` then checks files, directories and the cluster before
anything is written.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import time
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from hetero_ray import validate
from hetero_ray.errors import ConfigError
from hetero_ray.validate import named
from hetero_ray.flags import (
    float_list, flag_name, int_list, label_selectors, plan_change, setting, speed_change, str_list,
    worker_range,
)
from hetero_ray.planning.decision import PolicyConfig
from hetero_ray.planning.policies import DEFAULT_POLICY, policy_names
from hetero_ray.profile_defaults import DEFAULT_PROFILE_TIMEOUT_S, probe_batch_sizes_around

MODELS = ("mlp", "simple_cnn", "resnet18", "resnet50", "gpt_tiny")
DATASETS = ("synthetic_image", "synthetic_text", "cifar10", "cifar100")
TEXT_MODELS = frozenset({"gpt_tiny"})
TEXT_DATASETS = frozenset({"synthetic_text"})
FILE_DATASETS = frozenset({"cifar10", "cifar100"})  # read from --data-dir
OPTIMIZERS = ("sgd", "adamw")
PRECISIONS = ("fp32", "bf16", "fp16")  # = training.precision.PRECISIONS
LR_SCHEDULES = ("cosine", "constant")
USE_GPU_CHOICES = ("auto", "yes", "no")
BACKENDS = ("auto", "nccl", "gloo")

_EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def default_experiment_name() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S")


def _one_of(choices) -> str:
    return f"one of {', '.join(choices)}"


def _store(part, **values) -> None:
    """Keeps the checked form of values (a list for any sequence) on a frozen part."""
    for name, value in values.items():
        object.__setattr__(part, name, value)


@dataclass(frozen=True)
class DataConfig:
    """What to train, on which data."""

    model: str = setting("simple_cnn", _one_of(MODELS))  # small enough for a CPU demo, real convolutions
    dataset: str = setting("synthetic_image", _one_of(DATASETS))  # needs no download
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
    """Depends on the global batch only, never on the workers or their speeds."""

    global_batch_size: int = setting(64, "global batch size B: the samples of one optimiser step across all workers",
                                     type=int, aliases=("--batch-size",))
    epochs: int = setting(1, "passes over the training samples", type=int)
    max_steps: Optional[int] = setting(None, "stop after this many global steps", type=int)  # ≤ epochs' worth
    lr: float = setting(0.05, "learning rate", type=float)
    optimizer: str = setting("sgd", _one_of(OPTIMIZERS))  # SGD with momentum 0.9
    lr_schedule: str = setting("cosine", _one_of(LR_SCHEDULES))  # cosine decay over the run's total steps
    drop_last: bool = setting(False, "drop each epoch's last short window")  # default: cut it by the same rule
    # fp32 unless asked: bf16/fp16 autocast changes the numbers a run produces.
    precision: str = setting("fp32", "the forward pass in fp32, bf16 or fp16 (autocast; fp16 with a gradient scaler)")
    seed: int = setting(0, "the data order (one seeded permutation per epoch) and the initial weights", type=int)

    def __post_init__(self):
        validate.positive_int(named("global_batch_size"), self.global_batch_size)
        validate.positive_int(named("epochs"), self.epochs)
        if self.max_steps is not None:
            validate.positive_int(named("max_steps"), self.max_steps)
        validate.positive_number(named("lr"), self.lr)
        validate.choice(named("optimizer"), self.optimizer, OPTIMIZERS)
        validate.choice(named("lr_schedule"), self.lr_schedule, LR_SCHEDULES)
        validate.choice(named("precision"), self.precision, PRECISIONS)
        validate.non_negative_int(named("seed"), self.seed)


@dataclass(frozen=True)
class ClusterConfig:
    """Where the ranks run, and how many there may be."""

    address: Optional[str] = setting(
        None, "Ray cluster to join (HOST:PORT, auto, ray://…); default RAY_ADDRESS or a local Ray")
    num_workers: int = setting(
        2, "training workers (ranks); MIN-MAX trains elastically: nodes may leave and join",
        type=worker_range, metavar="N|MIN-MAX", sets=("min_workers", "num_workers"))
    min_workers: Optional[int] = None  # elastic: keep training with this many or more (--num-workers MIN-MAX)
    cpus_per_worker: float = setting(1.0, "CPUs each worker gets", type=float)
    use_gpu: str = setting("auto", _one_of(USE_GPU_CHOICES))  # auto: GPU workers when the cluster has GPUs
    backend: str = setting("auto", f"{_one_of(BACKENDS)}; auto: nccl when all ranks have GPUs, else gloo")
    # Per-worker Ray label selectors, e.g. [{"gpu": "h100"}, {"cpu-only": "1"}]: which node
    # each rank may run on (one TorchTrainer gives every worker the same resources).
    worker_labels: Optional[list[dict]] = setting(
        None, "per-worker node label selectors, ';' between workers (e.g. gpu=h100;gpu=h100;cpu-only=1)",
        type=label_selectors, metavar="K=V[,K=V];…")
    # Per-worker device kinds ["gpu", "gpu", "cpu"]: mixed GPU and CPU workers in one job
    # (placed on nodes labelled hetero-ray.io/device=gpu|cpu; gloo between them).
    worker_devices: Optional[list[str]] = setting(
        None, "device kind per worker, e.g. gpu,gpu,cpu: mixed GPU and CPU workers in one job, on nodes "
              "labelled hetero-ray.io/device (see cluster_configs/)", type=str_list, metavar="gpu|cpu,…")

    def __post_init__(self):
        validate.positive_int(named("num_workers"), self.num_workers)
        if self.min_workers is not None:
            validate.positive_int(f"{named('num_workers')} (minimum)", self.min_workers)
            if self.min_workers > self.num_workers:
                raise ConfigError(f"{named('num_workers')} {self.min_workers}-{self.num_workers}: the minimum must not "
                                  "exceed the maximum")
        validate.positive_number(named("cpus_per_worker"), self.cpus_per_worker)
        validate.choice(named("use_gpu"), self.use_gpu, USE_GPU_CHOICES)
        validate.choice(named("backend"), self.backend, BACKENDS)
        if self.worker_labels is not None:
            selectors = validate.sequence(named("worker_labels"), self.worker_labels)
            validate.per_rank(named("worker_labels"), selectors, self.num_workers)
            for selector in selectors:
                if not isinstance(selector, dict) or not all(
                        isinstance(k, str) and k and isinstance(v, str) for k, v in selector.items()):
                    raise ConfigError(f"{named('worker_labels')}: each worker's selector must map label names to "
                                      f"values (KEY=VALUE), got {selector!r}")
            _store(self, worker_labels=selectors)
        if self.worker_devices is not None:
            devices = validate.device_kinds(named("worker_devices"), self.worker_devices)
            validate.per_rank(named("worker_devices"), devices, self.num_workers)
            if self.worker_labels is not None:
                raise ConfigError(f"{named('worker_devices')} and {named('worker_labels')} both place workers; give one of them")
            if self.use_gpu == "no" and "gpu" in devices:
                raise ConfigError(f"{named('worker_devices')} asks for GPU workers but {named('use_gpu')} is no")
            _store(self, worker_devices=devices)

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
        return self.worker_labels


@dataclass(frozen=True)
class PlanConfig:
    """How the global batch is shared out, and when the shares may change."""

    # optimal: minimise the predicted step time with the fitted cost model.
    policy: str = setting(DEFAULT_POLICY, _one_of(policy_names()))  # the built-in ones; any registered one passes
    batch_split: Optional[list[int]] = setting(
        None, "explicit initial shares, e.g. 40,24 (sum = --global-batch-size)", type=int_list)
    # Often enough to follow a device, rare enough to measure (rank 0 fetches + broadcasts).
    rebalance_interval: int = setting(20, "steps between plan checks", type=int)
    rebalance_threshold: float = setting(  # adopt only if the predicted step time drops > 5 %
        0.05, "adopt a new plan only if it predicts a step this much faster", type=float)
    rebalance_cooldown: int = setting(0, "steps after a plan change before the next may be adopted", type=int)
    # Scripted plan changes {"global_step", "local_batch_sizes"} (tests and demos).
    plan_changes: Optional[list[dict]] = setting(
        None, "scripted plan change at a global step (tests, demos; repeatable)",
        type=plan_change, metavar="STEP:B0,B1,...", repeat=True, aliases=("--plan-change",))

    def __post_init__(self):
        validate.choice(named("policy"), self.policy, policy_names())
        if self.batch_split is not None:
            # Shares of the global batch: TrainConfig checks them against --global-batch-size and the ranks.
            _store(self, batch_split=validate.int_list(named("batch_split"), self.batch_split))
        validate.positive_int(named("rebalance_interval"), self.rebalance_interval)
        PolicyConfig(**self.policy_config())  # checks the threshold and the cooldown
        if self.plan_changes is not None:
            _store(self, plan_changes=validate.plan_changes(named("plan_changes"), self.plan_changes))

    def policy_config(self) -> dict:
        """Keyword arguments of :class:`hetero_ray.planning.decision.PolicyConfig`."""
        return {"rebalance_threshold": self.rebalance_threshold, "rebalance_cooldown": self.rebalance_cooldown}


@dataclass(frozen=True)
class EmulationConfig:
    """Heterogeneity on one machine: only the emulator reads these; planning measures."""

    emulate_speeds: Optional[list[float]] = setting(
        None, "per-rank fraction of real speed, e.g. 1,1,0.5,0.25", type=float_list)
    emulate_speed_changes: Optional[list[dict]] = setting(
        None, "from global STEP on, RANK runs at SPEED (repeatable)",
        type=speed_change, metavar="STEP:RANK:SPEED", repeat=True, aliases=("--emulate-speed-change",))
    emulate_devices: Optional[list[str]] = setting(
        None, "per-rank device curve: PROFILE.json[:NODE][:gpuN|cpuN] or curve:FLOOR_MS:ALPHA_MS:BETA_MS, "
              "each optionally *COUNT, e.g. h100_nodes.json:gpu0,curve:0:2:0.5*3",
        type=str_list, metavar="ENTRY,...")
    emulate_devices_factor: Optional[float] = setting(
        None, "the one factor K every --emulate-devices curve is stretched by (default: measured before step 0, "
              "so that no rank must run faster than this machine); pin it to compare runs of different worker "
              "groups on the same emulated devices", type=float, metavar="K")

    def __post_init__(self):
        if self.emulate_speeds is not None:
            _store(self, emulate_speeds=validate.fractions(named("emulate_speeds"), self.emulate_speeds,
                                                           of="the real speed"))
        if self.emulate_speed_changes is not None:
            _store(self, emulate_speed_changes=validate.speed_changes(named("emulate_speed_changes"),
                                                                      self.emulate_speed_changes))
        if self.emulate_devices is not None:
            _store(self, emulate_devices=emulated_devices(named("emulate_devices"), self.emulate_devices))
        if self.emulate_devices_factor is not None:
            _store(self, emulate_devices_factor=validate.positive_number(named("emulate_devices_factor"),
                                                                         self.emulate_devices_factor))
            if self.emulate_devices is None:
                raise ConfigError(f"{named('emulate_devices_factor')} stretches the curves of {named('emulate_devices')}; give "
                                  f"{named('emulate_devices')} too, or leave the factor out")


# --- emulated devices: the syntax of one rank's entry (training/timing/curve_emulation.py reads the files)
#
# Colons inside an entry, commas between ranks: as every per-rank flag (--emulate-speeds,
# --worker-devices) and --emulate-speed-changes STEP:RANK:SPEED.
_DEVICE_SELECTOR = re.compile(r"^(?P<kind>gpu|cpu)(?P<index>\d+)?$")
_COUNT_SUFFIX = re.compile(r"^(?P<entry>.+)\*(?P<count>\d+)$")
CURVE_PREFIX = "curve:"
EMULATED_DEVICE_FORMS = ("PROFILE.json[:NODE][:gpuN|cpuN] (a device of a nodes.json written by `hetero-ray "
                         "profile --model M --json FILE`) or curve:FLOOR_MS:ALPHA_MS:BETA_MS "
                         "(t(b) = max(FLOOR, ALPHA + BETA·b) in ms), each optionally *COUNT for COUNT ranks")


def emulated_devices(name: str, entries) -> list[str]:
    """One entry per rank (``*COUNT`` expanded), each checked by :func:`parse_emulated_device`."""
    out: list[str] = []
    for entry in validate.sequence(name, entries):
        if not isinstance(entry, str):
            raise ConfigError(f"{name} entries must be text: {EMULATED_DEVICE_FORMS}; got {entry!r}")
        entry = entry.strip()
        match = _COUNT_SUFFIX.match(entry)
        count = int(match["count"]) if match else 1
        entry = match["entry"].strip() if match else entry
        if count < 1:
            raise ConfigError(f"{name} entry {entry}*{count}: COUNT must be ≥ 1")
        parse_emulated_device(name, entry)
        out += [entry] * count
    if not out:
        raise ConfigError(f"{name} needs one entry per rank: {EMULATED_DEVICE_FORMS}")
    return out


def parse_emulated_device(name: str, entry: str) -> dict:
    """``{"floor_ms", "alpha_ms", "beta_ms"}`` for a ``curve:`` entry; ``{"profile", "node",
    "kind", "index"}`` (None where not given) for a profile's device. ConfigError otherwise."""
    bad = f"{name} entry {entry!r}: expected {EMULATED_DEVICE_FORMS}"
    if entry.startswith(CURVE_PREFIX):
        try:
            floor_ms, alpha_ms, beta_ms = (float(v) for v in entry[len(CURVE_PREFIX):].split(":"))
        except ValueError:
            raise ConfigError(bad) from None
        if not all(math.isfinite(v) for v in (floor_ms, alpha_ms, beta_ms)) or floor_ms < 0 or beta_ms < 0 \
                or max(floor_ms, alpha_ms + beta_ms) <= 0:
            raise ConfigError(f"{bad}; FLOOR_MS and BETA_MS must be ≥ 0 and one sample must take some time "
                              f"(max(FLOOR, ALPHA + BETA) > 0)")
        return {"floor_ms": floor_ms, "alpha_ms": alpha_ms, "beta_ms": beta_ms}
    path, *rest = entry.split(":")
    if not path.lower().endswith(".json") or len(rest) > 2:
        raise ConfigError(bad)
    selector = _DEVICE_SELECTOR.match(rest[-1]) if rest else None
    node = rest[0] if rest and (selector is None or len(rest) == 2) else None
    if (len(rest) == 2 and selector is None) or node == "":
        raise ConfigError(bad)
    return {"profile": path, "node": node, "kind": selector["kind"] if selector else None,
            "index": int(selector["index"]) if selector and selector["index"] else None}


@dataclass(frozen=True)
class ProfilingConfig:
    """Measuring the nodes before the first step, and the devices while training runs."""

    # Profile every node (hardware + this model) before the first step.
    profile: bool = setting(True, "skip profiling the nodes before training")
    profile_batch_sizes: Optional[list[int]] = setting(
        None, "probe batch sizes (default around B/n: B/n/4 … 2·B/n)", type=int_list)
    # In-training readings (GPU, CPU, RSS) from a daemon thread; 0: off.
    profile_interval: int = setting(
        10, "in-training GPU/CPU readings every N steps; 0 turns them off", type=int)
    profile_timeout_s: float = setting(  # slower nodes are reported failed and start with typical shares
        DEFAULT_PROFILE_TIMEOUT_S, "seconds for profiling the whole cluster", type=float, metavar="SECONDS",
        aliases=("--profile-timeout",))

    def __post_init__(self):
        validate.switch(named("profile"), self.profile)
        if self.profile_batch_sizes is not None:
            _store(self, profile_batch_sizes=validate.probe_sizes(named("profile_batch_sizes"), self.profile_batch_sizes))
        validate.non_negative_int(named("profile_interval"), self.profile_interval)
        validate.positive_number(named("profile_timeout_s"), self.profile_timeout_s, unit="seconds")


@dataclass(frozen=True)
class FaultToleranceConfig:
    """Checkpoints, restarts, and continuing a stopped run."""

    checkpoint_every: int = setting(100, "steps between checkpoints (and every epoch end)", type=int)
    max_failures: int = setting(3, "worker-group restarts allowed, each from the last checkpoint", type=int)
    resume: bool = setting(False, "continue the run of the same --name")
    # A NaN loss is almost always a bug or a divergence, and every later step trains on it.
    allow_non_finite_loss: bool = setting(
        False, "train on when a loss is NaN or infinite (by default the run stops at that step, naming it)")

    def __post_init__(self):
        validate.positive_int(named("checkpoint_every"), self.checkpoint_every)
        validate.non_negative_int(named("max_failures"), self.max_failures)
        validate.switch(named("allow_non_finite_loss"), self.allow_non_finite_loss)


@dataclass(frozen=True)
class OutputConfig:
    """Which run this is, and where its files go."""

    # The flags are Ray Train's RunConfig(name=..., storage_path=...): one word for each in the
    # CLI, the Python API and the examples (the settings keep their config.json keys).
    name: str = setting(help="the run's name, its folder under --storage-path (default run-YYYYmmdd-HHMMSS)",
                        default_factory=default_experiment_name, aliases=("--experiment-name",))
    storage_path: str = setting("runs", "where runs go: a run is the folder STORAGE_PATH/NAME (shared by every node "
                                        "of a multi-node cluster)", aliases=("--output-dir",))
    record_sample_ids: bool = setting(False, "write sample_ids.parquet (exactly-once audit)")

    def __post_init__(self):
        if not isinstance(self.name, str) or not _EXPERIMENT_NAME.match(self.name):
            raise ConfigError(
                f"{named('name')} {self.name!r} must be 1-100 characters of letters, "
                "digits, '.', '_' or '-', starting with a letter or digit"
            )
        if not self.storage_path:
            raise ConfigError(f"{named('storage_path')} must not be empty")
        validate.switch(named("record_sample_ids"), self.record_sample_ids)


# --- the rules that join parts: TrainConfig's, and HeteroConfig's with its own words


def check_shares(plan: PlanConfig, batch_size: int) -> None:
    """The plan's shares add up to the global batch (known before the workers are)."""
    if plan.batch_split is not None:
        validate.shares(named("batch_split"), plan.batch_split, batch_size, named("global_batch_size"))
    for change in plan.plan_changes or ():
        validate.shares(f"{named('plan_changes')} at step {change['global_step']}", change["local_batch_sizes"], batch_size,
                        named("global_batch_size"), may_leave_out=True)


def check_ranks(plan: PlanConfig, emulation: EmulationConfig, batch_size: int, num_workers: int) -> None:
    """What depends on the number of workers (the most a run may have): a sample per
    worker in every step, one value per rank in every per-rank setting."""
    if batch_size < num_workers:
        raise ConfigError(f"{named('global_batch_size')} {batch_size} is smaller than {named('num_workers')} {num_workers}: every worker "
                          "needs at least one sample per step; raise the global batch or use fewer workers")
    if plan.batch_split is not None:
        validate.per_rank(named("batch_split"), plan.batch_split, num_workers)
    for change in plan.plan_changes or ():
        validate.per_rank(f"{named('plan_changes')} at step {change['global_step']}", change["local_batch_sizes"], num_workers)
    if emulation.emulate_speeds is not None:
        validate.per_rank(named("emulate_speeds"), emulation.emulate_speeds, num_workers)
    for change in emulation.emulate_speed_changes or ():
        if change["rank"] >= num_workers:
            raise ConfigError(f"{named('emulate_speed_changes')} rank {change['rank']} does not exist with "
                              f"{named('num_workers')} {num_workers}")
    if emulation.emulate_devices is not None:
        validate.per_rank(named("emulate_devices"), emulation.emulate_devices, num_workers)


def default_of(part: type, name: str) -> Any:
    """A part's default for ``name``: what another front end on the same part defaults to."""
    found = next(f for f in dataclasses.fields(part) if f.name == name)
    return found.default_factory() if found.default is dataclasses.MISSING else found.default


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
    optimization: OptimizationConfig = _part("optimisation (depends on the global batch only)")
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
                f"{named('num_samples')} {self.num_samples} is smaller than {named('global_batch_size')} {self.global_batch_size}; "
                "one epoch would not fill one global batch"
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
for _name, _part_name in _PART_OF.items():  # config.seed reads config.optimization.seed
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
    "policy", "batch_split", "rebalance_interval", "rebalance_threshold", "rebalance_cooldown", "plan_changes",
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
