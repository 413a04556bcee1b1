"""What ``hetero_ray.train.prepare_data_loader`` makes of what it is given: a dataset or a
torch ``DataLoader``, for training or for evaluation.

- A ``DataLoader`` (what ``ray.train.torch.prepare_data_loader`` takes) gives its dataset,
  ``collate_fn``, ``num_workers``, ``pin_memory``, ``prefetch_factor``, ``worker_init_fn``,
  ``drop_last``, and whether its sampler shuffles. Its ``batch_size`` is per worker, as in
  Ray Train; for training each rank takes its share of ``HeteroConfig.global_batch_size``
  instead, and rank 0 says so once (see :func:`say_batch_size`).
- The first call on a worker makes the training loader, which follows the run's plan
  (:mod:`hetero_ray.training.data.loader`); later ones make evaluation loaders
  (:mod:`hetero_ray.training.data.evaluation_loader`), as Ray Train's examples call
  ``prepare_data_loader`` once for the training and once for the test loader.
  ``evaluation=True`` / ``False`` says which, whatever the order.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from hetero_ray.errors import UserError
from hetero_ray.training.data.evaluation_loader import EvaluationLoader
from hetero_ray.training.data.loader import check_map_style, check_workers, make_loader
from hetero_ray.training.rank.session import WorkerSession

logger = logging.getLogger("hetero_ray.worker")

# The data options of prepare_data_loader and their defaults: with a DataLoader they come
# from it, and one given beside it would be silently overridden by one or the other.
DATA_OPTION_DEFAULTS = {"collate_fn": None, "num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                        "shuffle": None, "drop_last": False, "worker_init_fn": None}


def prepare(session: WorkerSession, data, options: dict[str, Any], *, move_to_device: bool,
            evaluation: Optional[bool]):
    if evaluation not in (None, True, False):
        raise UserError(f"prepare_data_loader(evaluation=...) must be True, False or None, got {evaluation!r}")
    batch_size = None
    if isinstance(data, DataLoader):
        data, options, batch_size = _unpack(data, options)
    if evaluation is None:
        evaluation = session.parts.loader is not None
        if evaluation:
            _say_implicit_evaluation(session)
    if options["shuffle"] is None:  # a dataset: training shuffles, evaluation keeps its order
        options = {**options, "shuffle": not evaluation}
    if evaluation:
        return _evaluation_loader(session, data, options, batch_size, move_to_device)
    loader = make_loader(session, data, move_to_device=move_to_device, **options)
    if batch_size is not None:
        say_batch_size(session, batch_size)
    return loader


def _unpack(loader: DataLoader, given: dict[str, Any]) -> tuple[Any, dict[str, Any], Optional[int]]:
    """The dataset, data options and per-worker batch size of a torch ``DataLoader``."""
    clashing = [name for name, default in DATA_OPTION_DEFAULTS.items() if given[name] is not default
                and given[name] != default]
    if clashing:
        raise UserError(f"prepare_data_loader(DataLoader, {', '.join(f'{n}=...' for n in clashing)}): with a "
                        "DataLoader these come from the DataLoader itself; set them there")
    if loader.batch_size is None:
        raise UserError("prepare_data_loader needs a DataLoader with a batch_size: one with its own batch_sampler "
                        "(or batch_size=None) cannot be split by sample; pass DataLoader(dataset, batch_size=..., "
                        "shuffle=...) or the dataset itself")
    return loader.dataset, {
        "collate_fn": loader.collate_fn, "num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
        "prefetch_factor": loader.prefetch_factor if loader.num_workers > 0 else None,
        "shuffle": _shuffles(loader.sampler), "drop_last": loader.drop_last, "worker_init_fn": loader.worker_init_fn,
    }, loader.batch_size


def _shuffles(sampler) -> bool:
    """Whether a DataLoader's sampler shuffles; hetero_ray then draws its own seeded order.

    Ray Train replaces any sampler by a DistributedSampler; here one that picks samples in
    its own way (weighted, a subset, with replacement) is refused, since replacing it
    would silently train on other samples than the user chose."""
    if isinstance(sampler, DistributedSampler):
        return sampler.shuffle
    if isinstance(sampler, SequentialSampler):
        return False
    if isinstance(sampler, RandomSampler) and not sampler.replacement and sampler._num_samples is None:
        return True
    raise UserError(f"prepare_data_loader cannot follow the DataLoader's {type(sampler).__name__}: hetero_ray "
                    "picks each rank's share of every global step itself, from all samples once per epoch; use "
                    "DataLoader(dataset, batch_size=..., shuffle=True or False), or pick the samples in the dataset")


def say_batch_size(session: WorkerSession, batch_size: int, whose: str = "prepare_data_loader: the DataLoader's") -> None:
    """Rank 0 says once what the DataLoader's per-worker ``batch_size`` becomes.

    Not an error when ``batch_size × num_workers`` differs from the global batch: with
    elastic training (``ScalingConfig(num_workers=(min, max))``) the number of workers
    changes from one worker group to the next while the global batch — the one number
    that fixes the mathematics of a step — stays; and on a mixed cluster the ranks' shares
    differ by design. A different product is likely a port that forgot to set
    ``HeteroConfig.global_batch_size``, so it is said as a warning, with what to set."""
    n, global_batch = session.identity.num_workers, session.settings.global_batch_size
    product = batch_size * n
    if product == global_batch:
        session.log(f"{whose} batch_size {batch_size} per worker × {n} workers is "
                    f"HeteroConfig.global_batch_size {global_batch}; each rank takes its share of every global "
                    "batch, sized to its device's speed")
    elif session.identity.rank == 0:
        logger.warning(f"{whose} batch_size {batch_size} per worker × {n} workers = "
                       f"{product}, but HeteroConfig.global_batch_size is {global_batch}: each step trains on "
                       f"{global_batch} samples, every rank taking its share (sized to its device's speed); set "
                       f"HeteroConfig(global_batch_size={product}) to keep the DataLoader's step")


def _say_implicit_evaluation(session: WorkerSession) -> None:
    session.log("prepare_data_loader: the training loader exists, so this one is an evaluation loader: each rank "
                "takes every n-th sample (every sample once across ranks), with no plan and no step records "
                "(pass evaluation=True to say so)")


def _evaluation_loader(session: WorkerSession, dataset, options: dict[str, Any], batch_size: Optional[int],
                       move_to_device: bool) -> EvaluationLoader:
    check_map_style(dataset)
    check_workers(options["num_workers"], options["prefetch_factor"])
    identity = session.identity
    if batch_size is None:  # a dataset: the batches of an equal share of the global batch
        batch_size = max(1, math.ceil(session.settings.global_batch_size / identity.num_workers))
    return EvaluationLoader(
        dataset, rank=identity.rank, num_workers=identity.num_workers, device=identity.device,
        batch_size=batch_size, shuffle=options["shuffle"], seed=session.settings.seed,
        collate_fn=options["collate_fn"], loader_workers=options["num_workers"], pin_memory=options["pin_memory"],
        prefetch_factor=options["prefetch_factor"], drop_last=options["drop_last"], move_to_device=move_to_device,
        worker_init_fn=options["worker_init_fn"], before_iteration=session.parts.copy_state_to_left_out_ranks,
    )
