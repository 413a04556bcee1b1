"""PyTorch Lightning on hetero_ray's unequal shares: Ray Train's ``ray.train.lightning``
recipe with its imports changed (and ``HeteroTrainer`` for ``TorchTrainer`` on the driver)::

    from hetero_ray.train.lightning import (RayDDPStrategy, RayLightningEnvironment,
                                            RayTrainReportCallback, prepare_trainer)
    trainer = prepare_trainer(lightning.Trainer(
        strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()], enable_checkpointing=False))

``RayDDPStrategy`` and ``RayLightningEnvironment`` are :class:`HeteroDDPStrategy` and
:class:`HeteroLightningEnvironment` under Ray's names. The strategy gives each optimizer
step one device's gradient of the global batch (``prepare_model``'s ``b_i / B`` hook, not
Lightning's equal-weight DDP), feeds the training ``DataLoader`` by the plan, weights
``self.log(..., sync_dist=True)`` by the shares, and hands ranks left out rank 0's state.
How, why, and resuming from a checkpoint: docs/api.md#pytorch-lightning
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
