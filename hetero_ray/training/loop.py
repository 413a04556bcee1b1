"""The training loop that runs in every Ray Train worker.

Read it top to bottom: set up (data, model, checkpoint, DDP with the weighted hook),
agree on an attempt id and a plan, then for every global step: take this rank's piece of
the window, forward, backward (the hook weights and all-reduces), optimiser step, record
timings. Plans change only at rebalance points, where all ranks agree together; epochs
end with evaluation and a checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

import ray
import ray.train
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hetero_ray.config import TrainConfig
from hetero_ray.constants import (
    BALANCER_ROLE, DEFAULT_PLAN_FETCH_TIMEOUT_S, DEFAULT_RECORD_FLUSH_INTERVAL_S, METRICS_STORE_ROLE,
    PLAN_FETCH_TIMEOUT_S_ENV_VAR, RECORD_FLUSH_INTERVAL_S_ENV_VAR, SCHEDULER_ROLE, env_float,
)
from hetero_ray.plan import Plan, equal_split
from hetero_ray.runtime.actors import get_actor
from hetero_ray.sampler import GlobalSampler, Position
from hetero_ray.training import timing
from hetero_ray.training.allocator import keep_freed_memory
from hetero_ray.training.batchnorm import convert_batchnorm, has_batchnorm
from hetero_ray.training.checkpointing import (
    TrainingState, capture_rng, load_state, restore_rng, run_fingerprint, save_state,
)
from hetero_ray.training.data import load_dataset
from hetero_ray.training.emulation import SpeedChange, SpeedEmulator, SpeedSchedule, fit_to_cores
from hetero_ray.training.evaluation import evaluate
from hetero_ray.training.models import build_model, compute_loss
from hetero_ray.training.optim import make_lr_scheduler, make_optimizer, total_steps
from hetero_ray.training.plan_sync import broadcast_plan, fetch_plan
from hetero_ray.training.recorder import StepRecorder
from hetero_ray.training.resource_sampler import ResourceSampler
from hetero_ray.metrics.gauges import RankGauges
from hetero_ray.training.weighting import WeightedAllReduceState, rank_weight, weighted_allreduce_hook

logger = logging.getLogger("hetero_ray.worker")


@dataclass
class WorkerContext:
    """What one worker knows about itself and its run; built once per worker-group start."""

    config: TrainConfig
    rank: int
    num_workers: int
    device: torch.device
    node_id: str
    store: "ray.actor.ActorHandle"
    scheduler: "ray.actor.ActorHandle"
    balancer: "ray.actor.ActorHandle"
    attempt: int = -1
    rank_node_ids: Optional[list[str]] = None  # every rank's node, gathered at attempt start
    rank_device_kinds: Optional[list[str]] = None
    run_steps: int = 0  # the run ends before this global step
    speeds: Optional[SpeedSchedule] = None
    timeline: Optional[timing.StepTimeline] = None
    epoch_loss_sum: float = 0.0  # Σ loss·b over this epoch's steps, this rank
    epoch_samples: int = 0
    epoch_started: float = field(default_factory=time.time)


def train_loop_per_worker(loop_config: dict) -> None:
    """Entry point given to ``TorchTrainer``; ``loop_config`` comes from the driver."""
    config = TrainConfig.from_dict(loop_config["train"])
    _quiet_ray_train_reports()
    keep_freed_memory()  # no page faults through the same activations every step
    train_context = ray.train.get_context()
    ctx = WorkerContext(
        config=config,
        rank=train_context.get_world_rank(),
        num_workers=train_context.get_world_size(),
        device=_worker_device(loop_config["device_mode"]),
        node_id=ray.get_runtime_context().get_node_id(),
        store=get_actor(config.experiment_name, METRICS_STORE_ROLE),
        scheduler=get_actor(config.experiment_name, SCHEDULER_ROLE),
        balancer=get_actor(config.experiment_name, BALANCER_ROLE),
    )
    if config.emulate_speeds or loop_config.get("speed_changes"):
        changes = [SpeedChange(**c) for c in loop_config.get("speed_changes") or []]
        ctx.speeds = SpeedSchedule(config.emulate_speeds or [1.0] * ctx.num_workers, changes)

    # --- data, model, optimiser: functions of the seed and the global batch only
    data = load_dataset(config.dataset, data_dir=config.data_dir, num_samples=config.num_samples,
                        eval_samples=config.eval_samples, seed=config.seed, download=False,
                        verify_checksums=config.verify_checksums)
    sampler = GlobalSampler(len(data.train), config.batch_size, config.seed, config.drop_last)
    run_steps = ctx.run_steps = total_steps(config.epochs, sampler.steps_per_epoch, config.max_steps)
    torch.manual_seed(config.seed)
    model = build_model(config.model, data.spec).to(ctx.device)
    optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr)
    lr_scheduler = make_lr_scheduler(config.lr_schedule, optimizer, run_steps)

    # --- resume: exactly the step after the last checkpoint
    position, restored_plan = Position(0, 0, 0), None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = load_state(directory, run_fingerprint(config))
        model.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        lr_scheduler.load_state_dict(state.lr_scheduler)
        restore_rng(state.rng)
        position, restored_plan = state.position, state.plan
        if ctx.rank == 0:  # the epoch's running totals, gathered on rank 0 at save time
            ctx.epoch_loss_sum = state.extra.get("epoch_loss_sum", 0.0)
            ctx.epoch_samples = state.extra.get("epoch_samples", 0)

    hook_state = WeightedAllReduceState()
    if has_batchnorm(model):  # statistics of the global batch, as one device computes them
        model = convert_batchnorm(model, hook_state)
    ddp_model = DistributedDataParallel(
        model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None
    )
    ddp_model.register_comm_hook(hook_state, weighted_allreduce_hook)
    emulator = None
    if ctx.speeds is not None:
        synchronize = torch.cuda.synchronize if ctx.device.type == "cuda" else None
        emulator = SpeedEmulator(synchronize)
    hook_state.on_bucket_ready = timing.BucketClock(lambda: ctx.timeline, emulator)

    ctx.attempt = _begin_attempt(ctx, position)
    _log_rank0(ctx, _start_message(position, run_steps, ctx))
    resources = ResourceSampler(ctx.device, interval_steps=config.profile_interval)
    gauges = RankGauges(config.experiment_name)
    recorder = StepRecorder(ctx.store, env_float(RECORD_FLUSH_INTERVAL_S_ENV_VAR, DEFAULT_RECORD_FLUSH_INTERVAL_S),
                            extra_sinks=[ctx.balancer])
    plan_fetch_timeout_s = env_float(PLAN_FETCH_TIMEOUT_S_ENV_VAR, DEFAULT_PLAN_FETCH_TIMEOUT_S)

    plan: Optional[Plan] = None
    while position.global_step < run_steps:
        # --- rebalance point: every rank applies the same plan from this step on
        if plan is None or position.global_step % config.rebalance_interval == 0:
            plan = _agree_on_plan(ctx, plan, restored_plan, position, plan_fetch_timeout_s)
            restored_plan = None

        row, sample_ids = _train_step(ctx, ddp_model, optimizer, lr_scheduler, hook_state,
                                      emulator, data, sampler, position, plan)
        row.update(resources.maybe_sample(position.global_step))
        gauges.update(row)
        recorder.record(row, sample_ids)
        if row["loss"] is not None:
            ctx.epoch_loss_sum += row["loss"] * row["local_batch_size"]
            ctx.epoch_samples += row["local_batch_size"]

        next_position = sampler.next_position(position)
        epoch_ended = next_position.epoch != position.epoch
        run_ended = next_position.global_step >= run_steps
        if epoch_ended or run_ended:
            _end_epoch(ctx, model, data, plan, position)
        position = next_position
        # The last step always ends with a checkpoint: the driver takes the final model from it.
        if epoch_ended or run_ended or position.global_step % config.checkpoint_every == 0:
            _save_checkpoint(ctx, model, optimizer, lr_scheduler, position, plan)

    resources.close()
    recorder.close()
    _log_rank0(ctx, f"finished at global step {position.global_step}")


def _train_step(ctx: WorkerContext, ddp_model, optimizer, lr_scheduler, hook_state,
                emulator: Optional[SpeedEmulator], data, sampler: GlobalSampler,
                position: Position, plan: Plan) -> tuple[dict, Optional[dict]]:
    """One global step on this rank; returns the step row and, if asked, its sample ids."""
    ctx.timeline = timeline = timing.StepTimeline(ctx.device)
    timeline.mark(timing.STEP_START)
    if emulator is not None:
        emulator.begin_step(ctx.speeds.speed(ctx.rank, position.global_step), time.perf_counter())

    window_size = sampler.window_size(position.step)
    indices = sampler.indices(position.epoch, position.step, plan, ctx.rank)
    local_batch_size = len(indices)
    if local_batch_size == 0:
        # A short last window can leave a rank without samples. It must still enter the
        # all-reduce; it runs one sample of the window with weight 0, contributing nothing.
        start, _ = sampler.window(position.step)
        indices = sampler.permutation(position.epoch)[start:start + 1]
    inputs, targets = data.train.batch(indices)
    if ctx.device.type == "cuda":
        timeline.mark(timing.HOST_BATCH_READY)
    inputs, targets = inputs.to(ctx.device, non_blocking=True), targets.to(ctx.device, non_blocking=True)
    timeline.mark(timing.DATA_READY)

    hook_state.weight = rank_weight(local_batch_size, window_size)
    loss = compute_loss(ddp_model(inputs), targets)
    timeline.mark(timing.FORWARD_DONE)
    loss.backward()  # hook: pad (emulation), mark last bucket, weighted all-reduce
    timeline.mark(timing.BACKWARD_DONE)
    if not timeline.has(timing.LAST_BUCKET_READY):
        timeline.mark(timing.LAST_BUCKET_READY)  # no bucket reached the hook (no gradients)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    lr_scheduler.step()
    timeline.mark(timing.STEP_DONE)
    timeline.synchronize()

    row = {
        "epoch": position.epoch, "step": position.step, "global_step": position.global_step,
        "rank": ctx.rank, "node_id": ctx.node_id, "attempt": ctx.attempt,
        "local_batch_size": local_batch_size, "global_batch_size": window_size,
        "plan_version": plan.version,
        "loss": float(loss.detach().item()) if local_batch_size > 0 else None,
        "lr": lr, "wall_time": time.time(),
        **timing.step_durations(timeline, emulator.padded_s if emulator else 0.0),
    }
    sample_ids = None
    if ctx.config.record_sample_ids:
        sample_ids = {
            "epoch": position.epoch, "step": position.step, "global_step": position.global_step,
            "rank": ctx.rank, "attempt": ctx.attempt,
            "sample_indices": indices.tolist() if local_batch_size > 0 else [],
        }
    return row, sample_ids


def _agree_on_plan(ctx: WorkerContext, current: Optional[Plan], restored: Optional[Plan],
                   position: Position, timeout_s: float) -> Plan:
    """Collective: rank 0 fetches the scheduler's plan, all ranks get the same one."""
    proposal, caps = None, None
    if ctx.rank == 0:
        fallback = current
        if fallback is None and restored is not None and restored.num_workers == ctx.num_workers:
            fallback = restored
        if current is None and restored is not None:
            ctx.scheduler.resume_from.remote(restored.to_dict())
        proposal, caps = fetch_plan(ctx.scheduler, ctx.num_workers, ctx.config.batch_size,
                              position.global_step, fallback, timeout_s,
                              ctx.rank_node_ids, ctx.rank_device_kinds)
        if proposal is None:  # no scheduler and nothing restored: equal shares keep training going
            version = restored.version + 1 if restored is not None else 0
            proposal = Plan(version, tuple(equal_split(ctx.config.batch_size, ctx.num_workers)),
                            "fallback: scheduler unreachable")
    plan = broadcast_plan(proposal, ctx.rank, ctx.num_workers, _collective_device(ctx))
    if ctx.rank == 0 and current is None:  # the group's first plan: the balancer starts from it
        ctx.balancer.begin_attempt.remote(ctx.attempt, ctx.num_workers, position.global_step, caps,
                                          end_global_step=ctx.run_steps)
    if ctx.rank == 0 and (current is None or plan.version != current.version):
        ctx.store.add_plan.remote({
            "plan_version": plan.version, "first_global_step": position.global_step,
            "epoch": position.epoch, "step": position.step, "attempt": ctx.attempt,
            "num_workers": plan.num_workers, "global_batch_size": plan.global_batch_size,
            "local_batch_sizes": list(plan.local_batch_sizes), "reason": plan.reason,
            "wall_time": time.time(),
        })
        if current is not None:
            _log_rank0(ctx, f"global step {position.global_step}: plan {current} → {plan} ({plan.reason})")
    return plan


