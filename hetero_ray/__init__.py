"""hetero_ray: data-parallel PyTorch training on heterogeneous Ray clusters.

Each rank trains on a share of the global batch that matches its measured speed; the
gradient is weighted so that training follows the same mathematics as one device on the
whole batch.

Bring your own loop, in Ray Train's shape: :class:`HeteroTrainer` (driver side, like
``TorchTrainer``) with :class:`HeteroConfig` (and a :class:`ProfileModel` to profile the
nodes with your model before the first step), and :mod:`hetero_ray.train` inside the loop
(``prepare_model``, ``prepare_data_loader``, ``report``). Or the built-in models and
datasets: ``hetero-ray train --help``.
"""

from hetero_ray.torch_range import check_torch_version as _check_torch_version
from hetero_ray.torch_range import installed_torch_version as _installed_torch_version

__version__ = "0.1.0"

if (_torch := _installed_torch_version()) is not None:
    _check_torch_version(_torch)

__all__ = ["HeteroConfig", "HeteroTrainer", "ProfileModel"]


def __getattr__(name):
    # Lazy: importing hetero_ray (e.g. for hetero_ray.train inside a worker) must not pull
    # in the driver side.
    if name == "HeteroTrainer":
        from hetero_ray.trainer import HeteroTrainer

        return HeteroTrainer
    if name == "HeteroConfig":
        from hetero_ray.hetero_config import HeteroConfig

        return HeteroConfig
    if name == "ProfileModel":
        from hetero_ray.profiling.recipe import ProfileModel

        return ProfileModel
    raise AttributeError(f"module 'hetero_ray' has no attribute {name!r}")
