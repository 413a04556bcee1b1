"""The worker-side API's functions (re-exported by :mod:`hetero_ray.train`, where the
loop's contract is described): each finds the worker's hetero_ray session and hands it
to the part of :mod:`hetero_ray.training` that does the work. :mod:`hetero_ray.train.huggingface`
builds on them."""

from __future__ import annotations

from typing import Any, Optional

import ray.train
import torch

from hetero_ray.training.rank import session as _session


def prepare_model(model: torch.nn.Module, *, sync_batchnorm: bool = True,
                  ddp_kwargs: Optional[dict[str, Any]] = None) -> torch.nn.Module:
    """Moves ``model`` to this rank's device and wraps it in DDP with the ``b_i / B``
    gradient weighting and the busy-time clock (call once per worker).

    Args:
        sync_batchnorm: BatchNorm layers normalise with the statistics of the whole global
            batch, exactly as one device would (unequal local batches included), and keep
            identical running statistics on every rank. False keeps each rank's own
            statistics (and logs that the one-device promise no longer holds).
        ddp_kwargs: passed to ``DistributedDataParallel`` (e.g. ``find_unused_parameters``).

    Raises:
        UserError: not an ``nn.Module``, nothing to train, or called twice.
    """
    from hetero_ray.training.gradients.model_prep import prepare_model as prepare

    return prepare(_session.current("prepare_model"), model, sync_batchnorm=sync_batchnorm, ddp_kwargs=ddp_kwargs)


def prepare_data_loader(data, *, collate_fn=None, num_workers: int = 0, pin_memory: bool = False,
                        prefetch_factor: Optional[int] = None, shuffle: Optional[bool] = None,
                        drop_last: bool = False, move_to_device: bool = True, worker_init_fn=None,
                        evaluation: Optional[bool] = None):
    """This rank's piece of every global step of ``data`` under the plan in force; or, for
    evaluation, this rank's share of every sample once.

    ``data`` is any map-style dataset (``__len__`` and ``__getitem__``: a torchvision
    dataset, a Hugging Face ``datasets.Dataset``, your own), or a torch ``DataLoader`` over
    one, as ``ray.train.torch.prepare_data_loader`` takes. Each ``iter()`` runs the rest
    of one epoch; every sample is used exactly once per epoch across all ranks, also when
    the plan changes mid-epoch or the run restarts from a checkpoint (then the first
    ``iter()`` continues the checkpoint's epoch at its step: start your epoch loop at
    ``loader.epoch``). Batches come from a torch ``DataLoader`` with ``num_workers``
    worker processes that prefetch while the model computes. A batch that was only looked
    at (``next(iter(loader))``, a ``break`` before ``backward()``) is handed out again.

    A ``DataLoader`` gives its dataset, ``collate_fn``, ``num_workers``, ``pin_memory``,
    ``prefetch_factor``, ``worker_init_fn``, ``drop_last`` and whether it shuffles (its
    sampler must be the default one, or a ``DistributedSampler``). Its ``batch_size`` is
    per worker, as in Ray Train: for training each rank takes its share of
    ``HeteroConfig.global_batch_size`` instead, and rank 0 says what that means (a warning
    when ``batch_size × num_workers`` is not the global batch).

    The first call on a worker makes the training loader; every later call makes an
    evaluation loader, as Ray Train's examples prepare a training and a test loader. An
    evaluation loader gives rank ``r`` the samples ``r, r + n, r + 2n, …`` (torch's
    ``DistributedSampler`` split without its padding: every sample once across ranks), in
    batches of the DataLoader's ``batch_size`` (for a dataset, an equal share of the global
    batch); it follows no plan, records no step and waits for no other rank.

    Args:
        collate_fn, num_workers, pin_memory, prefetch_factor, worker_init_fn: as for
            ``torch.utils.data.DataLoader`` (with a DataLoader, set them on it instead).
        shuffle: a new seeded order every epoch (``HeteroConfig.seed``); None: True for a
            training dataset, False for an evaluation one, the DataLoader's own for one.
        drop_last: drop each epoch's last global batch when it is short.
        move_to_device: move the tensors of each batch to this rank's device.
        evaluation: True for an evaluation loader, False for the training loader; None
            decides by order (the first call trains).

    Raises:
        UserError: an iterable-style dataset, one without ``__len__``, one too small for a
            global batch, bad arguments, a DataLoader with its own sampler or options given
            beside it, or a second training loader on this worker.
    """
    from hetero_ray.training.data.loader_door import prepare

    options = {"collate_fn": collate_fn, "num_workers": num_workers, "pin_memory": pin_memory,
               "prefetch_factor": prefetch_factor, "shuffle": shuffle, "drop_last": drop_last,
               "worker_init_fn": worker_init_fn}
    return prepare(_session.current("prepare_data_loader"), data, options, move_to_device=move_to_device,
                   evaluation=evaluation)


def get_dataset_shard(dataset_name: Optional[str] = None):
    """A dataset given to ``HeteroTrainer(datasets=...)``, as ``ray.train.get_dataset_shard``.

    ``"train"`` follows the run's plan: each ``iter_torch_batches()`` / ``iter_batches()``
    runs the rest of one epoch, and yields at each global step this rank's share of the
    step's ``HeteroConfig.global_batch_size`` rows (every row once per epoch across the
    ranks, also across plan changes and a resume from a checkpoint: start your epoch loop
    at ``shard.epoch``). Its ``batch_size=`` is per worker, as in Ray Train, and says what
    the shares mean instead; ``device``, ``dtypes``, ``collate_fn``, ``drop_last``,
    ``local_shuffle_buffer_size`` (rows shuffled within blocks of that many, anew each
    epoch) and ``prefetch_batches`` are Ray Data's. Any other dataset is Ray Train's shard,
    for evaluation: every row once across the ranks.

    Args:
        dataset_name: the key in ``datasets``; may be left out when there is one.

    Raises:
        UserError: no dataset of that name, or bad iteration arguments (before any step).
    """
    from hetero_ray.training.data.dataset_shard import get_dataset_shard as shard

    return shard(_session.current("get_dataset_shard"), dataset_name)


