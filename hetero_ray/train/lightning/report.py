"""``RayTrainReportCallback``: a Lightning Trainer's logged metrics and checkpoints through
``hetero_ray.train.report``."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

from lightning.pytorch.callbacks import Callback

from hetero_ray.errors import UserError
from hetero_ray.train.lightning.data import finish_epoch_step, training_loader


class RayTrainReportCallback(Callback):
    """``ray.train.lightning.RayTrainReportCallback`` for hetero_ray: at the end of each
    training epoch, ``trainer.callback_metrics`` (with ``epoch`` and ``step``) and a Lightning
    checkpoint (``checkpoint.ckpt``, written by rank 0) are reported through
    ``hetero_ray.train.report``. They reach the run's ``reports`` table, ``Result.metrics``
    and ``Result.checkpoint``, with hetero_ray's sampler position and plan beside the
    checkpoint, so a restart resumes at its exact step
    (``trainer.fit(..., ckpt_path=<checkpoint>/checkpoint.ckpt)``).

    Args:
        every_n_train_steps: also report a checkpoint after every n-th optimizer step, so
            that a failure mid-epoch costs at most n steps (None: at epoch ends only, as Ray's
            callback does).

    An epoch cut short (``max_steps``, an early stop) reports its metrics without a
    checkpoint: Lightning would take it for a finished epoch, the loader for an unfinished
    one. Every rank reports at the same points (a report is a barrier).
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self, every_n_train_steps: Optional[int] = None):
        if every_n_train_steps is not None and (isinstance(every_n_train_steps, bool)
                                                or not isinstance(every_n_train_steps, int)
                                                or every_n_train_steps < 1):
            raise UserError(f"RayTrainReportCallback(every_n_train_steps={every_n_train_steps!r}) must be a positive "
                            "integer or None")
        super().__init__()
        self.every_n_train_steps = every_n_train_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n = self.every_n_train_steps
        if n is None or trainer.global_step % n != 0:
            return
        loader = training_loader()
        if loader is not None and loader.position.step == loader.sampler.steps_per_epoch - 1:
            return  # the epoch's end reports this step's checkpoint
        self._report(trainer, with_checkpoint=True)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._report(trainer, with_checkpoint=finish_epoch_step())

    def _report(self, trainer, with_checkpoint: bool) -> None:
        import ray.train

        from hetero_ray.train.worker import report

        metrics = {name: value.item() if hasattr(value, "item") else value
                   for name, value in trainer.callback_metrics.items()}
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        if not with_checkpoint:
            report(metrics)
            return
        directory = tempfile.mkdtemp(prefix="hetero_ray_lightning-")
        try:
            # Every rank takes part (the strategy's collectives); rank 0 writes the file.
            trainer.save_checkpoint(os.path.join(directory, self.CHECKPOINT_NAME), weights_only=False)
            checkpoint = ray.train.Checkpoint.from_directory(directory) if trainer.global_rank == 0 else None
            report(metrics, checkpoint=checkpoint)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
