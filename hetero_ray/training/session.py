"""One worker's place in a hetero_ray run: who it is, whom it talks to, which plan is in force.

:class:`WorkerSession` is made once per worker-group start, before the user's
``train_loop_per_worker`` runs, by :func:`hetero_ray.training.entry.run_user_loop`. The
public functions of :mod:`hetero_ray.train` find it with :func:`current`; there is at most
one per process, and using the API outside a run says so instead of failing later.

What it owns:
- the identity (rank, world size, device, node, attempt id, every rank's node), fixed for
  the worker group's life;
- the handles of the run's actors (metrics store, planner);
- the plan protocol (:meth:`agree_on_plan`): at each rebalance point all ranks enter one
  broadcast and leave with rank 0's plan;
- the step recorder (rows reach the store in batches; :meth:`flush_records` waits for
  them, e.g. before a checkpoint that covers them is registered).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import ray
import ray.train
import torch
import torch.distributed as dist

from hetero_ray.constants import (
    DEFAULT_PLAN_FETCH_TIMEOUT_S, DEFAULT_RECORD_FLUSH_INTERVAL_S, METRICS_STORE_ROLE, PLAN_FETCH_TIMEOUT_S_ENV_VAR,
    PLANNER_ROLE, RAY_NAMESPACE, RECORD_FLUSH_INTERVAL_S_ENV_VAR, actor_name, env_float,
)
from hetero_ray.errors import UserError
from hetero_ray.planning.plan import Plan, equal_split
from hetero_ray.sampler import Position
from hetero_ray.training import timing
from hetero_ray.training.emulation import SpeedChange, SpeedEmulator, SpeedSchedule, fit_to_cores
from hetero_ray.training.plan_sync import broadcast_plan, fetch_plan
from hetero_ray.training.recorder import StepRecorder

logger = logging.getLogger("hetero_ray.worker")


@dataclass(frozen=True)
class WorkerSettings:
    """What the driver tells every worker about the run (sent in the loop config)."""

    experiment_name: str
    global_batch_size: int
    seed: int
    rebalance_interval: int
    device_mode: str  # gpu | cpu | mixed (see training/devices.py)
    record_sample_ids: bool = False
    profile_interval: int = 10
    emulate_speeds: Optional[list[float]] = None
    speed_changes: Optional[list[dict]] = None
    end_global_step: Optional[int] = None  # known for built-in runs; None for user loops
    # Under emulated speeds: the model recipe (a ProfileModel) each rank times itself with
    # before step 0, and at which batch sizes (see training/warmup.py).
    warmup_model: Any = None
    warmup_batch_sizes: Optional[list[int]] = None
    # Node profiles made beside the workers' start: how long rank 0 waits for them at the
    # first plan (see runtime/node_profiling.py).
    first_plan_wait_s: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "WorkerSettings":
        return cls(**d)


@dataclass
class WorkerSession:
    settings: WorkerSettings
    rank: int
    num_workers: int
    local_rank: int
    device: torch.device
    node_id: str
    store: Any
    planner: Any
    recorder: StepRecorder
    restored: Optional[dict] = None  # hetero_ray's part of the checkpoint this group resumes from
    attempt: int = -1
    rank_node_ids: list[str] = field(default_factory=list)
    rank_device_kinds: list[str] = field(default_factory=list)
    speeds: Optional[SpeedSchedule] = None
    emulator: Optional[SpeedEmulator] = None  # pads busy time when speeds are emulated
    loader: Any = None  # the one PlanFollowingLoader of this worker
    model_prepared: bool = False
    weight_state: Any = None  # the gradient hook's state, shared with BatchNorm layers
    timeline: Optional[timing.StepTimeline] = None  # of the step in progress; read by the hooks
    rank_fits: Optional[list] = None  # each rank's warm-up line, for the group's first plan
    checkpoints_at: dict[int, int] = field(default_factory=dict)  # global step → checkpoints reported there
    _step_notes: dict = field(default_factory=dict)

    def note_step(self, *, loss: Optional[float] = None, lr: Optional[float] = None) -> None:
        """The loss and learning rate of the step in progress, for its row in the steps
        table (the built-in loop knows them; a user's loop reports its own metrics)."""
        self._step_notes = {"loss": loss, "lr": lr}

    def take_step_notes(self) -> dict:
        notes, self._step_notes = self._step_notes, {}
        return {"loss": notes.get("loss"), "lr": notes.get("lr")}

    @property
    def collective_device(self) -> torch.device:
        # NCCL only moves CUDA tensors; gloo takes CPU ones.
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    @property
    def restored_position(self) -> Position:
        if self.restored is None:
            return Position(0, 0, 0)
        return Position.from_dict(self.restored["position"])

    @property
    def restored_plan(self) -> Optional[Plan]:
        plan = (self.restored or {}).get("plan")
        return Plan.from_dict(plan) if plan else None

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[hetero_ray] {message}", flush=True)

    # --- the plan protocol -------------------------------------------------------------

    def agree_on_plan(self, current: Optional[Plan], position: Position) -> Plan:
        """Collective: rank 0 fetches the planner's plan for ``position``; all ranks get it.

        ``current`` is the plan in force before ``position`` (None for the group's first).
        """
        proposal = None
        restored = self.restored_plan
        if self.rank == 0:
            fallback = current
            if fallback is None and restored is not None and restored.num_workers == self.num_workers:
                fallback = restored
            if current is None and restored is not None:
                self.planner.resume_from.remote(restored.to_dict())
            proposal = fetch_plan(self.planner, self.num_workers, self.settings.global_batch_size,
                                        position.global_step, fallback, _plan_fetch_timeout_s(),
                                        self.rank_node_ids, self.rank_device_kinds,
                                        self.rank_fits if current is None else None,
                                        wait_s=self.settings.first_plan_wait_s, note=self.log)
            if proposal is None:  # no planner and nothing restored: equal shares keep training going
                version = restored.version + 1 if restored is not None else 0
                proposal = Plan(version, tuple(equal_split(self.settings.global_batch_size, self.num_workers)),
                                "fallback: planner unreachable")
        plan = broadcast_plan(proposal, self.rank, self.num_workers, self.collective_device)
        if self.rank == 0 and current is None:  # the group's first plan: the balancer starts from it
            self.planner.begin_attempt.remote(self.attempt, self.num_workers, position.global_step,
                                              end_global_step=self.settings.end_global_step)
        if self.rank == 0 and (current is None or plan.version != current.version):
            self.store.add_plan.remote({
                "plan_version": plan.version, "first_global_step": position.global_step,
                "epoch": position.epoch, "step": position.step, "attempt": self.attempt,
                "num_workers": plan.num_workers, "global_batch_size": plan.global_batch_size,
                "local_batch_sizes": list(plan.local_batch_sizes), "reason": plan.reason,
                "wall_time": time.time(),
            })
            if current is not None:
                self.log(f"global step {position.global_step}: plan {current} → {plan} ({plan.reason})")
        return plan

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
    """Collective: builds this worker's session and registers the worker-group start."""
    global _CURRENT
    from hetero_ray.training.devices import apply_device_choice, choose_device, node_device_label

    context = ray.train.get_context()
    local_rank = context.get_local_rank()
    choice = choose_device(settings.device_mode, node_device_label() if settings.device_mode == "mixed" else None,
                           local_rank, torch.cuda.device_count())
    if choice.warning:
        logger.warning(choice.warning)
    store = _run_actor(settings, METRICS_STORE_ROLE)
    planner = _run_actor(settings, PLANNER_ROLE)
    session = WorkerSession(
        settings=settings,
        rank=context.get_world_rank(),
        num_workers=context.get_world_size(),
        local_rank=local_rank,
        device=apply_device_choice(choice),
        node_id=ray.get_runtime_context().get_node_id(),
        store=store,
        planner=planner,
        recorder=StepRecorder(store, env_float(RECORD_FLUSH_INTERVAL_S_ENV_VAR, DEFAULT_RECORD_FLUSH_INTERVAL_S),
                              extra_sinks=[planner]),
        restored=restored,
    )
    if settings.emulate_speeds or settings.speed_changes:
        changes = [SpeedChange(**c) for c in settings.speed_changes or []]
        session.speeds = SpeedSchedule(settings.emulate_speeds or [1.0] * session.num_workers, changes)
        session.emulator = SpeedEmulator(torch.cuda.synchronize if session.device.type == "cuda" else None)
    _begin_attempt(session)
    if session.speeds is not None and settings.warmup_model is not None:
        _warm_up(session)
    _CURRENT = session
    return session


def stop() -> None:
    """The user's loop returned (or failed): the last rows reach the store; the slot is freed."""
    global _CURRENT
    session, _CURRENT = _CURRENT, None
    if session is not None:
        if session.loader is not None:
            session.loader.close()
        try:
            session.flush_records()
        except Exception as e:  # noqa: BLE001 - a failing loop's own error matters more
            logger.warning("last step rows not confirmed by the metrics store (%s)", type(e).__name__)


def _begin_attempt(session: WorkerSession) -> None:
    """Collective: rank 0 registers this worker-group start; all ranks learn its id and
    where every rank runs (ranks are ordered by node, not by anything we chose)."""
    position = session.restored_position
    attempt = torch.zeros(1, dtype=torch.int64, device=session.collective_device)
    if session.rank == 0:
        attempt[0] = ray.get(session.store.begin_attempt.remote(position.global_step, session.num_workers))
    dist.broadcast(attempt, src=0)
    session.attempt = int(attempt.item())
    placement: list = [None] * session.num_workers
    kind = "gpu" if session.device.type == "cuda" else "cpu"
    dist.all_gather_object(placement, (session.node_id, kind, _cpu_cores()))
    session.rank_node_ids = [node_id for node_id, _, _ in placement]
    session.rank_device_kinds = [kind for _, kind, _ in placement]
    if session.speeds is not None:
        session.speeds.scale = fit_to_cores(session.speeds, session.rank_node_ids,
                                            [cores if k == "cpu" else None for _, k, cores in placement])
        if session.speeds.scale < 1.0:
            session.log(f"emulated speeds × {session.speeds.scale:.2f}: the CPU ranks of a node share its cores, "
                        "so all speeds are scaled until they fit (the ratios between ranks stay as asked)")
    session.store.register_worker.remote({
        "rank": session.rank, "pid": os.getpid(), "node_id": session.node_id,
        "hostname": socket.gethostname(), "device": str(session.device), "attempt": session.attempt,
    })
    where = "from the start" if position.global_step == 0 else (
        f"resuming at global step {position.global_step} (epoch {position.epoch}, step {position.step})")
    session.log(f"attempt {session.attempt}: {session.num_workers} workers, {where}")


def _warm_up(session: WorkerSession) -> None:
    """Collective: every rank measures its own step under its emulated speed (see
    training/warmup.py); all learn every rank's line."""
    from hetero_ray.training.warmup import gather_fits, measure_rank

    settings = session.settings
    started = time.perf_counter()
    speed = session.speeds.speed(session.rank, session.restored_position.global_step)
    fit = measure_rank(settings.warmup_model, session.device, list(settings.warmup_batch_sizes), session.emulator,
                       speed)
    session.rank_fits = gather_fits(fit, session.num_workers)
    lines = ", ".join("?" if f is None else f"{f['beta_s_per_sample'] * 1e3:.3g}" for f in session.rank_fits)
    session.log(f"warm-up: each rank timed its own step in {time.perf_counter() - started:.1f} s; "
                f"ms per sample by rank: {lines}")


def _run_actor(settings: WorkerSettings, role: str):
    """One of the run's actors, which the driver started under the experiment's name."""
    return ray.get_actor(actor_name(settings.experiment_name, role), namespace=RAY_NAMESPACE)


def _plan_fetch_timeout_s() -> float:
    return env_float(PLAN_FETCH_TIMEOUT_S_ENV_VAR, DEFAULT_PLAN_FETCH_TIMEOUT_S)


def _cpu_cores() -> int:
    """Cores this process may run on (its affinity; the machine's count where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
