"""The parts of a run's configuration that the library and the built-in job share, each a
frozen dataclass that checks its own fields when it is built: the global batch and the data
order, the cluster, the plan, emulation, profiling, fault tolerance and output.

:class:`~hetero_ray.hetero_config.HeteroConfig` (the API) and
:class:`~hetero_ray.builtin.config.TrainConfig` (``hetero-ray train``) are made of them, and
:func:`check_shares` / :func:`check_ranks` are the rules that join them. The checks are
:mod:`hetero_ray.validate`'s, naming each setting in its user's words. Every field also
declares its flag (:func:`hetero_ray.flags.setting`): the CLI's parsers are built from them.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Optional

from hetero_ray import validate
from hetero_ray.errors import ConfigError
from hetero_ray.flags import (
    float_list, int_list, label_selectors, plan_change, setting, speed_change, str_list, worker_range,
)
from hetero_ray.planning.decision import PolicyConfig
from hetero_ray.planning.policies import DEFAULT_POLICY, policy_names
from hetero_ray.planning.policy_module import HELP as POLICY_MODULE_HELP, load_policy_module
from hetero_ray.profile_defaults import DEFAULT_PROFILE_TIMEOUT_S
from hetero_ray.validate import named

USE_GPU_CHOICES = ("auto", "yes", "no")
BACKENDS = ("auto", "nccl", "gloo")

_EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def default_experiment_name() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S")


def one_of(choices) -> str:
    return f"one of {', '.join(choices)}"


def store(part, **values) -> None:
    """Keeps the checked form of values (a list for any sequence) on a frozen part."""
    for name, value in values.items():
        object.__setattr__(part, name, value)


@dataclass(frozen=True)
class BatchConfig:
    """What the optimiser's trajectory depends on besides the model: the global batch and
    the order of the samples in it, never the workers or their speeds."""

    global_batch_size: int = setting(64, "global batch size B: the samples of one optimiser step across all workers",
                                     type=int, aliases=("--batch-size",))
    seed: int = setting(0, "the data order (one seeded permutation per epoch) and the initial weights", type=int)

    def __post_init__(self):
        validate.positive_int(named("global_batch_size"), self.global_batch_size)
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
    use_gpu: str = setting("auto", one_of(USE_GPU_CHOICES))  # auto: GPU workers when the cluster has GPUs
    backend: str = setting("auto", f"{one_of(BACKENDS)}; auto: nccl when all ranks have GPUs, else gloo")
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
            store(self, worker_labels=selectors)
        if self.worker_devices is not None:
            devices = validate.device_kinds(named("worker_devices"), self.worker_devices)
            validate.per_rank(named("worker_devices"), devices, self.num_workers)
            if self.worker_labels is not None:
                raise ConfigError(f"{named('worker_devices')} and {named('worker_labels')} both place workers; "
                                  "give one of them")
            if self.use_gpu == "no" and "gpu" in devices:
                raise ConfigError(f"{named('worker_devices')} asks for GPU workers but {named('use_gpu')} is no")
            store(self, worker_devices=devices)

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

    # A module of the user's, imported first: the policies it registers become choices.
    policy_module: Optional[str] = setting(None, POLICY_MODULE_HELP, metavar="MODULE")
    # optimal: minimise the predicted step time with the fitted cost model.
    policy: str = setting(DEFAULT_POLICY, one_of(policy_names()))  # the built-in ones; any registered one passes
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
        if self.policy_module is not None:
            if not isinstance(self.policy_module, str) or not self.policy_module:
                raise ConfigError(f"{named('policy_module')} must name a module or a .py file, "
                                  f"got {self.policy_module!r}")
            load_policy_module(named("policy_module"), self.policy_module)
        validate.choice(named("policy"), self.policy, policy_names())
        if self.batch_split is not None:
            # Shares of the global batch: TrainConfig checks them against --global-batch-size and the ranks.
            store(self, batch_split=validate.int_list(named("batch_split"), self.batch_split))
        validate.positive_int(named("rebalance_interval"), self.rebalance_interval)
        PolicyConfig(**self.policy_config())  # checks the threshold and the cooldown
        if self.plan_changes is not None:
            store(self, plan_changes=validate.plan_changes(named("plan_changes"), self.plan_changes))

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
            store(self, emulate_speeds=validate.fractions(named("emulate_speeds"), self.emulate_speeds,
                                                           of="the real speed"))
        if self.emulate_speed_changes is not None:
            store(self, emulate_speed_changes=validate.speed_changes(named("emulate_speed_changes"),
                                                                      self.emulate_speed_changes))
        if self.emulate_devices is not None:
            store(self, emulate_devices=emulated_devices(named("emulate_devices"), self.emulate_devices))
        if self.emulate_devices_factor is not None:
            store(self, emulate_devices_factor=validate.positive_number(named("emulate_devices_factor"),
                                                                         self.emulate_devices_factor))
            if self.emulate_devices is None:
                raise ConfigError(f"{named('emulate_devices_factor')} stretches the curves of "
                                  f"{named('emulate_devices')}; give {named('emulate_devices')} too, or leave the "
                                  "factor out")


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
            store(self, profile_batch_sizes=validate.probe_sizes(named("profile_batch_sizes"),
                                                                 self.profile_batch_sizes))
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
        validate.shares(f"{named('plan_changes')} at step {change['global_step']}", change["local_batch_sizes"],
                        batch_size, named("global_batch_size"), may_leave_out=True)


def check_ranks(plan: PlanConfig, emulation: EmulationConfig, batch_size: int, num_workers: int) -> None:
    """What depends on the number of workers (the most a run may have): a sample per
    worker in every step, one value per rank in every per-rank setting."""
    if batch_size < num_workers:
        raise ConfigError(f"{named('global_batch_size')} {batch_size} is smaller than {named('num_workers')} "
                          f"{num_workers}: every worker needs at least one sample per step; raise the global batch "
                          "or use fewer workers")
    if plan.batch_split is not None:
        validate.per_rank(named("batch_split"), plan.batch_split, num_workers)
    for change in plan.plan_changes or ():
        validate.per_rank(f"{named('plan_changes')} at step {change['global_step']}", change["local_batch_sizes"],
                          num_workers)
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