def _begin_attempt(ctx: WorkerContext, position: Position) -> int:
    """Collective: rank 0 registers this worker-group start; all ranks learn its id."""
    attempt = torch.zeros(1, dtype=torch.int64, device=_collective_device(ctx))
    if ctx.rank == 0:
        attempt[0] = ray.get(ctx.store.begin_attempt.remote(position.global_step, ctx.num_workers))
    dist.broadcast(attempt, src=0)
    attempt_id = int(attempt.item())
    # Ranks are ordered by node, not by anything we chose: learn where each one runs.
    placement = [None] * ctx.num_workers
    dist.all_gather_object(placement, (ctx.node_id, "gpu" if ctx.device.type == "cuda" else "cpu", _cpu_cores()))
    ctx.rank_node_ids = [node_id for node_id, _, _ in placement]
    ctx.rank_device_kinds = [kind for _, kind, _ in placement]
    if ctx.speeds is not None:
        ctx.speeds.scale = fit_to_cores(ctx.speeds, ctx.rank_node_ids,
                                        [cores if kind == "cpu" else None for _, kind, cores in placement])
        if ctx.speeds.scale < 1.0:
            _log_rank0(ctx, f"emulated speeds × {ctx.speeds.scale:.2f}: the CPU ranks of a node share its cores, "
                            "so all speeds are scaled until they fit (the ratios between ranks stay as asked)")
    ctx.store.register_worker.remote({
        "rank": ctx.rank, "pid": os.getpid(), "node_id": ctx.node_id,
        "hostname": socket.gethostname(), "device": str(ctx.device), "attempt": attempt_id,
    })
    return attempt_id


