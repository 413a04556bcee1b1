"""The training data of a Lightning Trainer on hetero shares: the DataLoader its
LightningModule or LightningDataModule returns, driven by hetero_ray's plan-following loader.

Lightning asks its fit loop's data source for the training DataLoader, then injects a
``DistributedSampler`` into any ``DataLoader`` (equal shares). The source is swapped for
one that hands back hetero_ray's loader instead: not a ``DataLoader``, so Lightning leaves
its sampling alone, and made once per worker (a reload of the data hands the same loader
back; it continues where it is).

How Lightning's loop meets the loader:

- Lightning knows the length (a whole epoch's steps, also when a restart continues mid
  epoch: Lightning counts the steps its checkpoint says were done), so it fetches each
  batch just before its step and never ahead: the loader's step is the step the model
  trains.
- Lightning stops asking after the epoch's last batch, so the loader never hears that it
  ended: :class:`EpochEnd` (added by the strategy) finishes the step and gives a rank left
  out rank 0's state, as the loader does at the end of its own iteration.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.connectors.data_connector import _DataLoaderSource

from hetero_ray.errors import UserError


def follow_the_plan(trainer) -> None:
    """Makes ``trainer`` train on hetero_ray's loader (idempotent)."""
    source = trainer.fit_loop._data_source
    if not isinstance(source, _PlanFollowingSource):
        # In place: each fit() points this very object at its module or datamodule (Lightning's
        # private source class, which the extra's pinned range keeps).
        source.__class__ = _PlanFollowingSource
    if not any(isinstance(c, EpochEnd) for c in trainer.callbacks):
        trainer.callbacks.insert(0, EpochEnd())


class _PlanFollowingSource(_DataLoaderSource):
    """The fit loop's source of training data, whose DataLoader becomes hetero_ray's loader."""

    def dataloader(self):
        from hetero_ray.training.rank import session

        parts = session.current("lightning.RayDDPStrategy").parts
        if parts.loader is None:
            given = super().dataloader()
            # train_dataloader() may prepare the loader itself (hetero_ray.train.prepare_data_loader).
            if given is not parts.loader:
                _prepared(given)
        return TrainingLoader(parts.loader)


def _prepared(given) -> None:
    from torch.utils.data import DataLoader

    from hetero_ray.train.worker import prepare_data_loader

    if not isinstance(given, DataLoader):
        raise UserError(f"train_dataloader() returned {type(given).__name__}: on hetero shares it must return one "
                        "torch DataLoader (over a map-style dataset), which hetero_ray splits between the ranks by "
                        "their speed; combine several datasets into one Dataset")
    prepare_data_loader(given, evaluation=False)


class TrainingLoader:
    """hetero_ray's training loader as Lightning's fit loop sees it: each ``iter()`` runs
    the rest of the loader's epoch; the length is always the whole epoch's steps."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)

    def __len__(self) -> int:
        return self.loader.sampler.steps_per_epoch

    # Stateful for Lightning (no warning on a mid-epoch resume): the position itself is in
    # hetero_ray's part of every checkpoint.
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


def training_loader():
    """The worker's hetero_ray training loader, or None before one is made."""
    from hetero_ray.training.rank import session

    return session.current("lightning").parts.loader


def finish_epoch_step() -> bool:
    """Records the step in progress (its optimizer step is done); whether it was the last
    of its epoch. Every rank decides alike."""
    loader = training_loader()
    if loader is None:
        return True
    loader.finish_step()
    return loader.position.step == 0


class EpochEnd(Callback):
    """The end of an epoch (or of ``fit``) that the loader does not see (module docstring)."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        from hetero_ray.training.rank import session

        finish_epoch_step()
        session.current("lightning").parts.copy_state_to_left_out_ranks()