def report(metrics: dict, checkpoint: Optional[ray.train.Checkpoint] = None) -> None:
    """``ray.train.report`` for hetero_ray: the metrics reach Ray Train's ``Result`` and the
    run's ``reports`` table; a checkpoint also carries the sampler position, the plan and
    the balancer's state (in its ``hetero_ray/`` folder), and the step records it covers
    are stored first. Every rank calls it the same number of times; pass the checkpoint
    from rank 0 (or from every rank)."""
    from hetero_ray.training.rank.loop_report import report as report_

    report_(_session.current("report"), metrics, checkpoint)


def get_checkpoint() -> Optional[ray.train.Checkpoint]:
    """The checkpoint this worker group resumes from (None on a fresh start): your files
    as you saved them, beside hetero_ray's ``hetero_ray/`` folder."""
    return _session.current("get_checkpoint").ray_train.get_checkpoint()


def get_context():
    """Ray Train's context (world rank, world size, local rank, …)."""
    session = _session._CURRENT
    return (session.ray_train if session is not None else ray.train).get_context()


def get_device() -> torch.device:
    """The device this rank trains on."""
    return _session.current("get_device").identity.device


def micro_batches(batch, *, max_size: Optional[int] = None):
    """``batch`` as micro-batches that fit this rank's memory: run forward and backward on
    each, and step the optimiser once, after the last::

        for x, y in loader:
            for mx, my in hetero_ray.train.micro_batches((x, y)):
                loss = loss_fn(model(mx), my)        # the MEAN over the micro-batch
                loss.backward()
            optimizer.step(); optimizer.zero_grad()

    With it, the planner gives each rank the share its speed calls for, even past the
    largest batch its device holds (its memory cap, measured by profiling the nodes with
    ``HeteroConfig.profile_model``): such a share comes as one batch from the loader and is
    cut here into nearly equal micro-batches no larger than the cap. The gradients
    accumulate on the rank and are all-reduced once, at the last backward pass, weighted
    so that the step is still the one device's step on the global batch. A batch within
    the cap comes back whole, at no cost, so the loop is the same for every rank. Until
    the first call (and for a model whose BatchNorm is synced, see below) the plan keeps
    every share within the caps.

    Each micro-batch is the batch's structure (a tensor, tuples, lists, dicts of them) with
    every tensor cut along its first dimension. Iterate all of them; call ``backward()`` on
    each, ``optimizer.step()`` only after the loop (GradScaler: ``scaler.scale(loss).backward()``
    on each, ``scaler.step``/``update`` after). :func:`token_weighted_loss` does not combine
    with micro-batches (it runs a collective per call).

    BatchNorm: hetero_ray's synced BatchNorm (``prepare_model``'s default) normalises with
    the statistics of the whole global batch, which micro-batches cannot keep; such a model
    is never cut, and its shares stay within the memory caps. With
    ``prepare_model(model, sync_batchnorm=False)`` it is cut, and each micro-batch is
    normalised with its own statistics (and updates the running statistics once).

    Args:
        max_size: the most samples per micro-batch; default: this rank's memory cap
            from the node profiles (no cap known: the batch comes back whole).

    Raises:
        UserError: no prepared model, a bad ``max_size``, ``max_size`` on a model with
            synced BatchNorm, a batch without tensors or with one that is not per sample,
            or a micro-batch left without a backward pass.
    """
    from hetero_ray.training.gradients.micro_batches import micro_batches as cut

    return cut(_session.current("micro_batches"), batch, max_size)


def is_probe_step() -> bool:
    """Whether the batch the training loader handed out last holds none of this rank's
    samples of the global batch: the rank runs a *probe* (the plan leaves it out, and it
    keeps its speed known on part of the step's window), or the one sample a short last
    window leaves it. Its gradient has weight 0, so training is untouched; what the loop
    does on the side is not::

        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward(); optimizer.step(); optimizer.zero_grad(); scheduler.step()
            if not hetero_ray.train.is_probe_step():
                samples_seen += len(x)              # counters, training metrics, an EMA
                ema.update(model)

    Step the scheduler (and the ``GradScaler``) on every step, as on any other rank: a rank
    left out receives rank 0's model, optimisers, schedulers and scalers when it is brought
    back, at the end of each epoch and before an evaluation loader runs. False outside the
    loader's steps and before ``prepare_data_loader``.
    """
    loader = _session.current("is_probe_step").parts.loader
    return loader is not None and loader.is_probe_step


def token_weighted_loss(loss_sum: torch.Tensor, num_tokens: int | torch.Tensor) -> torch.Tensor:
    """A per-token loss whose step is the mean over all tokens of the global batch.

    With sequences of different lengths, "the mean over the global batch" should count
    tokens, not samples. Given this rank's SUM of token losses and its token count ``t_i``,
    this returns ``loss_sum · B / (b_i · T)`` with ``T = Σ_j t_j`` (one all-reduce): after
    the gradient hook multiplies by ``b_i / B``, every rank contributes ``loss_sum / T``,
    and the step is the gradient of (Σ token losses) / T, as on one device. Every rank
    must call it at every step.
    """
    from hetero_ray.training.gradients.token_loss import token_weighted_loss as weighted

    return weighted(_session.current("token_weighted_loss"), loss_sum, num_tokens)