def _end_epoch(ctx: WorkerContext, model, data, plan: Plan, position: Position) -> None:
    """Collective: evaluate, and rank 0 records the epoch."""
    results = evaluate(model, data.eval, plan, ctx.rank, ctx.device, ctx.epoch_loss_sum,
                       ctx.epoch_samples, ctx.config.is_text)
    elapsed = time.time() - ctx.epoch_started
    if ctx.rank == 0:
        row = {
            "epoch": position.epoch, "global_step": position.global_step, "attempt": ctx.attempt,
            **results, "epoch_time_s": elapsed,
            "samples_per_s": results["samples"] / elapsed if elapsed > 0 else None,
            "wall_time": time.time(),
        }
        ctx.store.add_epoch.remote(row)
        _log_rank0(ctx, (f"epoch {position.epoch} done: train loss {results['train_loss']:.4f}, "
                         f"eval {results['eval_metric_name']} {results['eval_metric']:.4f}"))
    ctx.epoch_loss_sum, ctx.epoch_samples, ctx.epoch_started = 0.0, 0, time.time()


def _save_checkpoint(ctx: WorkerContext, model, optimizer, lr_scheduler, position: Position,
                     plan: Plan) -> None:
    """Collective (``ray.train.report`` is a barrier): rank 0 writes, every rank reports."""
    metrics = {"epoch": position.epoch, "step": position.step, "global_step": position.global_step}
    _gather_epoch_totals_on_rank0(ctx)
    with tempfile.TemporaryDirectory(prefix="hetero_ray_ckpt_") as directory:
        checkpoint = None
        if ctx.rank == 0:
            save_state(directory, TrainingState(
                model=model.state_dict(), optimizer=optimizer.state_dict(),
                lr_scheduler=lr_scheduler.state_dict(), position=position, plan=plan,
                fingerprint=run_fingerprint(ctx.config), rng=capture_rng(),
                extra={"epoch_loss_sum": ctx.epoch_loss_sum, "epoch_samples": ctx.epoch_samples},
            ))
            _save_balancer_state(ctx, directory)
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        ray.train.report(metrics, checkpoint=checkpoint,
                         checkpoint_dir_name=f"checkpoint_{position.global_step:09d}")


