"""Which device a worker trains on.

Three modes, decided by the driver for the whole job:

- ``gpu``: every worker asked Ray for a GPU; Ray sets ``CUDA_VISIBLE_DEVICES`` and Ray
  Train names the device.
- ``cpu``: no worker uses a GPU, even on a machine that has some.
- ``mixed``: GPU and CPU workers in one job. One ``TorchTrainer`` gives every worker the
  same resources, so none asked for a GPU and Ray left ``CUDA_VISIBLE_DEVICES`` unset:
  each worker sees every GPU of its node. The node's ``hetero-ray.io/device`` label says
  which kind this worker is; a GPU worker takes the GPU of its local rank, a CPU worker
  hides all GPUs from itself so it never initialises CUDA on them.

The decision is a pure function (:func:`choose_device`), tested with fake nodes; the
worker applies it with :func:`apply_device_choice`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

GPU, CPU = "gpu", "cpu"
DEVICE_MODES = ("gpu", "cpu", "mixed")


@dataclass(frozen=True)
class DeviceChoice:
    kind: str  # "gpu" | "cpu"
    cuda_index: Optional[int] = None  # within the GPUs this process sees
    hide_gpus: bool = False  # set CUDA_VISIBLE_DEVICES="" before CUDA is touched
    warning: Optional[str] = None


def choose_device(mode: str, node_device_label: Optional[str], local_rank: int,
                  cuda_device_count: int) -> DeviceChoice:
    """The device for one worker.

    Args:
        mode: the job's device mode (see the module docstring).
        node_device_label: this node's ``hetero-ray.io/device`` label, if any.
        local_rank: this worker's index among the job's workers on the same node.
        cuda_device_count: GPUs this process can see.
    """
    if mode not in DEVICE_MODES:
        raise ValueError(f"device mode must be one of {DEVICE_MODES}, got {mode!r}")
    if mode == "cpu":
        return DeviceChoice(CPU, hide_gpus=cuda_device_count > 0)
    if mode == "gpu":
        return DeviceChoice(GPU, cuda_index=None)  # Ray assigned it: ray.train.torch.get_device()
    if node_device_label != GPU:
        return DeviceChoice(CPU, hide_gpus=cuda_device_count > 0)
    if cuda_device_count == 0:
        return DeviceChoice(CPU, warning="this node is labelled hetero-ray.io/device=gpu but no CUDA device "
                                         "is visible; training on the CPU")
    if local_rank >= cuda_device_count:
        return DeviceChoice(CPU, hide_gpus=True,
                            warning=f"local rank {local_rank} but only {cuda_device_count} GPU(s) on this node; "
                                    "training on the CPU")
    return DeviceChoice(GPU, cuda_index=local_rank)


def apply_device_choice(choice: DeviceChoice):
    """Makes the choice real in this process and returns the torch device."""
    import torch

    if choice.hide_gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before the first CUDA call of this process
    if choice.kind == CPU:
        return torch.device("cpu")
    if choice.cuda_index is None:
        import ray.train.torch

        return ray.train.torch.get_device()
    torch.cuda.set_device(choice.cuda_index)
    return torch.device("cuda", choice.cuda_index)


def node_device_label() -> Optional[str]:
    """This worker's node's ``hetero-ray.io/device`` label (None when unlabelled)."""
    import ray

    from hetero_ray.constants import DEVICE_LABEL

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return (node.get("Labels") or {}).get(DEVICE_LABEL)
    return None
