"""Ray Train's ``TorchTrainer`` with a lighter controller: no dataset-manager process for a
run without Ray Datasets (``runtime/datasets_callback.py``), and no torch import in the
controller (``runtime/torch_backend.py``). ``tests/test_lean_trainer.py`` fails if Ray Train
stops building the parts this replaces (their hooks are internal; Ray is pinned to 2.60.x).
"""

from __future__ import annotations

import dataclasses

from ray.train.torch import TorchTrainer
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

from hetero_ray.runtime.datasets_callback import DatasetsCallbackWithoutManager
from hetero_ray.runtime.torch_backend import ControllerTorchConfig


class LeanTorchTrainer(TorchTrainer):
    """``TorchTrainer`` whose controller starts no dataset manager for a run without datasets
    and sets up the process group without importing torch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # TorchTrainer chooses the backend (gloo or nccl)
        controller_config = ControllerTorchConfig.of(self.backend_config)
        if controller_config is not None:
            self.backend_config = controller_config
            # A frozen dataclass; the copy draws a new run id, which nothing has seen yet.
            self.train_run_context = dataclasses.replace(self.train_run_context, backend_config=controller_config)

    def _create_default_callbacks(self):
        callbacks = super()._create_default_callbacks()
        return [DatasetsCallbackWithoutManager(train_run_context=self.train_run_context, datasets=self.datasets)
                if type(callback) is DatasetsCallback else callback for callback in callbacks]
