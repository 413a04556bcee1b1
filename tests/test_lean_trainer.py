"""The run's TorchTrainer (runtime/torch_trainer.py): its controller starts no dataset-manager
process without datasets, and imports no torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import ray.cloudpickle
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig
from ray.train.v2._internal.callbacks.backend_setup import BackendSetupCallback
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.data_integration.interfaces import DatasetShardMetadata

from hetero_ray.runtime.cluster_view import ClusterViewRefresh
from hetero_ray.runtime.datasets_callback import DatasetsCallbackWithoutManager, NoDatasets
from hetero_ray.runtime.failures import RunGuard
from hetero_ray.runtime.ray_data import RunDatasets
from hetero_ray.runtime.torch_backend import ControllerTorchConfig, TorchBackendAtArmsLength
from hetero_ray.runtime.torch_trainer import LeanTorchTrainer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _loop():
    pass


def _trainer(datasets=None, **kwargs) -> LeanTorchTrainer:
    return LeanTorchTrainer(_loop, scaling_config=ScalingConfig(num_workers=2), datasets=datasets,
                            run_config=RunConfig(name="lean", storage_path="/tmp",
                                                 callbacks=[RunGuard("lean"), ClusterViewRefresh()]), **kwargs)


def _dataset_callbacks(datasets):
    return [c for c in _trainer(datasets)._create_default_callbacks() if isinstance(c, DatasetsCallback)]


def test_the_dataset_callback_is_replaced_once():
    """Ray Train still builds the callback this replaces (an upgrade that drops it fails here)."""
    callbacks = _dataset_callbacks(None)
    assert [type(c) for c in callbacks] == [DatasetsCallbackWithoutManager]


def test_without_datasets_every_worker_gets_the_provider_that_needs_no_process():
    (callback,) = _dataset_callbacks(None)
    providers = callback.before_init_train_context(workers=[object(), object()])["dataset_shard_provider"]
    assert len(providers) == 2 and all(isinstance(p, NoDatasets) for p in providers)
    with pytest.raises(KeyError, match="'train' not found: the trainer was given no datasets"):
        providers[0].get_dataset_shard(DatasetShardMetadata(dataset_name="train", world_rank=0))


@pytest.mark.parametrize("torch_config, use_gpu, backend", [
    (None, False, "gloo"), (None, True, "nccl"), (TorchConfig(backend="gloo", timeout_s=60), True, "gloo")])
def test_the_process_group_settings_reach_the_controller_as_given(torch_config, use_gpu, backend):
    trainer = LeanTorchTrainer(_loop, torch_config=torch_config,
                               scaling_config=ScalingConfig(num_workers=2, use_gpu=use_gpu))
    config = trainer.backend_config
    assert config == ControllerTorchConfig(backend=backend, init_method="env",
                                           timeout_s=torch_config.timeout_s if torch_config else 1800)
    assert trainer.train_run_context.backend_config is config
    setup = [c for c in trainer._create_default_callbacks() if isinstance(c, BackendSetupCallback)]
    assert len(setup) == 1 and isinstance(setup[0]._backend, TorchBackendAtArmsLength)
    assert config.train_func_context.__name__ == "TorchConfigContextManager"  # Ray's, run on the workers


def test_a_backend_it_does_not_drive_keeps_rays_torch_config():
    trainer = LeanTorchTrainer(_loop, torch_config=TorchConfig(backend="tpu_dist"),
                               scaling_config=ScalingConfig(num_workers=2))
    assert type(trainer.backend_config) is TorchConfig


def test_what_the_controller_unpickles_imports_no_torch(tmp_path):
    """Ray Train's controller gets the default callbacks and the run context; importing torch
    to unpickle them cost every run's start ~2.4 CPU-seconds before any worker started. The
    run context carries HeteroTrainer's dataset config, whose module once reached torch too."""
    trainer = _trainer(dataset_config=RunDatasets(None).data_config())
    pickled = tmp_path / "controller_parts.pkl"
    pickled.write_bytes(ray.cloudpickle.dumps((trainer._create_default_callbacks(), trainer.train_run_context)))
    _assert_loads_none_of("import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read())", str(pickled),
                          heavy=("torch",))


@pytest.mark.parametrize("start", [
    "from hetero_ray.runtime.planner_actor import PlannerActor; "
    "PlannerActor(None, run_dir, launch_id='l', global_batch_size=8, policy='optimal', rebalance_interval=20)",
    "from hetero_ray.metrics.store import MetricsStore; MetricsStore(run_dir, 'e')",
], ids=["planner", "metrics store"])
def test_the_runs_own_actors_start_without_torch_or_ray_train(start, tmp_path):
    """The planner and the metrics store are a process each in every run; a name imported
    from the workers' modules once made the planner import torch, Ray Train and Ray Data
    (~2 CPU-seconds of each run's start on a loaded machine)."""
    _assert_loads_none_of(f"import sys; run_dir = sys.argv[1]; {start}", str(tmp_path),
                          heavy=("torch", "ray.train", "ray.data"))


def _assert_loads_none_of(code: str, argument: str, heavy: tuple[str, ...]) -> None:
    """Runs ``code`` in a fresh Python (``argument`` as sys.argv[1]) and checks that it
    loaded no module whose name starts with one of ``heavy`` (torch: torchvision too)."""
    check = f"{code}; import sys; print(sorted(m for m in sys.modules if m.startswith({heavy!r})))"
    out = subprocess.run([sys.executable, "-c", check, argument], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=REPO_ROOT), check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]
