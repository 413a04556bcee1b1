"""Ray Train's torch process-group setup, driven from a controller that never imports torch.

Ray Train's controller holds the run's backend config, and ``TorchConfig`` lives in a
module that imports torch: every run's controller spent ~2.4 CPU-seconds importing torch
before it started a single worker (a fit's start: ~5 s in the controller, then the
workers). :class:`ControllerTorchConfig` carries the same three settings from a
torch-free module, and :class:`TorchBackendAtArmsLength` does what Ray's ``_TorchBackend``
does (Ray 2.60, ``ray/train/torch/config.py``) for CPU and GPU workers, asking the workers
to run Ray's own functions by name, so only the workers import torch.
``tests/test_lean_trainer.py`` fails if a controller imports torch again.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from typing import Optional

import ray
from ray._common.network_utils import build_address
from ray._private import ray_constants
from ray.exceptions import GetTimeoutError
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.constants import DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
from ray.train.v2._internal.util import TrainingFramework

logger = logging.getLogger(__name__)

RAY_TORCH_CONFIG = "ray.train.torch.config"


def _run_ray_torch(function_name: str, **kwargs):
    """On a worker: one of Ray's functions in ``ray.train.torch.config``."""
    return getattr(importlib.import_module(RAY_TORCH_CONFIG), function_name)(**kwargs)


def _set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


class TorchBackendAtArmsLength(Backend):
    """Ray's ``_TorchBackend`` for ``gloo`` and ``nccl`` process groups, torch on the workers only."""

    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group, backend_config: "ControllerTorchConfig") -> None:
        master_addr, master_port = worker_group.execute_single(0, get_address_and_port)
        if backend_config.init_method == "env":
            worker_group.execute(_set_master, addr=master_addr, port=master_port)
            url = "env://"
        elif backend_config.init_method == "tcp":
            url = f"tcp://{build_address(master_addr, master_port)}"
        else:
            raise ValueError(f"The provided init_method ({backend_config.init_method}) is not supported. "
                             f"Must be either 'env' or 'tcp'.")
        # LOCAL_RANK and the rest must be set before init_process_group.
        worker_group.execute(_run_ray_torch, function_name="_set_torch_distributed_env_vars")
        ray.get([worker_group.execute_single_async(
            rank, _run_ray_torch, function_name="_setup_torch_process_group", backend=backend_config.backend,
            world_rank=rank, world_size=len(worker_group), init_method=url, timeout_s=backend_config.timeout_s)
            for rank in range(len(worker_group))])

    def on_shutdown(self, worker_group, backend_config) -> None:
        futures = worker_group.execute_async(_run_ray_torch, function_name="_shutdown_torch",
                                             destroy_process_group=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                              DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logger.warning(f"Torch process group shutdown timed out after {timeout_s} seconds")


@dataclasses.dataclass
class ControllerTorchConfig(BackendConfig):
    """``TorchConfig``'s settings, with a backend already chosen (``gloo`` or ``nccl``)."""

    backend: str = "gloo"
    init_method: str = "env"
    timeout_s: int = 1800

    @classmethod
    def of(cls, torch_config) -> Optional["ControllerTorchConfig"]:
        """The same settings; None for a backend this does not drive (e.g. TPUs), which
        keeps Ray's own ``TorchConfig``."""
        if torch_config.backend not in ("gloo", "nccl"):
            return None
        return cls(backend=torch_config.backend, init_method=torch_config.init_method,
                   timeout_s=torch_config.timeout_s)

    @property
    def backend_cls(self):
        return TorchBackendAtArmsLength

    @property
    def train_func_context(self):
        # Read on the driver and run on the workers, which import torch anyway.
        return importlib.import_module(RAY_TORCH_CONFIG).TorchConfigContextManager

    @property
    def framework(self):
        return TrainingFramework.TORCH

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