def _save_balancer_state(ctx: WorkerContext, directory: str) -> None:
    """Rank 0: the balancer's state goes into the checkpoint, for a balancer that restarts."""
    from hetero_ray.runtime.balancer_actor import BALANCER_STATE_FILE

    try:
        state = ray.get(ctx.balancer.state_dict.remote(), timeout=5)
    except Exception as e:  # noqa: BLE001 - the checkpoint matters more than this part of it
        logger.warning("balancer state not saved with this checkpoint (%s)", type(e).__name__)
        return
    with open(os.path.join(directory, BALANCER_STATE_FILE), "w") as f:
        json.dump(state, f)


def _gather_epoch_totals_on_rank0(ctx: WorkerContext) -> None:
    """Moves the epoch's running loss totals to rank 0 (the sum over ranks is unchanged),
    so that rank 0's checkpoint carries them across a restart."""
    totals = torch.tensor([ctx.epoch_loss_sum, ctx.epoch_samples], dtype=torch.float64,
                          device=_collective_device(ctx))
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    loss_sum, samples = totals.tolist()
    ctx.epoch_loss_sum, ctx.epoch_samples = (loss_sum, int(samples)) if ctx.rank == 0 else (0.0, 0)


def _quiet_ray_train_reports() -> None:
    # Ray Train logs every report at INFO through a logger named after its file, which the
    # run's LoggingConfig does not reach; the driver's progress line says what matters.
    from ray.train.v2._internal.execution import context as train_context_module

    logging.getLogger(train_context_module.__file__).setLevel(logging.WARNING)


def _worker_device(mode: str) -> torch.device:
    from hetero_ray.training.devices import apply_device_choice, choose_device, node_device_label

    local_rank = ray.train.get_context().get_local_rank()
    choice = choose_device(mode, node_device_label() if mode == "mixed" else None, local_rank,
                           torch.cuda.device_count())
    if choice.warning:
        logger.warning(choice.warning)
    return apply_device_choice(choice)


def _collective_device(ctx: WorkerContext) -> torch.device:
    # NCCL only moves CUDA tensors; gloo takes CPU ones.
    return ctx.device if dist.get_backend() == "nccl" else torch.device("cpu")


def _start_message(position: Position, run_steps: int, ctx: WorkerContext) -> str:
    where = "from the start" if position.global_step == 0 else (
        f"resuming at global step {position.global_step} (epoch {position.epoch}, step {position.step})")
    return f"attempt {ctx.attempt}: {ctx.num_workers} workers, {run_steps} global steps, {where}"


def _cpu_cores() -> int:
    """Cores this process may run on (its affinity; the machine's count where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _log_rank0(ctx: WorkerContext, message: str) -> None:
    if ctx.rank == 0:
        print(f"[hetero_ray] {message}", flush=True)
