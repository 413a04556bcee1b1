"""hetero_ray: data-parallel PyTorch training on heterogeneous Ray clusters.

Each rank trains on a share of the global batch that matches its measured speed; the
gradient is weighted so that training follows the same mathematics as one device on the
whole batch. Start with ``hetero-ray train --help`` or :func:`hetero_ray.train`.
"""

__version__ = "0.1.0"


def train(config):
    """Runs a training job from a :class:`hetero_ray.config.TrainConfig`; returns its RunResult."""
    from hetero_ray.runtime.driver import run_training

    return run_training(config)
