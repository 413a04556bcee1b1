"""Ray Train's ``TorchTrainer``, less one process when the run gives it no Ray Dataset.

Ray Train starts a ``DatasetManager`` actor for every worker group, datasets or not: a
process that imports Ray Data (~1.5 CPU-seconds) while the workers import torch beside
it. A run without ``datasets`` gets a provider that needs no process and answers
``get_dataset_shard`` as Ray Train's would for an unknown name. With datasets, nothing
changes. ``tests/test_lean_trainer.py`` fails if Ray Train stops building the callback
this replaces (its hook is internal; Ray is pinned to 2.60.x).
"""

from __future__ import annotations

from ray.train.torch import TorchTrainer
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback


class NoDatasets:
    """The shard provider of a run without datasets: every name is unknown."""

    def get_dataset_shard(self, dataset_info):
        raise KeyError(f"Dataset shard for {dataset_info.dataset_name!r} not found: the trainer was given no "
                       "datasets; pass them as HeteroTrainer(datasets={...})")


class _DatasetsCallbackWithoutManager(DatasetsCallback):
    """Ray Train's callback, which starts its dataset manager only when there are datasets."""

    def before_init_train_context(self, workers):
        if self._datasets:
            return super().before_init_train_context(workers)
        return {"dataset_shard_provider": [NoDatasets()] * len(workers)}


class LeanTorchTrainer(TorchTrainer):
    """``TorchTrainer`` whose dataset callback starts no process for a run without datasets."""

    def _create_default_callbacks(self):
        callbacks = super()._create_default_callbacks()
        return [_DatasetsCallbackWithoutManager(train_run_context=self.train_run_context, datasets=self.datasets)
                if type(callback) is DatasetsCallback else callback for callback in callbacks]
