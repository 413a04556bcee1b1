"""``prepare_trainer``: Ray Train's check that a Lightning Trainer is set up for the cluster."""

from __future__ import annotations

from hetero_ray.errors import UserError
from hetero_ray.train.lightning.checks import check_trainer
from hetero_ray.train.lightning.environment import HeteroLightningEnvironment
from hetero_ray.train.lightning.strategy import HeteroDDPStrategy


def prepare_trainer(trainer):
    """``ray.train.lightning.prepare_trainer`` for hetero_ray: checks, before any step, that
    ``trainer`` trains on hetero shares, and returns it. The strategy does the work at
    ``fit`` (see :mod:`hetero_ray.train.lightning`).

    Raises:
        UserError: a strategy other than :class:`HeteroDDPStrategy` (Ray's ``RayDDPStrategy``
            included), another cluster environment, or a Trainer option that breaks one
            global batch per optimizer step (see :class:`HeteroDDPStrategy`).
    """
    strategy = trainer.strategy
    if not isinstance(strategy, HeteroDDPStrategy):
        raise UserError(f"the Trainer's strategy is {type(strategy).__name__}: on hetero shares it must be "
                        "hetero_ray.train.lightning.RayDDPStrategy (HeteroDDPStrategy), which weights each rank's "
                        "gradient by its share; FSDP and DeepSpeed are not supported. Import RayDDPStrategy and "
                        "RayLightningEnvironment from hetero_ray.train.lightning instead of ray.train.lightning")
    environment = getattr(strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, HeteroLightningEnvironment):
        raise UserError(f"the Trainer's cluster environment is {type(environment).__name__}; pass "
                        "plugins=[hetero_ray.train.lightning.RayLightningEnvironment()] to the Trainer")
    check_trainer(trainer)
    return trainer
