"""Hugging Face ``transformers.Trainer`` on hetero_ray's unequal shares: Ray Train's recipe
(``ray.train.huggingface.transformers``) with one import changed, to
``from hetero_ray.train.huggingface import RayTrainReportCallback, prepare_trainer``.

:func:`prepare_trainer` overrides the Trainer's model (``hetero_ray.train.prepare_model``:
DDP that weights rank ``i`` by ``w_i = b_i / B``), its training data (this rank's share of
``HeteroConfig.global_batch_size`` under the plan), its loss and its logged loss, so that a
step and its logged loss are one device's on the global batch. The loss the Trainer hands
over is ``n · S_i / T`` for a loss counted in items (``S_i`` this rank's summed item losses,
``T`` the global batch's items), back-propagated over ``n · w_i`` so that rank ``i`` adds
``S_i / T``; or ``n · ℓ_i`` for a plain mean ``ℓ_i``, back-propagated over ``n``. Which of the
two, the first step the Trainer scales tells. :class:`RayTrainReportCallback` reports through
``hetero_ray.train.report``; evaluation keeps the Trainer's own loader.
How and why: docs/api.md#how-the-trainer-bridge-works
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import os
import shutil
import tempfile
from typing import Any, Iterator, Optional

import torch
from torch.utils.data import DataLoader

from hetero_ray.errors import UserError

logger = logging.getLogger("hetero_ray.worker")

INSTALL_HINT = "pip install '.[hf]' in a hetero_ray checkout (transformers 5.x and accelerate)"

try:
    import transformers
    from transformers.trainer_callback import TrainerCallback
    _IMPORT_ERROR: Optional[ImportError] = None
except ImportError as e:  # an optional extra: the rest of hetero_ray works without it
    transformers = None
    TrainerCallback = object
    _IMPORT_ERROR = e


def _require_transformers(what: str) -> None:
    if _IMPORT_ERROR is not None:
        raise UserError(f"hetero_ray.train.huggingface.{what} needs Hugging Face transformers, which cannot be "
                        f"imported here ({_IMPORT_ERROR}); {INSTALL_HINT}")


class RayTrainReportCallback(TrainerCallback):
    """Reports a ``transformers.Trainer``'s logs and checkpoints through
    ``hetero_ray.train.report`` (Ray Train's callback of the same name calls
    ``ray.train.report``, whose checkpoints a hetero_ray run cannot resume from).

    - ``on_log``: the logs so far (merged, the latest value of each key) without a
      checkpoint: they reach the run's ``reports`` table. Skipped when the Trainer saves
      at the same step, which reports them anyway.
    - ``on_save``: the merged logs with the Trainer's checkpoint (rank 0's copy, in a
      ``checkpoint/`` folder, as Ray Train's callback lays it out): ``Result.metrics`` and
      ``Result.checkpoint``.

    Every rank reports at the same events (a report is a barrier), which the Trainer's
    logging and saving strategies give.
    """

    CHECKPOINT_NAME = "checkpoint"

    def __init__(self, *args, **kwargs):
        _require_transformers("RayTrainReportCallback")
        super().__init__(*args, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if control.should_save:
            return
        from hetero_ray.train.worker import report

        report(_merged_logs(state))

    def on_save(self, args, state, control, **kwargs):
        import ray.train
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        from hetero_ray.train.worker import report

        metrics = _merged_logs(state)
        saved = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if torch.distributed.is_initialized():
            # Every rank writes its RNG state into the checkpoint folder; where ranks share a
            # node and an output_dir, rank 0 must not copy a file another rank is still writing.
            torch.distributed.barrier()
        if not (state.is_world_process_zero and os.path.isdir(saved)):
            report(metrics)
            return
        with tempfile.TemporaryDirectory() as directory:
            shutil.copytree(saved, os.path.join(directory, self.CHECKPOINT_NAME))
            report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


def _merged_logs(state) -> dict:
    metrics: dict[str, Any] = {}
    for logged in state.log_history:
        metrics.update(logged)
    return metrics


def prepare_trainer(trainer):
    """Makes a ``transformers.Trainer`` train on this rank's hetero_ray share (call once
    per worker, after making the Trainer and before ``trainer.train()``).

    The model is prepared by hetero_ray (call neither ``prepare_model`` nor
    ``prepare_data_loader`` yourself for it), the training data follows the run's plan,
    and the loss and the logged loss are weighted as one device on the global batch
    computes them (docs/api.md#how-the-trainer-bridge-works). To resume after a restart,
    pass the Trainer's checkpoint from ``hetero_ray.train.get_checkpoint()`` to
    ``trainer.train(resume_from_checkpoint=...)``: the data position comes from hetero_ray,
    so the Trainer does not skip batches itself.

    Raises:
        UserError: transformers is not installed; not a Trainer; gradient accumulation
            (set ``HeteroConfig.global_batch_size`` to the batch of one optimizer step
            instead); Ray Train's own report callback; the Trainer on another device than
            this rank's.
    """
    _require_transformers("prepare_trainer")
    from hetero_ray.train.worker import get_device, prepare_model

    if not isinstance(trainer, transformers.Trainer):
        raise UserError(f"hetero_ray.train.prepare_trainer takes a transformers.Trainer, got {type(trainer).__name__}")
    _check_args(trainer.args)
    _check_callbacks(trainer)
    _check_device(trainer.args.device, get_device())
    # The loader continues at the checkpoint's step by itself; skipping again would lose data.
    trainer.args.ignore_data_skip = True
    wrapped = prepare_model(trainer.model, ddp_kwargs=_ddp_kwargs(trainer))
    trainer.model = trainer.callback_handler.model = wrapped.module
    trainer.model_wrapped = wrapped
    trainer.__class__ = _on_hetero_shares(type(trainer))
    return trainer


def _check_args(args) -> None:
    if args.gradient_accumulation_steps != 1:
        raise UserError(
            f"TrainingArguments(gradient_accumulation_steps={args.gradient_accumulation_steps}): under hetero_ray "
            "each optimizer step is one global batch of HeteroConfig.global_batch_size, split between the ranks by "
            "speed; set gradient_accumulation_steps=1 and HeteroConfig(global_batch_size=...) to the samples of one "
            "optimizer step (per_device_train_batch_size × accumulation steps × workers)")


def _check_callbacks(trainer) -> None:
    ray_callback = _ray_report_callback_class()
    if ray_callback is not None and any(isinstance(c, ray_callback) for c in trainer.callback_handler.callbacks):
        raise UserError("the Trainer has ray.train.huggingface.transformers.RayTrainReportCallback, whose checkpoints "
                        "lack hetero_ray's data position (a restart could not resume from them); use "
                        "hetero_ray.train.huggingface.RayTrainReportCallback instead")


def _ray_report_callback_class():
    try:
        from ray.train.huggingface.transformers import RayTrainReportCallback as RayCallback
    except ImportError:
        return None
    return RayCallback


def _check_device(trainer_device: torch.device, rank_device: torch.device) -> None:
    def same(a: torch.device, b: torch.device) -> bool:
        return a.type == b.type and (a.index or 0) == (b.index or 0)

    if not same(torch.device(trainer_device), rank_device):
        raise UserError(f"the Trainer runs on {trainer_device} (its TrainingArguments' device) but hetero_ray placed "
                        f"this rank on {rank_device}; make the TrainingArguments inside train_loop_per_worker, and on "
                        "the CPU ranks of a mixed job pass TrainingArguments(use_cpu=True) (e.g. use_cpu="
                        "hetero_ray.train.get_device().type == 'cpu')")


def _ddp_kwargs(trainer) -> dict[str, Any]:
    """The DDP options the Trainer would have given Accelerate (TrainingArguments.ddp_*)."""
    args = trainer.args
    if args.ddp_find_unused_parameters is not None:
        find_unused = args.ddp_find_unused_parameters
    elif isinstance(trainer.model, transformers.PreTrainedModel):
        # The Trainer's own rule: finding unused parameters breaks activation checkpointing.
        # (transformers 5 names: the old gradient_checkpointing ones are aliases, and the
        # model's warns on every read.)
        find_unused = not (trainer.model.is_activation_checkpointing or args.activation_checkpointing)
    else:
        find_unused = True
    kwargs: dict[str, Any] = {"find_unused_parameters": find_unused}
    for name in ("bucket_cap_mb", "broadcast_buffers", "static_graph"):
        value = getattr(args, f"ddp_{name}", None)
        if value is not None:
            kwargs[name] = value
    return kwargs


def _on_hetero_shares(base: type) -> type:
    """A subclass of the Trainer's own class with the overrides of the module docstring."""
    name = f"HeteroShares{base.__name__}"
    return type(name, (_HeteroShares, base), {"__qualname__": name, "__module__": __name__})


class _HeteroShares:
    """The overrides of the module docstring, mixed in before the Trainer's own class (their
    ``super()`` is that class)."""

    _hetero_loader = None
    _loss_kind: Optional[LossKind] = None  # judged at the first step the Trainer scales the loss

    def get_train_dataloader(self):
        # Made once: a second train() call continues the same loader (one per worker).
        if self._hetero_loader is None:
            self._hetero_loader = _TrainerLoader(*_prepared_loader(self))
        return self._hetero_loader

    def evaluate(self, *args, **kwargs):
        # Every rank evaluates (the Trainer gathers the results): a rank the plan left out
        # first takes rank 0's state, or it would evaluate its own stale weights.
        _session_of_trainer().parts.copy_state_to_left_out_ranks()
        return super().evaluate(*args, **kwargs)

    def _track_num_input_tokens(self, inputs):
        # A probe's tokens are no data (a rank the plan leaves out): it joins the Trainer's
        # gather of the count with none.
        from hetero_ray.train.worker import is_probe_step

        if is_probe_step() and isinstance(inputs, dict):
            inputs = {name: value[:0] if torch.is_tensor(value) else value for name, value in inputs.items()}
        return super()._track_num_input_tokens(inputs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        scaled = self._scaled_for_equal_ranks(num_items_in_batch)
        if scaled and self._loss_kind in (None, LossKind.UNKNOWN):
            self._loss_kind = self._judge_loss_kind(inputs, num_items_in_batch)
        result = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                      num_items_in_batch=num_items_in_batch)
        mean = self._loss_kind is LossKind.MEAN
        if not scaled or not (model.training or mean):
            return result
        loss = result[0] if return_outputs else result
        num_processes = self.accelerator.num_processes
        if mean:
            # n · ℓ_i with ℓ_i the local mean: ℓ_i (evaluation: the Trainer's mean over
            # the ranks' equal batches), and in training, after the hook's w_i, Σ w_i ℓ_i.
            loss = loss / num_processes
        else:
            # ℓ_i / (n · w_i): after the hook's w_i, rank i adds S_i / T (module docstring).
            weight = _rank_weight()
            loss = loss * 0.0 if weight == 0 else loss / (num_processes * weight)
        return (loss, *result[1:]) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        # The Trainer logs the mean over ranks of this value: n · w_i · loss makes it Σ w_i ℓ_i.
        return loss * (self.accelerator.num_processes * _rank_weight())

    def autocast_smart_context_manager(self, cache_enabled: Optional[bool] = True):
        # Accelerate applies the Trainer's bf16/fp16 by wrapping the model it prepares;
        # it never prepares hetero_ray's model, so the autocast goes around the loss here.
        return self.accelerator.autocast()

    def _get_num_items_in_batch(self, batch_samples, device):
        if _rank_weight() == 0 and batch_samples:
            # This rank's piece of a short last window is empty: it runs one sample of
            # the window with weight 0, whose tokens must not count in T.
            batch_samples = [_without_labels(batch) for batch in batch_samples]
        return super()._get_num_items_in_batch(batch_samples, device)

    def _scaled_for_equal_ranks(self, num_items_in_batch) -> bool:
        """Whether the Trainer multiplied the loss by n for DDP's equal average (its own test)."""
        return bool(self.args.average_tokens_across_devices
                    and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
                    and num_items_in_batch is not None)

    def _judge_loss_kind(self, inputs, num_items_in_batch) -> LossKind:
        """Whether the Trainer's loss really divides by ``num_items_in_batch``, judged on
        this rank's batch summed over all ranks (one all-reduce: every rank takes the
        same verdict, and a rank whose loss is 0 does not decide). Every rank runs it at
        the same step, where the Trainer gathers the item counts already."""
        from hetero_ray.training.rank import session

        local = losses_at_n_and_twice_n(super().compute_loss, self.model, inputs, num_items_in_batch)
        device = session.current("prepare_trainer").identity.collective_device
        summed = local.to(device, torch.float64)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(summed)
        kind = judge_loss_kind(*summed.tolist())
        if self.is_world_process_zero():
            _say_loss_kind(kind, type(self.model).__name__)
        return kind


class LossKind(enum.Enum):
    """How the loss a Trainer computes answers ``num_items_in_batch`` (the items of the
    whole global batch, which the Trainer passes wherever the model's ``forward`` takes
    ``**kwargs`` or a ``compute_loss_func`` is set)."""

    COUNTS_ITEMS = "counts_items"  # a sum over items divided by it (a causal LM's ForCausalLMLoss)
    MEAN = "mean"  # ignores it: the plain mean over the local batch (BERT's sequence classifier)
    PARTLY = "partly"  # in between: e.g. a router's auxiliary loss added to a counted one
    UNKNOWN = "unknown"  # 0 or not finite everywhere: nothing to judge from (judged again next step)


# Doubling N halves a counted loss (ratio 0.5) and leaves a mean alone (ratio 1); the same
# computation twice differs by float rounding at most, far inside 1 %.
LOSS_RATIO_TOLERANCE = 0.01


def judge_loss_kind(loss_at_n: float, loss_at_twice_n: float) -> LossKind:
    """The kind of a loss from its sizes with ``num_items_in_batch`` N and 2N (summed over
    the ranks, each as ``|loss|``)."""
    if not (math.isfinite(loss_at_n) and math.isfinite(loss_at_twice_n)) or loss_at_n == 0:
        return LossKind.UNKNOWN
    ratio = loss_at_twice_n / loss_at_n
    if abs(ratio - 0.5) <= LOSS_RATIO_TOLERANCE:
        return LossKind.COUNTS_ITEMS
    if abs(ratio - 1.0) <= LOSS_RATIO_TOLERANCE:
        return LossKind.MEAN
    return LossKind.PARTLY


def losses_at_n_and_twice_n(compute_loss, model: torch.nn.Module, inputs: dict, num_items_in_batch) -> torch.Tensor:
    """``|loss|`` of ``inputs`` with ``num_items_in_batch`` N and 2N, by the Trainer's
    ``compute_loss``: in eval mode and without gradients (no dropout, no batch statistics,
    so the same computation twice), after which nothing of the model or the step it runs
    in has changed."""
    losses = []
    with torch.no_grad(), _eval_mode(model):
        for items in (num_items_in_batch, 2 * num_items_in_batch):
            # A copy: the Trainer pops the labels of the dict it is given.
            loss = compute_loss(model, dict(inputs), num_items_in_batch=items)
            losses.append(loss.detach().float().abs())
    return torch.stack(losses)


def _say_loss_kind(kind: LossKind, model_name: str) -> None:
    if kind is LossKind.MEAN:
        logger.info("prepare_trainer: the Trainer passes %s num_items_in_batch, but its loss ignores it (the mean "
                    "over the local batch); each rank's mean is weighted by its share", model_name)
    elif kind is LossKind.PARTLY:
        logger.warning("prepare_trainer: %s's loss is only partly divided by num_items_in_batch (doubling it neither "
                       "halved the loss nor left it alone: e.g. an auxiliary loss added to a token loss); it is "
                       "weighted as a loss counted in items, so its other part is summed over the ranks, as the "
                       "Trainer's own DDP sums it, instead of weighted by share", model_name)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model.eval()`` for the block, then each module back in the mode it was in."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _session_of_trainer():
    from hetero_ray.training.rank import session

    return session.current("prepare_trainer")


def _rank_weight() -> float:
    """``w_i`` of the step in progress (``1/n`` outside the loader's steps)."""
    return _session_of_trainer().parts.model.weight_state.weight


def _without_labels(batch):
    if not isinstance(batch, dict):
        return batch
    return {key: (torch.full_like(value, -100) if key in ("labels", "shift_labels") and torch.is_tensor(value)
                  else value) for key, value in batch.items()}


def _prepared_loader(trainer):
    """``hetero_ray.train.prepare_data_loader`` over the Trainer's dataset, collator and
    DataLoader options (columns the model does not take removed, as the Trainer does),
    and that dataset."""
    from transformers.utils import is_datasets_available

    from hetero_ray.train.worker import prepare_data_loader

    if trainer.train_dataset is None:
        raise UserError("Trainer: training requires a train_dataset")
    dataset, collator = trainer.train_dataset, trainer.data_collator
    if is_datasets_available():
        import datasets

        if isinstance(dataset, datasets.Dataset):
            dataset = trainer._remove_unused_columns(dataset, description="Training")
        else:
            collator = trainer._get_collator_with_removed_columns(collator, description="Training")
    else:
        collator = trainer._get_collator_with_removed_columns(collator, description="Training")
    if isinstance(dataset, torch.utils.data.IterableDataset):
        prepare_data_loader(dataset)  # refused there, with the reason
    args = trainer.args
    workers = args.dataloader_num_workers
    loader = DataLoader(dataset, batch_size=trainer._train_batch_size, shuffle=True, collate_fn=collator,
                        num_workers=workers, pin_memory=args.dataloader_pin_memory,
                        drop_last=args.dataloader_drop_last,
                        prefetch_factor=args.dataloader_prefetch_factor if workers > 0 else None)
    return prepare_data_loader(loader), dataset


class _TrainerLoader:
    """The hetero_ray training loader as the Trainer sees it.

    Its length is a whole epoch's steps even when a restart continues mid-epoch: the
    Trainer derives its step schedule and the epoch it resumes in from it. Each ``iter()``
    runs the rest of the loader's epoch."""

    def __init__(self, loader, dataset):
        self.loader = loader
        self.dataset = dataset  # the Trainer's num_examples() reads len(dataloader.dataset)

    def __iter__(self):
        return iter(self.loader)

    def __len__(self) -> int:
        return self.loader.sampler.steps_per_epoch
