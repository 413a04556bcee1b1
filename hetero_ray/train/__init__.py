"""The worker-side API: what a ``train_loop_per_worker`` calls, in Ray Train's shape.

    def train_loop_per_worker(config):
        model = hetero_ray.train.prepare_model(MyModel())
        loader = hetero_ray.train.prepare_data_loader(my_dataset, num_workers=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        for epoch in range(loader.epoch, config["epochs"]):
            for x, y in loader:                    # this rank's piece of each global step
                loss = loss_fn(model(x), y)        # the MEAN over the local batch
                loss.backward(); optimizer.step(); optimizer.zero_grad()
            hetero_ray.train.report({"loss": loss.item()}, checkpoint=...)

The loss contract: each rank's loss is the mean over its own local batch (as with one
device). The gradient hook weights rank ``i`` by ``b_i / B``, so the step is the gradient
of the mean over the whole global batch; a sum, or a mean over anything else, would
weight ranks wrongly. For per-token losses whose token counts differ between samples,
use :func:`token_weighted_loss`. A share past the device's memory takes
:func:`micro_batches`.
"""

from __future__ import annotations

from hetero_ray.train.worker import (
    get_checkpoint, get_context, get_dataset_shard, get_device, is_probe_step, micro_batches, prepare_data_loader,
    prepare_model, report, token_weighted_loss,
)


def prepare_trainer(trainer):
    """A ``transformers.Trainer`` that trains on this rank's share: the model prepared as by
    :func:`prepare_model`, the training data as by :func:`prepare_data_loader`, and its loss
    and logged loss weighted by ``b_i / B`` (Ray Train's
    ``ray.train.huggingface.transformers.prepare_trainer``, for hetero_ray). Report with
    ``hetero_ray.train.huggingface.RayTrainReportCallback``. Needs the ``hf`` extra
    (``pip install '.[hf]'`` in a checkout); see :mod:`hetero_ray.train.huggingface`. A PyTorch
    Lightning Trainer takes :func:`hetero_ray.train.lightning.prepare_trainer` (the
    ``lightning`` extra)."""
    from hetero_ray.errors import UserError
    from hetero_ray.train.huggingface import prepare_trainer as prepare

    if type(trainer).__module__.split(".")[0] in ("lightning", "pytorch_lightning"):
        raise UserError("hetero_ray.train.prepare_trainer is the Hugging Face Trainer's; for a Lightning Trainer "
                        "use hetero_ray.train.lightning.prepare_trainer (with its RayDDPStrategy and "
                        "RayLightningEnvironment)")
    return prepare(trainer)


__all__ = ["prepare_model", "prepare_data_loader", "prepare_trainer", "report", "get_checkpoint", "get_context",
           "get_dataset_shard",
           "get_device", "is_probe_step", "micro_batches", "token_weighted_loss"]
