"""The built-in job: one of the five models on one of the four datasets, trained through the
public API like any user's loop.

``hetero-ray train`` and ``jobs/train.py`` run this function inside a worker session
(:func:`hetero_ray.training.rank.entry.run_user_loop`), exactly as ``HeteroTrainer`` runs a
user's ``train_loop_per_worker``: :func:`hetero_ray.train.prepare_model` gives the model
its gradient weighting, busy-time clock and exact BatchNorm,
:func:`hetero_ray.train.prepare_data_loader` hands out this rank's piece of each global
step under the plan in force (cut by :func:`hetero_ray.train.micro_batches` where it is past
the rank's memory cap), and :func:`hetero_ray.train.report` checkpoints. What the
built-in job adds: its own checkpoint file (model, optimiser, LR schedule, random state,
the epoch's running totals), an evaluation at the end of every epoch, and each step's
loss and learning rate in the steps table.

Read it top to bottom: build, restore, then per epoch: the steps (forward, backward,
optimiser step), checkpoints every ``--checkpoint-every`` steps, evaluation, and a
checkpoint at the end of the epoch and of the run.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any, Optional

import ray.train
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hetero_ray.train
from hetero_ray.builtin.checkpointing import (
    TrainingState, capture_rng, load_state, restore_rng, run_fingerprint, save_state,
)
from hetero_ray.builtin import optim
from hetero_ray.builtin.config import TrainConfig
from hetero_ray.builtin.data import DatasetBundle, as_batch, load_dataset
from hetero_ray.builtin.epoch_totals import EpochTotals
from hetero_ray.builtin.evaluation import evaluate
from hetero_ray.builtin.models import build_model, compute_loss
from hetero_ray.builtin.optim import make_lr_scheduler, make_optimizer
from hetero_ray.training.data.loader import PlanFollowingLoader
from hetero_ray.training.gradients.precision import Precision
from hetero_ray.training.rank import session as worker_session
from hetero_ray.training.rank.current_step import StepNotes
from hetero_ray.training.rank.identity import WorkerIdentity
from hetero_ray.training.rank.loop_report import check_loss_is_finite


GRAD_SCALER_KEY = "grad_scaler"  # fp16's loss scale and its growth tracker, in the checkpoint's extra


@dataclass(frozen=True)
class _Job:
    """The built-in job's parts on this worker, made once and fixed for the run."""

    config: TrainConfig
    data: DatasetBundle
    model: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    loader: PlanFollowingLoader
    precision: Precision
    scaler: Optional[torch.amp.GradScaler]  # fp16 only


def train_loop_per_worker(loop_config: dict) -> None:
    """The built-in job on every worker; ``loop_config["train"]`` is the run's TrainConfig."""
    config = TrainConfig.from_dict(loop_config["train"])
    session = worker_session.current("the built-in loop")

    # --- data, model, optimiser: functions of the seed and the global batch only
    data = load_dataset(config.dataset, data_dir=config.data_dir, num_samples=config.num_samples,
                        eval_samples=config.eval_samples, seed=config.seed, download=False,
                        verify_checksums=config.verify_checksums)
    run_steps = optim.run_steps(config, len(data.train))
    torch.manual_seed(config.seed)
    model = hetero_ray.train.prepare_model(build_model(config.model, data.spec))
    optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr)
    lr_scheduler = make_lr_scheduler(config.lr_schedule, optimizer, run_steps)
    loader = hetero_ray.train.prepare_data_loader(data.train, collate_fn=as_batch, drop_last=config.drop_last)
    precision = Precision.named(config.precision, session.identity.device)
    job = _Job(config, data, model, optimizer, lr_scheduler, loader, precision, precision.make_scaler())

    # --- resume: the loader is already at the step after the checkpoint
    saved_totals: dict = {}
    checkpoint = hetero_ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = load_state(directory, run_fingerprint(config))
        model.module.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        lr_scheduler.load_state_dict(state.lr_scheduler)
        restore_rng(state.rng)
        saved_totals = state.extra
        if job.scaler is not None and GRAD_SCALER_KEY in state.extra:
            job.scaler.load_state_dict(state.extra[GRAD_SCALER_KEY])

    session.log(f"{run_steps} global steps in this run")
    totals = EpochTotals.from_checkpoint(saved_totals, with_sums=session.identity.rank == 0)
    while loader.position.global_step < run_steps:
        epoch = loader.epoch
        for inputs, targets in loader:
            step = loader.position
            notes = _train_step(job, inputs, targets)
            if not session.settings.allow_non_finite_loss:
                check_loss_is_finite(notes.loss, step.global_step, session.identity.rank)
            session.current_step.note(notes)  # for the step's row, written when the loader records it
            totals = totals.plus(notes.loss, loader.local_batch_size)
            next_global_step = step.global_step + 1
            if next_global_step >= run_steps:
                break
            if next_global_step % config.checkpoint_every == 0 and step.step + 1 < loader.sampler.steps_per_epoch:
                totals = _save_checkpoint(session, job, totals)
        # The epoch ended, or the run did: evaluate, and always checkpoint (the driver
        # takes the final model from the last checkpoint).
        loader.finish_step()  # the last step's row, before evaluation time could count in it
        totals = _end_epoch(session, job, totals, epoch)
        totals = _save_checkpoint(session, job, totals)
    session.log(f"finished at global step {loader.position.global_step}")


