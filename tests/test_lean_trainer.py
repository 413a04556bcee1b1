"""The run's TorchTrainer starts no dataset-manager process without datasets (runtime/torch_trainer.py)."""

from __future__ import annotations

import pytest
from ray.train import RunConfig, ScalingConfig
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.data_integration.interfaces import DatasetShardMetadata

from hetero_ray.runtime.torch_trainer import LeanTorchTrainer, NoDatasets, _DatasetsCallbackWithoutManager


def _loop():
    pass


def _dataset_callbacks(datasets):
    trainer = LeanTorchTrainer(_loop, scaling_config=ScalingConfig(num_workers=2), datasets=datasets,
                               run_config=RunConfig(name="lean", storage_path="/tmp"))
    return [c for c in trainer._create_default_callbacks() if isinstance(c, DatasetsCallback)]


def test_the_dataset_callback_is_replaced_once():
    """Ray Train still builds the callback this replaces (an upgrade that drops it fails here)."""
    callbacks = _dataset_callbacks(None)
    assert [type(c) for c in callbacks] == [_DatasetsCallbackWithoutManager]


def test_without_datasets_every_worker_gets_the_provider_that_needs_no_process():
    (callback,) = _dataset_callbacks(None)
    providers = callback.before_init_train_context(workers=[object(), object()])["dataset_shard_provider"]
    assert len(providers) == 2 and all(isinstance(p, NoDatasets) for p in providers)
    with pytest.raises(KeyError, match="'train' not found: the trainer was given no datasets"):
        providers[0].get_dataset_shard(DatasetShardMetadata(dataset_name="train", world_rank=0))
