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

from hetero_ray.config import (
    POLICIES, _choice, _int_list, _non_negative_int, _per_rank_length, _positive_int,
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
            (they are copied there at the end); default ``~/hetero_ray/runs``.
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
    profile_timeout_s: float = 120.0  # the CLI's default: profiler start and the probes of every node

    def __post_init__(self):
        _positive_int("HeteroConfig.global_batch_size", self.global_batch_size)
        _choice("HeteroConfig.policy", self.policy, POLICIES)
        _positive_int("HeteroConfig.rebalance_interval", self.rebalance_interval)
        threshold = self.rebalance_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < 1:
            raise ConfigError(f"HeteroConfig.rebalance_threshold must be in [0, 1) (a fraction of the step "
                              f"time), got {threshold!r}")
        _non_negative_int("HeteroConfig.rebalance_cooldown", self.rebalance_cooldown)
        _non_negative_int("HeteroConfig.seed", self.seed)
        _non_negative_int("HeteroConfig.profile_interval", self.profile_interval)
        if not isinstance(self.profile, bool):
            raise ConfigError(f"HeteroConfig.profile must be True or False, got {self.profile!r}")
        if self.profile_model is not None and not isinstance(self.profile_model, ProfileModel):
            raise ConfigError(f"HeteroConfig.profile_model must be a hetero_ray.ProfileModel(build=..., "
                              f"make_batch=...), got {type(self.profile_model).__name__}")
        if self.profile_batch_sizes is not None:
            sizes = _int_list("HeteroConfig.profile_batch_sizes", self.profile_batch_sizes)
            if len(set(sizes)) < 2 or any(b < 1 for b in sizes):
                raise ConfigError(f"HeteroConfig.profile_batch_sizes needs two or more different positive sizes "
                                  f"to fit t(b) = α + β·b, got {sizes}")
            object.__setattr__(self, "profile_batch_sizes", tuple(sorted(set(sizes))))
        timeout = self.profile_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"HeteroConfig.profile_timeout_s must be a positive number of seconds, got {timeout!r}")
        if self.batch_split is not None:
            split = _int_list("HeteroConfig.batch_split", self.batch_split)
            if any(b < 1 for b in split) or sum(split) != self.global_batch_size:
                raise ConfigError(f"HeteroConfig.batch_split {split} must hold shares ≥ 1 that sum to "
                                  f"global_batch_size {self.global_batch_size}")
            object.__setattr__(self, "batch_split", tuple(split))
        if self.emulate_speeds is not None:
            speeds = tuple(float(v) for v in self.emulate_speeds)
            if not speeds or any(not 0 < v <= 1 for v in speeds):
                raise ConfigError(f"HeteroConfig.emulate_speeds values must be in (0, 1] (a fraction of the "
                                  f"real speed), got {list(speeds)}")
            object.__setattr__(self, "emulate_speeds", speeds)
        for change in self.emulate_speed_changes or ():
            if set(change) != {"global_step", "rank", "speed"} or not 0 < float(change["speed"]) <= 1:
                raise ConfigError("HeteroConfig.emulate_speed_changes: each change has the keys global_step, "
                                  f"rank and speed, with speed in (0, 1]; got {change!r}")
        for change in self.plan_changes or ():
            sizes = _int_list("HeteroConfig.plan_changes", change.get("local_batch_sizes", []))
            if any(b < 1 for b in sizes) or sum(sizes) != self.global_batch_size:
                raise ConfigError(f"HeteroConfig.plan_changes at step {change.get('global_step')}: shares "
                                  f"{sizes} must be ≥ 1 and sum to global_batch_size {self.global_batch_size}")

    def check_workers(self, max_workers: int) -> None:
        """What depends on the number of workers (the most the run may have)."""
        if self.global_batch_size < max_workers:
            raise ConfigError(
                f"HeteroConfig.global_batch_size {self.global_batch_size} is smaller than the {max_workers} "
                "workers of ScalingConfig: every worker needs at least one sample per step; raise the global "
                "batch or use fewer workers"
            )
        if self.batch_split is not None:
            _per_rank_length("HeteroConfig.batch_split", self.batch_split, max_workers)
        if self.emulate_speeds is not None:
            _per_rank_length("HeteroConfig.emulate_speeds", self.emulate_speeds, max_workers)
        for change in self.emulate_speed_changes or ():
            if not 0 <= int(change["rank"]) < max_workers:
                raise ConfigError(f"HeteroConfig.emulate_speed_changes: rank {change['rank']} does not exist "
                                  f"with {max_workers} workers")
        for change in self.plan_changes or ():
            _per_rank_length("HeteroConfig.plan_changes", change["local_batch_sizes"], max_workers)

    def policy_config(self) -> dict:
        """Keyword arguments of :class:`hetero_ray.balancing.policies.PolicyConfig`."""
        return {"rebalance_threshold": float(self.rebalance_threshold), "cooldown_steps": self.rebalance_cooldown}

    @property
    def profiles_nodes(self) -> bool:
        """Whether ``fit()`` profiles the nodes: asked to, and given a model to probe."""
        return self.profile and self.profile_model is not None

    def to_dict(self) -> dict:
        """JSON-ready (config.json): the profile model by its name."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["profile_model"] = self.profile_model.name if self.profile_model is not None else None
        return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
