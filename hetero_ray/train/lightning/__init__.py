"""PyTorch Lightning on hetero_ray's unequal shares, in the shape of ``ray.train.lightning``.

Ray Train's recipe carries over by changing the imports (and ``TorchTrainer`` for
``HeteroTrainer`` on the driver)::

    from hetero_ray.train.lightning import (RayDDPStrategy, RayLightningEnvironment,
                                            RayTrainReportCallback, prepare_trainer)

    def train_loop_per_worker(config):
        trainer = lightning.Trainer(devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                                    plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
                                    enable_checkpointing=False)
        trainer = prepare_trainer(trainer)
        checkpoint = hetero_ray.train.get_checkpoint()
        if checkpoint is None:
            trainer.fit(model, datamodule=datamodule)
        else:
            with checkpoint.as_directory() as directory:
                trainer.fit(model, datamodule=datamodule,
                            ckpt_path=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME))

``RayDDPStrategy`` and ``RayLightningEnvironment`` are :class:`HeteroDDPStrategy` and
:class:`HeteroLightningEnvironment` under Ray's names. What the strategy changes, and why:

- **The model** goes through ``hetero_ray.train.prepare_model`` instead of Lightning's own
  DDP: the ``b_i / B`` gradient hook (one device's gradient of the global batch from
  unequal local batches; Lightning's DDP averages ranks with equal weight), the busy-time
  clock, and BatchNorm with the statistics of the whole global batch.
- **The training data**: the ``DataLoader`` that the LightningModule's (or the
  LightningDataModule's) ``train_dataloader`` returns goes through
  ``hetero_ray.train.prepare_data_loader``: each rank's share of every global batch of
  ``HeteroConfig.global_batch_size`` under the plan in force, every sample once per epoch,
  also across plan changes and restarts. Lightning injects no ``DistributedSampler`` into it.
- **Logged values**: ``self.log(..., sync_dist=True)`` in ``training_step`` averages the
  ranks by their shares (``Σ_i w_i · value_i``), so a logged loss is the global batch's, as
  one device logs it; an epoch-level mean counts no sample of a rank left out.
- **Ranks left out** by the plan run a probe with weight 0; they take rank 0's model,
  optimisers and schedulers at the end of each epoch, before validation and at the end
  of ``fit``.

Validation, testing and prediction keep Lightning's own behaviour (its
``DistributedSampler``, equal shares). Each optimizer step is one global batch:
``accumulate_grad_batches`` must be 1.
"""

from __future__ import annotations

try:
    import lightning  # noqa: F401
except ModuleNotFoundError as e:  # an optional extra: say how to get it
    raise ModuleNotFoundError(f"hetero_ray.train.lightning needs PyTorch Lightning, which cannot be imported here "
                              f"({e}); pip install '.[lightning]'") from e

from hetero_ray.train.lightning.environment import HeteroLightningEnvironment
from hetero_ray.train.lightning.prepare import prepare_trainer
from hetero_ray.train.lightning.report import RayTrainReportCallback
from hetero_ray.train.lightning.strategy import HeteroDDPStrategy

# Ray Train's names, so that porting a job changes its imports only.
RayDDPStrategy = HeteroDDPStrategy
RayLightningEnvironment = HeteroLightningEnvironment

__all__ = ["HeteroDDPStrategy", "HeteroLightningEnvironment", "RayDDPStrategy", "RayLightningEnvironment",
           "RayTrainReportCallback", "prepare_trainer"]
