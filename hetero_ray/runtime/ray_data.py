"""``HeteroTrainer(datasets=..., dataset_config=...)``: which Ray Data datasets follow the
plan and which Ray Train splits for evaluation, checked before anything starts.

``"train"`` is read by the run's feed actor (:mod:`hetero_ray.runtime.data_feed`) and
handed out at each rank's share; Ray Train never sees it. Every other dataset goes to the
``TorchTrainer`` as Ray Train's own, split by :class:`EvaluationDataConfig`: every row once
across the ranks (``streaming_split(equal=False)``), where Ray Train's ``DataConfig``
would trim every split to the shortest (``equal=True``) and leave rows unevaluated.
"""

from __future__ import annotations

from typing import Any, Optional

from ray.data import Dataset
from ray.train import DataConfig

from hetero_ray.constants import TRAIN_DATASET
from hetero_ray.errors import ConfigError


class RunDatasets:
    """The datasets of a run, checked: ``feeds`` follow the plan, ``evaluation`` go to Ray Train."""

    def __init__(self, datasets: Optional[dict], dataset_config: Any = None):
        datasets = {} if datasets is None else datasets
        if not isinstance(datasets, dict):
            raise ConfigError(f"datasets must be a dict of name → ray.data.Dataset, got {type(datasets).__name__}")
        for name, dataset in datasets.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"datasets: each name must be a non-empty string, got {name!r}")
            if not isinstance(dataset, Dataset):
                raise ConfigError(f"datasets[{name!r}] must be a ray.data.Dataset, got {type(dataset).__name__} "
                                  "(a torch dataset goes through hetero_ray.train.prepare_data_loader in the loop)")
        if dataset_config is None:
            dataset_config = DataConfig()
        if type(dataset_config) is not DataConfig:
            raise ConfigError(f"dataset_config must be a ray.train.DataConfig, got {type(dataset_config).__name__}: "
                              "a subclass that splits the data itself cannot follow the run's plan")
        to_split = dataset_config._datasets_to_split
        to_split = set(datasets) if to_split == "all" else set(to_split)
        unknown = sorted(to_split - set(datasets))
        if unknown:
            raise ConfigError(f"DataConfig(datasets_to_split=...) names {unknown}, which datasets= does not have "
                              f"(it has {sorted(datasets)})")
        if TRAIN_DATASET in datasets and dataset_config._datasets_to_split != "all" \
                and TRAIN_DATASET not in to_split:
            raise ConfigError("DataConfig(datasets_to_split=...) leaves out 'train', but the 'train' dataset always "
                              "follows the run's plan (each rank reads its share of every global batch); put it in "
                              "datasets_to_split, or give the dataset another name to read it whole on every rank")
        self.feeds = {name: _with_options(d, dataset_config, name) for name, d in datasets.items()
                      if name == TRAIN_DATASET}
        self.evaluation = {name: d for name, d in datasets.items() if name != TRAIN_DATASET}
        self._to_split = sorted(to_split - {TRAIN_DATASET})
        self._execution_options = dataset_config._user_execution_options
        self._locality = dataset_config._enable_shard_locality

    def data_config(self):
        """Ray Train's ``dataset_config`` for the evaluation datasets."""
        return EvaluationDataConfig(datasets_to_split=self._to_split, execution_options=self._execution_options,
                                    enable_shard_locality=self._locality)


def _with_options(dataset: Dataset, config: DataConfig, name: str) -> Dataset:
    """The dataset with the execution options Ray Train would read it with (the feed adds
    ``preserve_order``)."""
    dataset = dataset.copy(dataset)
    dataset.context.execution_options = config._resolve_execution_options(name)
    return dataset


class EvaluationDataConfig(DataConfig):
    """Ray Train's ``DataConfig``, with splits that keep every row once (see the module)."""

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        output = [{} for _ in range(world_size)]
        for name, dataset in datasets.items():
            if dataset.name is None:
                dataset.set_name(name)
            dataset = dataset.copy(dataset)
            dataset.context.execution_options = self._resolve_execution_options(name)
            if name in self._datasets_to_split:
                splits = dataset.streaming_split(world_size, equal=False, locality_hints=worker_node_ids)
                for rank, split in enumerate(splits):
                    output[rank][name] = split
            else:
                for rank in range(world_size):
                    output[rank][name] = dataset.iterator()
        return output
