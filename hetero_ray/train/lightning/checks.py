"""What a Trainer on hetero shares cannot do, refused before its first step with what to do."""

from __future__ import annotations

from hetero_ray.errors import UserError


def check_trainer(trainer) -> None:
    """Raises :class:`UserError` for Trainer options that break one global batch per
    optimizer step or one pass over the data per epoch."""
    if trainer.accumulate_grad_batches != 1:
        raise UserError(
            f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}): under hetero_ray each optimizer "
            "step is one global batch of HeteroConfig.global_batch_size, split between the ranks by speed; set "
            "accumulate_grad_batches=1 and HeteroConfig(global_batch_size=...) to the samples of one optimizer "
            "step (batch_size × accumulate_grad_batches × workers)")
    limit = trainer.limit_train_batches
    # Lightning reads a float as a fraction of the epoch and an int as batches (1: one batch).
    if not (limit is None or (isinstance(limit, float) and limit == 1.0)) or trainer.overfit_batches:
        raise UserError(
            f"Trainer(limit_train_batches={trainer.limit_train_batches}, overfit_batches={trainer.overfit_batches}):"
            " hetero_ray's training loader runs every global batch of an epoch (an epoch cut short would continue "
            "in the next one); leave both at their defaults and stop with max_steps instead")
    ray_callback = _ray_report_callback_class()
    if ray_callback is not None and any(isinstance(c, ray_callback) for c in trainer.callbacks):
        raise UserError("the Trainer has ray.train.lightning.RayTrainReportCallback, whose checkpoints lack "
                        "hetero_ray's data position (a restart could not resume from them); use "
                        "hetero_ray.train.lightning.RayTrainReportCallback instead")


def _ray_report_callback_class():
    try:
        from ray.train.lightning import RayTrainReportCallback as RayCallback
    except ImportError:
        return None
    return RayCallback