def _train_step(job: _Job, inputs, targets) -> StepNotes:
    """One optimiser step on this rank's piece of the global batch; returns the step's
    loss and learning rate for its row (no loss where the rank held no sample).

    A piece past the rank's memory cap is trained as micro-batches (one all-reduce, at
    the last one's backward: training/gradients/micro_batches.py); the step's loss is then their
    mean weighted by size, the mean over the piece."""
    loss_sum, samples = None, 0
    for micro_inputs, micro_targets in hetero_ray.train.micro_batches((inputs, targets)):
        with job.precision.autocast():
            loss = compute_loss(job.model(micro_inputs), micro_targets)
        if job.scaler is None:
            loss.backward()  # the hook weights by b_i / B and all-reduces (at the last micro-batch)
        else:  # fp16: every rank scales by the same factor and skips the same steps (training/gradients/precision.py)
            job.scaler.scale(loss).backward()
        weighted = loss.detach().float() * len(micro_targets)  # summed on the device: one sync per step
        loss_sum = weighted if loss_sum is None else loss_sum + weighted
        samples += len(micro_targets)
    lr = job.optimizer.param_groups[0]["lr"]
    if job.scaler is None:
        job.optimizer.step()
    else:
        job.scaler.step(job.optimizer)
        job.scaler.update()
    job.optimizer.zero_grad(set_to_none=True)
    job.lr_scheduler.step()
    # A probe (the plan leaves this rank out) or a short window's one sample: weight 0, no loss of the run's.
    return StepNotes(loss=None if hetero_ray.train.is_probe_step() else loss_sum.item() / samples, lr=lr)


def _end_epoch(session: worker_session.WorkerSession, job: _Job, totals: EpochTotals, epoch: int) -> EpochTotals:
    """Collective: evaluate, and rank 0 records the epoch; returns the next epoch's totals."""
    identity = session.identity
    last_global_step = job.loader.position.global_step - 1
    results = evaluate(job.model.module, job.data.eval, job.loader.plan, identity.rank, identity.device,
                       totals.loss_sum, totals.samples, job.config.data.is_text)
    elapsed = totals.elapsed_s()
    if identity.rank == 0:
        session.store.add_epoch.remote({
            "epoch": epoch, "global_step": last_global_step, "attempt": identity.attempt,
            **results, "epoch_time_s": elapsed,
            "samples_per_s": results["samples"] / elapsed if elapsed > 0 else None,
            "wall_time": time.time(),
        })
        session.log(f"epoch {epoch} done: train loss {results['train_loss']:.4f}, "
                    f"eval {results['eval_metric_name']} {results['eval_metric']:.4f}")
    return EpochTotals()


def _save_checkpoint(session: worker_session.WorkerSession, job: _Job, totals: EpochTotals) -> EpochTotals:
    """Collective (a report is a barrier): rank 0 writes the job's state, every rank
    reports. Returns the epoch's totals as they now stand: gathered on rank 0."""
    job.loader.finish_step()  # the step just run is recorded and counted before its checkpoint
    totals = _gathered_on_rank0(session.identity, totals)
    position = job.loader.position  # the next step: where a restart continues
    with tempfile.TemporaryDirectory(prefix="hetero_ray_ckpt_") as directory:
        checkpoint = None
        if session.identity.rank == 0:
            save_state(directory, TrainingState(
                model=job.model.module.state_dict(), optimizer=job.optimizer.state_dict(),
                lr_scheduler=job.lr_scheduler.state_dict(), position=position, plan=job.loader.plan,
                fingerprint=run_fingerprint(job.config), rng=capture_rng(),
                extra={**totals.to_checkpoint(),
                       **({GRAD_SCALER_KEY: job.scaler.state_dict()} if job.scaler is not None else {})},
            ))
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        hetero_ray.train.report({"epoch": position.epoch, "step": position.step,
                                 "global_step": position.global_step}, checkpoint=checkpoint)
    return totals


def _gathered_on_rank0(identity: WorkerIdentity, totals: EpochTotals) -> EpochTotals:
    """Collective: the epoch's loss totals moved to rank 0 (their sum over ranks is
    unchanged), so that rank 0's checkpoint carries them across a restart."""
    summed = torch.tensor([totals.loss_sum, totals.samples], dtype=torch.float64, device=identity.collective_device)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    loss_sum, samples = summed.tolist()
    if identity.rank != 0:
        return replace(totals, loss_sum=0.0, samples=0)
    return replace(totals, loss_sum=loss_sum, samples=int(samples))
