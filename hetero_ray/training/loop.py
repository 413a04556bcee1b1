"""The built-in job: one of the five models on one of the four datasets, trained through the
public API like any user's loop.

``hetero-ray train`` and ``jobs/train.py`` run this function inside a worker session
(:func:`hetero_ray.training.entry.run_user_loop`), exactly as ``HeteroTrainer`` runs a
user's ``train_loop_per_worker``: :func:`hetero_ray.train.prepare_model` gives the model
its gradient weighting, busy-time clock and exact BatchNorm,
:func:`hetero_ray.train.prepare_data_loader` hands out this rank's piece of each global
step under the plan in force, and :func:`hetero_ray.train.report` checkpoints. What the
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
from dataclasses import dataclass, field

import ray.train
import torch
import torch.distributed as dist

import hetero_ray.train
from hetero_ray.config import TrainConfig
from hetero_ray.training import session as worker_session
from hetero_ray.training.checkpointing import (
    TrainingState, capture_rng, load_state, restore_rng, run_fingerprint, save_state,
)
from hetero_ray.training.current_step import StepNotes
from hetero_ray.training.data import as_batch, load_dataset
from hetero_ray.training.evaluation import evaluate
from hetero_ray.training.loader import PlanFollowingLoader
from hetero_ray.training.models import build_model, compute_loss
from hetero_ray.training.optim import make_lr_scheduler, make_optimizer


@dataclass
class EpochTotals:
    """This rank's running totals of the epoch in progress (the train loss of the epoch
    row, and its throughput: samples over training time, restarts included)."""

    loss_sum: float = 0.0  # Σ loss·b over this rank's steps
    samples: int = 0
    started: float = field(default_factory=time.time)  # shifted back by the time before a restart

    def add(self, loss: float, local_batch_size: int) -> None:
        self.loss_sum += loss * local_batch_size
        self.samples += local_batch_size

    def elapsed_s(self) -> float:
        return time.time() - self.started


def train_loop_per_worker(loop_config: dict) -> None:
    """The built-in job on every worker; ``loop_config["train"]`` is the run's TrainConfig."""
    config = TrainConfig.from_dict(loop_config["train"])
    session = worker_session.current("the built-in loop")
    run_steps = session.settings.end_global_step

    # --- data, model, optimiser: functions of the seed and the global batch only
    data = load_dataset(config.dataset, data_dir=config.data_dir, num_samples=config.num_samples,
                        eval_samples=config.eval_samples, seed=config.seed, download=False,
                        verify_checksums=config.verify_checksums)
    torch.manual_seed(config.seed)
    model = hetero_ray.train.prepare_model(build_model(config.model, data.spec))
    optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr)
    lr_scheduler = make_lr_scheduler(config.lr_schedule, optimizer, run_steps)
    loader = hetero_ray.train.prepare_data_loader(data.train, collate_fn=as_batch, drop_last=config.drop_last)
    totals, elapsed_before_restart = EpochTotals(), 0.0

    # --- resume: the loader is already at the step after the checkpoint
    checkpoint = hetero_ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = load_state(directory, run_fingerprint(config))
        model.module.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        lr_scheduler.load_state_dict(state.lr_scheduler)
        restore_rng(state.rng)
        elapsed_before_restart = state.extra.get("epoch_elapsed_s", 0.0)
        if session.identity.rank == 0:  # the epoch's running totals, gathered on rank 0 at save time
            totals.loss_sum = state.extra.get("epoch_loss_sum", 0.0)
            totals.samples = state.extra.get("epoch_samples", 0)

    session.log(f"{run_steps} global steps in this run")
    totals.started = time.time() - elapsed_before_restart
    while loader.position.global_step < run_steps:
        epoch = loader.epoch
        for inputs, targets in loader:
            step = loader.position
            loss = compute_loss(model(inputs), targets)
            loss.backward()  # the hook weights by b_i / B and all-reduces
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            lr_scheduler.step()
            local_batch_size = loader.local_batch_size
            if local_batch_size > 0:  # a rank with weight 0 ran a placeholder sample
                totals.add(loss.item(), local_batch_size)
            session.current_step.note(StepNotes(loss=loss.item() if local_batch_size > 0 else None, lr=lr))
            next_global_step = step.global_step + 1
            if next_global_step >= run_steps:
                break
            if next_global_step % config.checkpoint_every == 0 and step.step + 1 < loader.sampler.steps_per_epoch:
                _save_checkpoint(session, config, model, optimizer, lr_scheduler, loader, totals)
        # The epoch ended, or the run did: evaluate, and always checkpoint (the driver
        # takes the final model from the last checkpoint).
        loader.finish_step()  # the last step's row, before evaluation time could count in it
        _end_epoch(session, config, model, data, loader, totals, epoch)
        _save_checkpoint(session, config, model, optimizer, lr_scheduler, loader, totals)
    session.log(f"finished at global step {loader.position.global_step}")


