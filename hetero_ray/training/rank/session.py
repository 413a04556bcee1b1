"""One worker's place in a hetero_ray run: who it is, whom it talks to, which plan is in force.

:class:`WorkerSession` is made once per worker-group start, before the user's
``train_loop_per_worker`` runs, by :func:`hetero_ray.training.rank.entry.run_user_loop`, and
is frozen. It holds the worker's :class:`~hetero_ray.training.rank.identity.WorkerIdentity`,
the run's settings and actors, the step in progress
(:class:`~hetero_ray.training.rank.current_step.CurrentStep`), the plan protocol
(:meth:`WorkerSession.agree_on_plan`), the step recorder
(:meth:`WorkerSession.flush_records`) and the :class:`LoopParts`. The public functions of
:mod:`hetero_ray.train` find it with :func:`current` (at most one per process).
What each part is for: docs/worker-runtime.md#the-ranks-session
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import ray
import ray.train
import torch

from hetero_ray.constants import (
    DEFAULT_PLAN_FETCH_TIMEOUT_S, DEFAULT_RECORD_FLUSH_INTERVAL_S, METRICS_STORE_ROLE, PLAN_FETCH_TIMEOUT_S_ENV_VAR,
    PLANNER_ROLE, RAY_NAMESPACE, RECORD_FLUSH_INTERVAL_S_ENV_VAR, actor_name, data_feed_role, env_float,
)
from hetero_ray.errors import UserError
from hetero_ray.planning.plan import Plan, equal_split
from hetero_ray.planning.rank_facts import RankFacts
from hetero_ray.sampler import Position
from hetero_ray.training.rank.current_step import CurrentStep
from hetero_ray.training.rank.identity import WorkerIdentity, register_attempt
from hetero_ray.training.rank.plan_sync import broadcast_plan, fetch_plan
from hetero_ray.training.rank.recorder import StepRecorder
from hetero_ray.training.rank.rejoin import Groups
from hetero_ray.training.timing.curve_emulation import CurveEmulator, DeviceCurve, common_factor, rank_ratio
from hetero_ray.training.timing.emulation import SpeedChange, SpeedEmulator, SpeedSchedule, fit_to_cores

if TYPE_CHECKING:
    from hetero_ray.training.data.loader import PlanFollowingLoader
    from hetero_ray.training.gradients.model_prep import PreparedModel

logger = logging.getLogger("hetero_ray.worker")


@dataclass(frozen=True)
class WorkerSettings:
    """What the driver tells every worker about the run (sent in the loop config)."""

    experiment_name: str
    global_batch_size: int
    seed: int
    rebalance_interval: int
    device_mode: str  # gpu | cpu | mixed (see training/rank/devices.py)
    record_sample_ids: bool = False
    profile_interval: int = 10
    emulate_speeds: Optional[list[float]] = None
    speed_changes: Optional[list[dict]] = None
    # Each rank's emulated device curve (DeviceCurve.to_dict), resolved by the driver from
    # --emulate-devices; needs warmup_model (the ranks time it to find the common factor).
    emulate_devices: Optional[list[dict]] = None
    emulate_devices_factor: Optional[float] = None  # the curves' common factor, pinned (None: measured)
    end_global_step: Optional[int] = None  # known for built-in runs; None for user loops
    # Under emulated speeds: the model recipe (a ProfileModel) each rank times itself with
    # before step 0, and at which batch sizes (see training/timing/warmup.py).
    warmup_model: Any = None
    warmup_batch_sizes: Optional[list[int]] = None
    # Node profiles made beside the workers' start: how long rank 0 waits for them at the
    # first plan (see runtime/node_profiling.py).
    first_plan_wait_s: float = 0.0
    allow_non_finite_loss: bool = False  # else a NaN/inf loss stops the run (training/rank/loop_report.py)
    tables_to_uri: bool = False  # URI storage: the tables reach it before each checkpoint (training/rank/loop_report.py)
    # HeteroTrainer(datasets=...): the one that follows the plan, read from the run's feed
    # actor of its name, and those Ray Train splits for evaluation (training/data/dataset_shard.py).
    data_feeds: Optional[list[str]] = None
    evaluation_datasets: Optional[list[str]] = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "WorkerSettings":
        return cls(**d)


@dataclass
class LoopParts:
    """What the user's loop makes through the public API, once each (a second call is
    refused). Each is set by the function that makes it and read by the others: the loader
    sets the model's gradient weight at each step, the model's hook asks whether a step of
    the loader is in progress."""

    loader: Optional["PlanFollowingLoader"] = None  # prepare_data_loader's (training/data/loader.py)
    model: Optional["PreparedModel"] = None  # prepare_model's (training/gradients/model_prep.py)

    def copy_state_to_left_out_ranks(self) -> None:
        """Collective while a rank is behind rank 0 (see the training loader's method of
        that name); nothing to do without a training loader."""
        if self.loader is not None:
            self.loader.copy_state_to_left_out_ranks()


@dataclass(frozen=True)
class WorkerSession:
    """This worker's run: fixed for the worker group's life, except what the loop makes
    (``parts``) and the count of checkpoints reported at each step (``checkpoints_at``)."""

    settings: WorkerSettings
    identity: WorkerIdentity
    store: Any
    planner: Any
    recorder: StepRecorder
    restored: Optional[dict] = None  # hetero_ray's part of the checkpoint this group resumes from
    speeds: Optional[SpeedSchedule] = None
    emulator: Optional[SpeedEmulator | CurveEmulator] = None  # pads busy time when speeds or devices are emulated
    rank_fits: Optional[list] = None  # each rank's warm-up line, for the group's first plan
    current_step: CurrentStep = field(default_factory=CurrentStep)  # read by the model's hooks
    # Ranks left out and brought back (training/rank/rejoin.py): each plan's group of ranks in,
    # made when all ranks agree on the plan.
    groups: Optional[Groups] = None
    parts: LoopParts = field(default_factory=LoopParts)
    checkpoints_at: dict[int, int] = field(default_factory=dict)  # global step → checkpoints reported there
    # Ray Train's worker API (report, get_checkpoint); in-process runs without Ray give their own.
    ray_train: Any = ray.train
    data_feeds: dict[str, Any] = field(default_factory=dict)  # dataset name → its feed (runtime/data_feed.py)
    shards: dict[str, Any] = field(default_factory=dict)  # get_dataset_shard's, made once per name

    @property
    def restored_position(self) -> Position:
        return _position_of(self.restored)

    @property
    def restored_plan(self) -> Optional[Plan]:
        plan = (self.restored or {}).get("plan")
        return Plan.from_dict(plan) if plan else None

    def log(self, message: str) -> None:
        _say(self.identity, message)

    # --- the plan protocol -------------------------------------------------------------

    def agree_on_plan(self, current: Optional[Plan], position: Position,
                      caps: Optional[list[Optional[int]]] = None) -> tuple[Plan, Optional[list[Optional[int]]]]:
        """Collective: rank 0 fetches the planner's plan for ``position``; all ranks get it,
        with each rank's memory cap (largest batch its device holds; None: unknown).

        ``current`` is the plan in force before ``position`` (None for the group's first);
        ``caps``: the caps agreed with it, which hold while the planner knows none.
        """
        identity, batch = self.identity, self.settings.global_batch_size
        proposal, agreed = None, caps
        restored = self.restored_plan
        if identity.rank == 0:
            fallback = current
            if fallback is None and restored is not None and restored.num_workers == identity.num_workers:
                fallback = restored
            if current is None and restored is not None:
                self.planner.resume_from.remote(restored.to_dict())
            ranks = RankFacts(identity.rank_node_ids, identity.rank_device_kinds,
                              fits=self.rank_fits if current is None else None,
                              cpus=identity.rank_cpus if current is None else None)
            model = self.parts.model
            proposal, known = fetch_plan(self.planner, identity.num_workers, batch, position.global_step, fallback,
                                         _plan_fetch_timeout_s(), ranks, wait_s=self.settings.first_plan_wait_s,
                                         note=self.log, micro_batches=model is not None and model.micro_batching.cuts)
            if known is not None:  # no answer, or none known: the caps agreed before still hold
                agreed = known
            if proposal is None:  # no planner and nothing restored: equal shares keep training going
                version = restored.version + 1 if restored is not None else 0
                proposal = Plan(version, tuple(equal_split(batch, identity.num_workers)),
                                "fallback: planner unreachable")
        plan, agreed = broadcast_plan(proposal, identity.rank, identity.num_workers, identity.collective_device,
                                      agreed)
        if self.groups is not None:
            self.groups.for_plan(plan)  # collective: every rank makes the group of the ranks in, in plan order
        if identity.rank == 0 and current is None:  # the group's first plan: the balancer starts from it
            self.planner.begin_attempt.remote(identity.attempt, identity.num_workers, position.global_step,
                                              end_global_step=self.settings.end_global_step)
        if identity.rank == 0 and (current is None or plan.version != current.version):
            self.store.add_plan.remote({
                "plan_version": plan.version, "first_global_step": position.global_step,
                "epoch": position.epoch, "step": position.step, "attempt": identity.attempt,
                "num_workers": plan.num_workers, "global_batch_size": plan.global_batch_size,
                "local_batch_sizes": list(plan.local_batch_sizes), "reason": plan.reason,
                "wall_time": time.time(), "check_after_steps": plan.check_after_steps or None,
            })
            if current is not None:
                self.log(f"global step {position.global_step}: plan {current} → {plan} ({plan.reason})")
        return plan, agreed

    def flush_records(self, timeout_s: float = 30.0) -> None:
        """Waits until every step row recorded so far is in the metrics store."""
        self.recorder.close(timeout_s)


_CURRENT: Optional[WorkerSession] = None  # this process's session; set by the entry wrapper


def current(what: str) -> WorkerSession:
    """The running session; ``what`` names the API call, for the message when there is none."""
    if _CURRENT is None:
        raise UserError(
            f"hetero_ray.train.{what} was called outside a hetero_ray run: call it inside the "
            "train_loop_per_worker function that HeteroTrainer(...).fit() runs on every worker"
        )
    return _CURRENT


def start(settings: WorkerSettings, restored: Optional[dict]) -> WorkerSession:
    """Collective: registers the worker-group start, and builds this worker's session."""
    global _CURRENT
    context = ray.train.get_context()
    local_rank = context.get_local_rank()
    device = _device(settings, local_rank)
    store = _run_actor(settings, METRICS_STORE_ROLE)
    planner = _run_actor(settings, PLANNER_ROLE)
    # Made before the registration and the warm-up: its first rows go out at the first step.
    recorder = StepRecorder(store, env_float(RECORD_FLUSH_INTERVAL_S_ENV_VAR, DEFAULT_RECORD_FLUSH_INTERVAL_S),
                            extra_sinks=[planner])
    position = _position_of(restored)
    identity = register_attempt(
        store, rank=context.get_world_rank(), num_workers=context.get_world_size(),
        local_rank=local_rank, device=device, node_id=ray.get_runtime_context().get_node_id(),
        global_step=position.global_step,
    )
    speeds = _speed_schedule(settings, identity)
    synchronize = torch.cuda.synchronize if identity.device.type == "cuda" else None
    emulator = None
    if speeds is not None:
        emulator = SpeedEmulator(synchronize)
    where = "from the start" if position.global_step == 0 else (
        f"resuming at global step {position.global_step} (epoch {position.epoch}, step {position.step})")
    _say(identity, f"attempt {identity.attempt}: {identity.num_workers} workers, {where}")
    if settings.emulate_devices:
        speeds = speeds or SpeedSchedule([1.0] * identity.num_workers)
        emulator = _curve_emulator(settings, identity, synchronize)
        if identity.rank == 0:  # the emulated devices a run compares against: in its files
            store.note_attempt.remote(identity.attempt, {"emulated_devices_factor": emulator.factor})
    rank_fits = None
    if speeds is not None and settings.warmup_model is not None:
        rank_fits = _warm_up(settings, identity, emulator, speeds.speed(identity.rank, position.global_step))
    elif settings.device_mode != "cpu" and settings.warmup_model is not None and "cpu" in identity.rank_device_kinds:
        rank_fits = _warm_up_cpu_ranks(settings, identity)
    session = WorkerSession(
        settings=settings, identity=identity, store=store, planner=planner, recorder=recorder, restored=restored,
        speeds=speeds, emulator=emulator, rank_fits=rank_fits, groups=Groups(identity.num_workers),
        data_feeds={name: _run_actor(settings, data_feed_role(name)) for name in settings.data_feeds or ()},
    )
    if isinstance(emulator, CurveEmulator):  # the loader begins a step before it knows the share
        parts = session.parts
        emulator.local_batch_size = lambda: parts.loader.local_batch_size if parts.loader is not None else None
    _CURRENT = session
    return session


def stop() -> None:
    """The user's loop returned (or failed): the last rows reach the store; the slot is freed."""
    global _CURRENT
    session, _CURRENT = _CURRENT, None
    if session is not None:
        if session.parts.loader is not None:
            session.parts.loader.close()
        try:
            session.flush_records()
        except Exception as e:  # noqa: BLE001 - a failing loop's own error matters more
            logger.warning("last step rows not confirmed by the metrics store (%s)", type(e).__name__)


def _device(settings: WorkerSettings, local_rank: int) -> torch.device:
    from hetero_ray.training.rank.devices import apply_device_choice, choose_device, node_device_label

    choice = choose_device(settings.device_mode, node_device_label() if settings.device_mode == "mixed" else None,
                           local_rank, torch.cuda.device_count())
    if choice.warning:
        logger.warning(choice.warning)
    return apply_device_choice(choice)


def _speed_schedule(settings: WorkerSettings, identity: WorkerIdentity) -> Optional[SpeedSchedule]:
    """The emulated speeds (None when there are none), scaled to fit the cores of each node."""
    if not (settings.emulate_speeds or settings.speed_changes):
        return None
    changes = [SpeedChange(**c) for c in settings.speed_changes or []]
    speeds = SpeedSchedule(settings.emulate_speeds or [1.0] * identity.num_workers, changes)
    if settings.emulate_devices:  # the pads sleep, the real steps run at full speed: the curves' factor covers it
        return speeds
    speeds.scale = fit_to_cores(speeds, identity.rank_node_ids,
                                [cores if kind == "cpu" else None
                                 for kind, cores in zip(identity.rank_device_kinds, identity.rank_cpu_cores)])
    if speeds.scale < 1.0:
        _say(identity, f"emulated speeds × {speeds.scale:.2f}: the CPU ranks of a node share its cores, "
                       "so all speeds are scaled until they fit (the ratios between ranks stay as asked)")
    return speeds


def _curve_emulator(settings: WorkerSettings, identity: WorkerIdentity, synchronize) -> CurveEmulator:
    """Collective: every rank times the model's real step (no pad, all ranks at once), and
    all agree on the one factor k that keeps every curve within this machine's speed (see
    training/timing/curve_emulation.py) — unless the run pinned k (``emulate_devices_factor``)."""
    from hetero_ray.planning.cost_model import curve_busy_time_s
    from hetero_ray.training.timing.warmup import gather_fits, measure_rank

    curves = [DeviceCurve.from_dict(c) for c in settings.emulate_devices]
    if settings.emulate_devices_factor is not None:
        _say(identity, f"emulated devices: every curve × {settings.emulate_devices_factor:.3g}, as the run pinned it")
        return CurveEmulator(curves[identity.rank], settings.emulate_devices_factor, synchronize=synchronize)
    if settings.warmup_model is None:
        raise UserError("emulated devices need a model to time before step 0 (HeteroConfig.profile_model)")
    started = time.perf_counter()
    real = gather_fits(measure_rank(settings.warmup_model, identity.device, list(settings.warmup_batch_sizes),
                                    SpeedEmulator(), 1.0), identity.num_workers)
    ratios = [None if fit is None else rank_ratio(
        lambda b, f=fit: float(curve_busy_time_s(f["alpha_s"], f["beta_s_per_sample"], f["floor_s"], b)),
        curve, settings.global_batch_size) for fit, curve in zip(real, curves)]
    factor = common_factor(ratios)
    shown = ", ".join("?" if r is None else f"{r:.3g}" for r in ratios)
    _say(identity, f"emulated devices: real ÷ curve by rank {shown} (timed in {time.perf_counter() - started:.1f} s); "
                   f"every curve × {factor:.3g}, so no rank must run faster than this machine")
    return CurveEmulator(curves[identity.rank], factor, synchronize=synchronize)


def _warm_up(settings: WorkerSettings, identity: WorkerIdentity, emulator: SpeedEmulator, speed: float) -> list:
    """Collective: every rank measures its own step under its emulated ``speed`` (see
    training/timing/warmup.py); returns every rank's line."""
    from hetero_ray.training.timing.warmup import gather_fits, measure_rank, until_all_ranks_done

    started = time.perf_counter()
    fit = measure_rank(settings.warmup_model, identity.device, list(settings.warmup_batch_sizes), emulator, speed,
                       hold=until_all_ranks_done)
    rank_fits = gather_fits(fit, identity.num_workers)
    lines = ", ".join("?" if f is None else f"{f['beta_s_per_sample'] * 1e3:.3g}" for f in rank_fits)
    _say(identity, f"warm-up: each rank timed its own step in {time.perf_counter() - started:.1f} s; "
                   f"ms per sample by rank: {lines}")
    return rank_fits


def _warm_up_cpu_ranks(settings: WorkerSettings, identity: WorkerIdentity) -> list:
    """Collective, on a cluster with GPUs: the ranks that train on a CPU time the model's
    step themselves (their nodes are profiled only after the first plan: see
    runtime/node_profiling.py); the GPU ranks' lines come from their GPUs' profiles."""
    from hetero_ray.training.timing.warmup import gather_fits, measure_rank

    started = time.perf_counter()
    fit = None
    if identity.device.type != "cuda":
        fit = measure_rank(settings.warmup_model, identity.device, list(settings.warmup_batch_sizes),
                           SpeedEmulator(), 1.0)
    rank_fits = gather_fits(fit, identity.num_workers)
    lines = ", ".join(f"rank {r} {f['beta_s_per_sample'] * 1e3:.3g}" for r, f in enumerate(rank_fits) if f)
    _say(identity, f"warm-up: the CPU ranks timed their own step in {time.perf_counter() - started:.1f} s; "
                   f"ms per sample: {lines or 'none measured'}")
    return rank_fits


def _position_of(restored: Optional[dict]) -> Position:
    """Where a group resumes: the restored checkpoint's next step, or the very start."""
    return Position.from_dict(restored["position"]) if restored is not None else Position(0, 0, 0)


def _say(identity: WorkerIdentity, message: str) -> None:
    # One line per group, not one per rank.
    if identity.rank == 0:
        print(f"[hetero_ray] {message}", flush=True)


def _run_actor(settings: WorkerSettings, role: str):
    """One of the run's actors, which the driver started under the experiment's name."""
    return ray.get_actor(actor_name(settings.experiment_name, role), namespace=RAY_NAMESPACE)


def _plan_fetch_timeout_s() -> float:
    return env_float(PLAN_FETCH_TIMEOUT_S_ENV_VAR, DEFAULT_PLAN_FETCH_TIMEOUT_S)

