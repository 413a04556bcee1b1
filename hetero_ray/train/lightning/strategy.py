"""``HeteroDDPStrategy``: Lightning's DDP strategy on hetero_ray's unequal shares (the
package docstring says what it changes and why)."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

from hetero_ray.errors import UserError
from hetero_ray.train.lightning.checks import check_trainer
from hetero_ray.train.lightning.data import follow_the_plan

# DDPStrategy options that would replace or undo the b_i / B gradient hook.
_HOOK_OPTIONS = ("ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper", "model_averaging_period")


class HeteroDDPStrategy(DDPStrategy):
    """``ray.train.lightning.RayDDPStrategy`` for hetero_ray (also exported under that name).

    Takes ``DDPStrategy``'s arguments; ``process_group_backend``, ``timeout`` and
    ``start_method`` have no effect (the process group is Ray Train's, as with Ray's
    strategy), and the DDP communication-hook options are refused: hetero_ray's hook is the
    one that weights the ranks by their shares.

    Raises:
        UserError: a communication-hook option here; at ``fit``, Trainer options that break
            one global batch per optimizer step (``accumulate_grad_batches`` other than 1,
            ``limit_train_batches``, ``overfit_batches``) or Ray Train's report callback.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        given = [name for name in _HOOK_OPTIONS if kwargs.get(name) is not None]
        if given:
            raise UserError(f"HeteroDDPStrategy({', '.join(f'{n}=...' for n in given)}): hetero_ray's own DDP "
                            "communication hook weights each rank's gradient by its share of the global batch; "
                            "another hook would undo that. Leave these options out")
        super().__init__(*args, **kwargs)
        self._in_training_step = False

    @property
    def root_device(self) -> torch.device:
        from hetero_ray.train.worker import get_device

        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # Validation, test and prediction loaders: Lightning's equal shares over all ranks.
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup(self, trainer) -> None:
        check_trainer(trainer)
        follow_the_plan(trainer)
        self._one_precision_on_every_rank()
        # hetero_ray's BatchNorm (prepare_model) normalises over the global batch already;
        # torch's SyncBatchNorm (Trainer(sync_batchnorm=True)) would do it with equal weights.
        self._layer_sync = None
        super().setup(trainer)

    def _one_precision_on_every_rank(self) -> None:
        """Lightning runs ``precision="16-mixed"`` as fp16 with a GradScaler on a GPU but as
        bf16 without one on a CPU: in a job of both, the GPU ranks' gradients would be scaled
        and the CPU ranks' not, and every rank would step on their sum. The CPU ranks get
        fp16 with a GradScaler too (torch has both on the CPU), so every rank scales alike."""
        from lightning.pytorch.plugins.precision import MixedPrecision

        plugin = self.precision_plugin
        mine = "16-mixed" if getattr(plugin, "scaler", None) is not None else getattr(plugin, "precision", None)
        kinds = [None] * dist.get_world_size()
        dist.all_gather_object(kinds, (mine, self.root_device.type))
        if "16-mixed" not in {k for k, _ in kinds} or mine == "16-mixed":
            return
        if mine != "bf16-mixed" or self.root_device.type != "cpu":
            raise UserError(f"Trainer(precision=...): the ranks run different precisions ({sorted(set(kinds), key=str)}); "
                            "give every rank the same one, e.g. '16-mixed', 'bf16-mixed' or '32-true'")
        self.precision_plugin = MixedPrecision("16-mixed", "cpu")

    def configure_ddp(self) -> None:
        from hetero_ray.train.worker import prepare_model
        from hetero_ray.training.rank import session

        prepared = session.current("lightning.RayDDPStrategy").parts.model
        if prepared is not None and prepared.ddp.module is self.model:
            self.model = prepared.ddp  # a second fit() of the same module: the same DDP and hook
        elif prepared is not None:
            raise UserError("a second LightningModule was fitted on this worker: hetero_ray weights the gradients "
                            "of one model per run; fit one LightningModule (wrap several networks in it)")
        else:
            self.model = prepare_model(self.model, ddp_kwargs=self._ddp_kwargs)

    def training_step(self, *args: Any, **kwargs: Any):
        from hetero_ray.train.worker import is_probe_step

        if is_probe_step():
            # A probe (a rank left out) or the weight-0 sample of a short last window: no
            # sample of the global batch, so none counts in an epoch-level logged mean.
            self.lightning_module.trainer._results.batch_size = 0
        self._in_training_step = True
        try:
            return super().training_step(*args, **kwargs)
        finally:
            self._in_training_step = False

    def reduce(self, tensor, group: Optional[Any] = None, reduce_op: Optional[Any] = "mean"):
        """``self.log(..., sync_dist=True)`` inside ``training_step``: the ranks' values
        weighted by their shares, ``Σ_i (b_i / B) · value_i`` (for a local mean loss: the
        global batch's mean, as one device logs it). Any other reduction is Lightning's."""
        if not (self._in_training_step and isinstance(tensor, torch.Tensor) and reduce_op in ("mean", "avg")
                and dist.is_available() and dist.is_initialized()):
            return super().reduce(tensor, group=group, reduce_op=reduce_op)
        from hetero_ray.training.rank import session

        current = session.current("lightning.RayDDPStrategy")
        weighted = tensor.detach().to(current.identity.collective_device, torch.float64)
        weighted *= current.parts.model.weight_state.weight
        dist.all_reduce(weighted, op=dist.ReduceOp.SUM, group=group)
        return weighted.to(tensor.device, tensor.dtype)

    # A rank left out takes rank 0's state before anything looks at it (collectives: every
    # rank runs these hooks).
    def on_validation_start(self) -> None:
        _copy_state_to_left_out_ranks()
        super().on_validation_start()

    def on_train_end(self) -> None:
        _copy_state_to_left_out_ranks()
        super().on_train_end()


def _copy_state_to_left_out_ranks() -> None:
    from hetero_ray.training.rank import session

    session.current("lightning.RayDDPStrategy").parts.copy_state_to_left_out_ranks()