def _end_epoch(session, config: TrainConfig, model, data, loader: PlanFollowingLoader,
               totals: EpochTotals, epoch: int) -> None:
    """Collective: evaluate, and rank 0 records the epoch; the totals start again."""
    last_global_step = loader.position.global_step - 1
    results = evaluate(model.module, data.eval, loader.plan, session.identity.rank, session.identity.device,
                       totals.loss_sum, totals.samples, config.data.is_text)
    elapsed = totals.elapsed_s()
    if session.identity.rank == 0:
        session.store.add_epoch.remote({
            "epoch": epoch, "global_step": last_global_step, "attempt": session.identity.attempt,
            **results, "epoch_time_s": elapsed,
            "samples_per_s": results["samples"] / elapsed if elapsed > 0 else None,
            "wall_time": time.time(),
        })
        session.log(f"epoch {epoch} done: train loss {results['train_loss']:.4f}, "
                    f"eval {results['eval_metric_name']} {results['eval_metric']:.4f}")
    totals.loss_sum, totals.samples, totals.started = 0.0, 0, time.time()


def _save_checkpoint(session, config: TrainConfig, model, optimizer, lr_scheduler,
                     loader: PlanFollowingLoader, totals: EpochTotals) -> None:
    """Collective (a report is a barrier): rank 0 writes the job's state, every rank reports."""
    loader.finish_step()  # the step just run is recorded and counted before its checkpoint
    loss_sum, samples = _gather_epoch_totals_on_rank0(session, totals)
    position = loader.position  # the next step: where a restart continues
    with tempfile.TemporaryDirectory(prefix="hetero_ray_ckpt_") as directory:
        checkpoint = None
        if session.identity.rank == 0:
            save_state(directory, TrainingState(
                model=model.module.state_dict(), optimizer=optimizer.state_dict(),
                lr_scheduler=lr_scheduler.state_dict(), position=position, plan=loader.plan,
                fingerprint=run_fingerprint(config), rng=capture_rng(),
                extra={"epoch_loss_sum": loss_sum, "epoch_samples": samples,
                       "epoch_elapsed_s": totals.elapsed_s()},
            ))
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        hetero_ray.train.report({"epoch": position.epoch, "step": position.step,
                                 "global_step": position.global_step}, checkpoint=checkpoint)


def _gather_epoch_totals_on_rank0(session, totals: EpochTotals) -> tuple[float, int]:
    """Moves the epoch's running loss totals to rank 0 (the sum over ranks is unchanged),
    so that rank 0's checkpoint carries them across a restart; returns rank 0's."""
    summed = torch.tensor([totals.loss_sum, totals.samples], dtype=torch.float64,
                          device=session.identity.collective_device)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    loss_sum, samples = summed.tolist()
    totals.loss_sum, totals.samples = (loss_sum, int(samples)) if session.identity.rank == 0 else (0.0, 0)
    return totals.loss_sum, totals.samples
