"""``HeteroConfig``: what hetero_ray adds to a Ray Train run — the global batch and how it
is shared out — validated when it is built.

The names are those of ``hetero-ray train``'s flags (``--policy`` is ``policy``,
``--rebalance-interval`` is ``rebalance_interval``, …), with the defaults of the CLI.
Settings that depend on the number of workers (a per-rank list) are checked again by
:class:`~hetero_ray.trainer.HeteroTrainer`, which knows it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from hetero_ray import validate
from hetero_ray.config import POLICIES, emulated_devices
from hetero_ray.errors import ConfigError
from hetero_ray.profile_defaults import DEFAULT_PROFILE_TIMEOUT_S
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
            hetero_ray/training/curve_emulation.py). Needs ``profile_model``: the ranks time
            it before step 0 to find the factor. Only the emulator reads it.
    """

    global_batch_size: int
    policy: str = "optimal"  # minimise the predicted step time with the fitted cost model
    batch_split: Optional[tuple[int, ...]] = None
    rebalance_interval: int = 20  # steps: often enough to follow a device, rare enough to measure
    rebalance_threshold: float = 0.05  # adopt only if the predicted step time drops > 5 %
    rebalance_cooldown: int = 0
    emulate_speeds: Optional[tuple[float, ...]] = None
    emulate_speed_changes: Optional[tuple[dict, ...]] = None
    plan_changes: Optional[tuple[dict, ...]] = None
    seed: int = 0
    record_sample_ids: bool = False
    profile_interval: int = 10  # steps between in-training readings (a daemon thread reads)
    output_dir: Optional[str] = None
    profile: bool = True
    profile_model: Optional[ProfileModel] = None
    profile_batch_sizes: Optional[tuple[int, ...]] = None
    profile_timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S  # profiler start and the probes of every node
    worker_devices: Optional[tuple[str, ...]] = None
    allow_non_finite_loss: bool = False  # a NaN loss is almost always a bug or a divergence: stop
    emulate_devices: Optional[tuple[str, ...]] = None

    def __post_init__(self):
        validate.positive_int("HeteroConfig.global_batch_size", self.global_batch_size)
        validate.choice("HeteroConfig.policy", self.policy, POLICIES)
        validate.positive_int("HeteroConfig.rebalance_interval", self.rebalance_interval)
        validate.fraction_below_one("HeteroConfig.rebalance_threshold", self.rebalance_threshold, of="the step time")
        validate.non_negative_int("HeteroConfig.rebalance_cooldown", self.rebalance_cooldown)
        validate.non_negative_int("HeteroConfig.seed", self.seed)
        validate.non_negative_int("HeteroConfig.profile_interval", self.profile_interval)
        validate.switch("HeteroConfig.profile", self.profile)
        validate.switch("HeteroConfig.record_sample_ids", self.record_sample_ids)
        validate.switch("HeteroConfig.allow_non_finite_loss", self.allow_non_finite_loss)
        object.__setattr__(self, "output_dir", validate.optional_path("HeteroConfig.output_dir", self.output_dir))
        if self.profile_model is not None and not isinstance(self.profile_model, ProfileModel):
            raise ConfigError(f"HeteroConfig.profile_model must be a hetero_ray.ProfileModel(build=..., "
                              f"make_batch=...), got {type(self.profile_model).__name__}")
        if self.profile_batch_sizes is not None:
            self._store(profile_batch_sizes=validate.probe_sizes("HeteroConfig.profile_batch_sizes",
                                                                 self.profile_batch_sizes))
        validate.positive_number("HeteroConfig.profile_timeout_s", self.profile_timeout_s, unit="seconds")
        if self.worker_devices is not None:
            self._store(worker_devices=validate.device_kinds("HeteroConfig.worker_devices", self.worker_devices))
        if self.batch_split is not None:
            self._store(batch_split=validate.shares("HeteroConfig.batch_split", self.batch_split,
                                                    self.global_batch_size, "HeteroConfig.global_batch_size"))
        if self.emulate_speeds is not None:
            self._store(emulate_speeds=validate.fractions("HeteroConfig.emulate_speeds", self.emulate_speeds,
                                                          of="the real speed"))
        if self.emulate_speed_changes is not None:
            self._store(emulate_speed_changes=validate.speed_changes("HeteroConfig.emulate_speed_changes",
                                                                     self.emulate_speed_changes))
        if self.emulate_devices is not None:
            self._store(emulate_devices=emulated_devices("HeteroConfig.emulate_devices", self.emulate_devices))
            if self.profile_model is None:
                raise ConfigError("HeteroConfig.emulate_devices needs a profile_model: every rank times its step "
                                  "before step 0 to find how much slower than the curves this machine must run; "
                                  "pass HeteroConfig(profile_model=hetero_ray.ProfileModel(build=..., "
                                  "make_batch=...))")
        if self.plan_changes is not None:
            changes = validate.plan_changes("HeteroConfig.plan_changes", self.plan_changes)
            for change in changes:
                validate.shares(f"HeteroConfig.plan_changes at step {change['global_step']}",
                                change["local_batch_sizes"], self.global_batch_size, "HeteroConfig.global_batch_size",
                                may_leave_out=True)
            self._store(plan_changes=changes)

    def _store(self, **values) -> None:
        """Keeps the checked form of sequences, as tuples (a frozen config holds no lists)."""
        for name, value in values.items():
            object.__setattr__(self, name, tuple(value))

    def check_workers(self, max_workers: int) -> None:
        """What depends on the number of workers (the most the run may have)."""
        if self.global_batch_size < max_workers:
            raise ConfigError(
                f"HeteroConfig.global_batch_size {self.global_batch_size} is smaller than the {max_workers} "
                "workers of ScalingConfig: every worker needs at least one sample per step; raise the global "
                "batch or use fewer workers"
            )
        workers = "ScalingConfig.num_workers"
        if self.batch_split is not None:
            validate.per_rank("HeteroConfig.batch_split", self.batch_split, max_workers, workers)
        if self.emulate_speeds is not None:
            validate.per_rank("HeteroConfig.emulate_speeds", self.emulate_speeds, max_workers, workers)
        if self.worker_devices is not None:
            validate.per_rank("HeteroConfig.worker_devices", self.worker_devices, max_workers, workers)
        if self.emulate_devices is not None:
            validate.per_rank("HeteroConfig.emulate_devices", self.emulate_devices, max_workers, workers)
        for change in self.emulate_speed_changes or ():
            if change["rank"] >= max_workers:
                raise ConfigError(f"HeteroConfig.emulate_speed_changes: rank {change['rank']} does not exist "
                                  f"with {max_workers} workers")
        for change in self.plan_changes or ():
            validate.per_rank(f"HeteroConfig.plan_changes at step {change['global_step']}",
                              change["local_batch_sizes"], max_workers, workers)

    def policy_config(self) -> dict:
        """Keyword arguments of :class:`hetero_ray.planning.policies.PolicyConfig`."""
        return {"rebalance_threshold": float(self.rebalance_threshold), "cooldown_steps": self.rebalance_cooldown}

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
