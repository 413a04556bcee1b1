"""``HeteroConfig``: what hetero_ray adds to a Ray Train run — the global batch and how it
is shared out — validated when it is built.

The names are those of ``hetero-ray train``'s settings (``--policy`` is ``policy``,
``--rebalance-interval`` is ``rebalance_interval``, …), and so are the checks and the
defaults: a ``HeteroConfig`` is made of the same parts as the built-in job's
:class:`~hetero_ray.builtin.config.TrainConfig` (the plan, emulation, profiling, …), which
check their own fields once, and the rules that join them are the same functions, run under
the API's words (:func:`in_api_words`): an error names ``HeteroConfig.policy`` here where it
names ``--policy`` to a CLI user. Settings that depend on the number of workers (a per-rank
list) are checked again by :class:`~hetero_ray.trainer.HeteroTrainer`, which knows it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from hetero_ray import validate
from hetero_ray.config import (
    BatchConfig, ClusterConfig, EmulationConfig, FaultToleranceConfig, OutputConfig, PlanConfig,
    ProfilingConfig, check_ranks, check_shares, default_of,
)
from hetero_ray.errors import ConfigError
from hetero_ray.profiling.recipe import ProfileModel


@dataclass(frozen=True)
class HeteroConfig:
    """Planning, profiling and emulation settings of a hetero_ray run.

    Args:
        global_batch_size: ``B``, the samples of one optimiser step across all ranks; the
            learning rate schedule depends on it alone, never on the workers.
        policy: how shares follow speed: static (equal), proportional, dynamic, optimal.
        batch_split: an explicit first plan, one share per worker (sum = B).
        rebalance_interval: steps between plan checks; plans change only there.
        rebalance_threshold: adopt a plan only if it predicts a step this much faster.
        rebalance_cooldown: steps after a change before the next may be adopted.
        emulate_speeds: per-rank fraction of real speed (heterogeneity on one machine);
            only the emulator reads it, planning measures.
        emulate_speed_changes: ``{"global_step", "rank", "speed"}`` each: a rank slows
            down (or recovers) mid-run.
        plan_changes: scripted plans ``{"global_step", "local_batch_sizes"}`` (tests, demos).
        seed: the data order (one seeded permutation per epoch).
        record_sample_ids: write ``sample_ids.parquet`` (an exactly-once audit).
        profile_interval: in-training GPU/CPU readings every N steps; 0 turns them off.
        profile: profile every node before the first step — with ``profile_model``, the
            model's busy-time line and largest batch on each device, so the first plan is
            already balanced. Without a ``profile_model`` there is nothing to probe: the
            first plan is equal shares, and the balancer learns from the first steps.
        profile_model: a :class:`~hetero_ray.ProfileModel` — how to build the model and
            make a batch of a given size — that the profiler steps on every node.
        profile_batch_sizes: probe sizes (default around the mean share: B/n/4 … 2·B/n).
        profile_timeout_s: for the whole cluster; nodes not done by then start with typical shares.
        output_dir: where the run's tables go when ``RunConfig.storage_path`` is a URI
            (copied there after each checkpoint and at the end); default ``~/hetero_ray/runs``.
        worker_devices: the device kind of each worker, ``"gpu"`` or ``"cpu"`` (e.g.
            ``("gpu", "gpu", "cpu")``): GPU and CPU workers in one job, each placed on a
            node labelled ``hetero-ray.io/device=<kind>`` (see cluster_configs/), gloo
            between them. Leave ``ScalingConfig(use_gpu=...)`` unset: Ray reserves GPUs
            only when every worker asks for one, so each worker takes its device itself.
        allow_non_finite_loss: train on when a loss is NaN or infinite. By default such a
            loss stops the run at once with a message naming the step and the rank (every
            step after it would be noise, and the run would still end "finished").
        emulate_devices: per-rank device curve, as ``--emulate-devices`` (e.g.
            ``("h100_nodes.json:gpu0", "curve:0:2:0.5", "curve:0:2:0.5")``): each rank pads
            its busy time to that device's curve times one common factor (see
            hetero_ray/training/timing/curve_emulation.py). Needs ``profile_model``: the ranks time
            it before step 0 to find the factor. Only the emulator reads it.
        emulate_devices_factor: that common factor, pinned instead of measured (as
            ``--emulate-devices-factor``): runs of different worker groups then emulate the
            same devices. Each run records the factor it used (``attempts.json``).
        feed_trial: whether the run measures, once its plan settles, if its CPU-only ranks
            are faster feeding the Ray Data pipeline (left out: their node's cores run its
            ``map_batches``) than training, and keeps the faster, with the reason in
            decisions.parquet. None (default): where it applies — a ``"train"`` Ray Data
            dataset, an adaptive policy (``dynamic``, ``optimal``), and CPU ranks beside GPU
            ranks or on nodes of their own; True: also for ranks on rank 0's node (needs a
            ``"train"`` dataset and an adaptive policy); False: never.
        feed_trial_steps: the steps each of the trial's two windows measures at least (≥ 2),
            rounded up to whole epochs (the wait between epochs counts).
    """

    global_batch_size: int
    policy: str = default_of(PlanConfig, "policy")
    batch_split: Optional[tuple[int, ...]] = None
    rebalance_interval: int = default_of(PlanConfig, "rebalance_interval")
    rebalance_threshold: float = default_of(PlanConfig, "rebalance_threshold")
    rebalance_cooldown: int = default_of(PlanConfig, "rebalance_cooldown")
    emulate_speeds: Optional[tuple[float, ...]] = None
    emulate_speed_changes: Optional[tuple[dict, ...]] = None
    plan_changes: Optional[tuple[dict, ...]] = None
    seed: int = default_of(BatchConfig, "seed")
    record_sample_ids: bool = default_of(OutputConfig, "record_sample_ids")
    profile_interval: int = default_of(ProfilingConfig, "profile_interval")
    output_dir: Optional[str] = None
    profile: bool = default_of(ProfilingConfig, "profile")
    profile_model: Optional[ProfileModel] = None
    profile_batch_sizes: Optional[tuple[int, ...]] = None
    profile_timeout_s: float = default_of(ProfilingConfig, "profile_timeout_s")
    worker_devices: Optional[tuple[str, ...]] = None
    allow_non_finite_loss: bool = default_of(FaultToleranceConfig, "allow_non_finite_loss")
    emulate_devices: Optional[tuple[str, ...]] = None
    emulate_devices_factor: Optional[float] = None
    feed_trial: Optional[bool] = None  # None: where it applies (see above)
    feed_trial_steps: int = 20  # each window: enough periods for a noise estimate, a few seconds of a run

    def __post_init__(self):
        with in_api_words():
            BatchConfig(global_batch_size=self.global_batch_size, seed=self.seed)
            plan = PlanConfig(policy=self.policy, batch_split=self.batch_split,
                              rebalance_interval=self.rebalance_interval,
                              rebalance_threshold=self.rebalance_threshold,
                              rebalance_cooldown=self.rebalance_cooldown, plan_changes=self.plan_changes)
            emulation = EmulationConfig(emulate_speeds=self.emulate_speeds,
                                        emulate_speed_changes=self.emulate_speed_changes,
                                        emulate_devices=self.emulate_devices,
                                        emulate_devices_factor=self.emulate_devices_factor)
            profiling = ProfilingConfig(profile=self.profile, profile_batch_sizes=self.profile_batch_sizes,
                                        profile_interval=self.profile_interval,
                                        profile_timeout_s=self.profile_timeout_s)
            FaultToleranceConfig(allow_non_finite_loss=self.allow_non_finite_loss)
            OutputConfig(record_sample_ids=self.record_sample_ids)
            if self.worker_devices is not None:
                devices = validate.device_kinds(validate.named("worker_devices"), self.worker_devices)
                cluster = ClusterConfig(num_workers=len(devices), worker_devices=devices)
                self._store(worker_devices=cluster.worker_devices)
            check_shares(plan, self.global_batch_size)
        object.__setattr__(self, "plan", plan)
        object.__setattr__(self, "emulation", emulation)
        for part, names in ((plan, ("batch_split", "plan_changes")), (profiling, ("profile_batch_sizes",)),
                            (emulation, ("emulate_speeds", "emulate_speed_changes", "emulate_devices"))):
            self._store(**{name: getattr(part, name) for name in names if getattr(part, name) is not None})
        object.__setattr__(self, "emulate_devices_factor", emulation.emulate_devices_factor)  # a number, checked
        object.__setattr__(self, "output_dir", validate.optional_path(API_WORDS.name("output_dir"), self.output_dir))
        if self.feed_trial not in (None, True, False):
            raise ConfigError(f"HeteroConfig.feed_trial must be None (where it applies), True or False, got "
                              f"{self.feed_trial!r}")
        steps = self.feed_trial_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
            raise ConfigError(f"HeteroConfig.feed_trial_steps must be an integer ≥ 2 (each window compares step "
                              f"periods), got {steps!r}")
        if self.profile_model is not None and not isinstance(self.profile_model, ProfileModel):
            raise ConfigError(f"HeteroConfig.profile_model must be a hetero_ray.ProfileModel(build=..., "
                              f"make_batch=...), got {type(self.profile_model).__name__}")
        if self.emulate_devices is not None and self.profile_model is None:
            raise ConfigError("HeteroConfig.emulate_devices needs a profile_model: every rank times its step "
                              "before step 0 to find how much slower than the curves this machine must run; "
                              "pass HeteroConfig(profile_model=hetero_ray.ProfileModel(build=..., "
                              "make_batch=...))")

    def _store(self, **values) -> None:
        """Keeps the checked form of sequences, as tuples (a frozen config holds no lists)."""
        for name, value in values.items():
            object.__setattr__(self, name, tuple(value))

    def check_workers(self, max_workers: int) -> None:
        """What depends on the number of workers (the most the run may have)."""
        with in_api_words():
            check_ranks(self.plan, self.emulation, self.global_batch_size, max_workers)
            if self.worker_devices is not None:
                validate.per_rank(validate.named("worker_devices"), self.worker_devices, max_workers)

    def policy_config(self) -> dict:
        """Keyword arguments of :class:`hetero_ray.planning.decision.PolicyConfig`."""
        return self.plan.policy_config()

    @property
    def profiles_nodes(self) -> bool:
        """Whether ``fit()`` profiles the nodes: asked to, and given a model to probe."""
        return self.profile and self.profile_model is not None

    def label_selectors(self) -> Optional[list[dict]]:
        """Ray's per-worker placement for ``worker_devices``: the node's device label."""
        if self.worker_devices is None:
            return None
        from hetero_ray.constants import DEVICE_LABEL

        return [{DEVICE_LABEL: kind} for kind in self.worker_devices]

    def to_dict(self) -> dict:
        """JSON-ready (config.json): the profile model by its name."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["profile_model"] = self.profile_model.name if self.profile_model is not None else None
        return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}


# The API's words: HeteroConfig's fields, and the workers as Ray Train's ScalingConfig names them.
API_WORDS = validate.Words("HeteroConfig", {"num_workers": "ScalingConfig"})


def in_api_words():
    """Checks inside name each setting as the API does (``HeteroConfig.policy``)."""
    return validate.words(API_WORDS)
