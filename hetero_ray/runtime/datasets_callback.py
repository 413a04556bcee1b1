"""Ray Train's dataset callback, less one process when the run gives it no Ray Dataset.

Ray Train starts a ``DatasetManager`` actor for every worker group, datasets or not: a
process that imports Ray Data (~1.5 CPU-seconds) while the workers import torch beside
it. A run without ``datasets`` gets a provider that needs no process and answers
``get_dataset_shard`` as Ray Train's would for an unknown name. With datasets, nothing
changes. The controller unpickles this module: it must not import torch.
"""

from __future__ import annotations

from ray.train.v2._internal.callbacks.datasets import DatasetsCallback


class NoDatasets:
    """The shard provider of a run without datasets: every name is unknown."""

    def get_dataset_shard(self, dataset_info):
        raise KeyError(f"Dataset shard for {dataset_info.dataset_name!r} not found: the trainer was given no "
                       "datasets; pass them as HeteroTrainer(datasets={...})")


class DatasetsCallbackWithoutManager(DatasetsCallback):
    """Ray Train's callback, which starts its dataset manager only when there are datasets."""

    def before_init_train_context(self, workers):
        if self._datasets:
            return super().before_init_train_context(workers)
        return {"dataset_shard_provider": [NoDatasets()] * len(workers)}
