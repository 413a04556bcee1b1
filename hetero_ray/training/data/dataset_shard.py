"""``hetero_ray.train.get_dataset_shard(name)``: the Ray Data datasets given to
``HeteroTrainer(datasets=...)``, inside the loop.

- ``"train"`` follows the run's plan: each ``iter_torch_batches()`` / ``iter_batches()``
  runs the rest of one epoch, and at each global step yields this rank's share of that
  step's global batch (``HeteroConfig.global_batch_size`` rows), read from the run's feed
  (:mod:`hetero_ray.runtime.data_feed`) by the training loader that also serves
  ``prepare_data_loader`` (:mod:`hetero_ray.training.data.loader`): plan changes mid-epoch,
  ranks left out and brought back, the short last window, the resume at the checkpoint's
  step and the sample-id audit (positions in the epoch's order) are the same.
- Every other dataset is Ray Train's shard (``streaming_split(equal=False)``: every row
  once across the ranks, as each rank asks for them), for evaluation; before it is read,
  a rank left out receives rank 0's state, as before an evaluation loader.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from hetero_ray.errors import UserError
from hetero_ray.runs.records import RAY_DATA_SOURCE_PREFIX
from hetero_ray.training.data.loader_door import say_batch_size
from hetero_ray.training.rank.answers import answer
from hetero_ray.training.rank.session import WorkerSession

_FEED_TIMEOUT_S = 600.0  # a first request counts the rows: the pipeline runs once


def get_dataset_shard(session: WorkerSession, name: Optional[str]):
    names = [*session.data_feeds, *(session.settings.evaluation_datasets or ())]
    if name is None and len(names) == 1:
        name = names[0]
    if name not in names:
        given = ", ".join(repr(n) for n in names) or "none"
        raise UserError(f"hetero_ray.train.get_dataset_shard({name!r}): HeteroTrainer(datasets=...) has no dataset "
                        f"of that name (given: {given}); pass the name of one of them")
    if name in session.data_feeds:
        shards = session.shards
        if name not in shards:
            shards[name] = PlanFollowingShard(session, name, session.data_feeds[name])
        return shards[name]
    return EvaluationShard(session, session.ray_train.get_dataset_shard(name))


class PlanFollowingShard:
    """This rank's share of every global step of the training dataset (see the module)."""

    def __init__(self, session: WorkerSession, name: str, feed):
        self._session = session
        self._name = name
        self._feed = feed
        self._loader = None
        self._order: Optional[tuple] = None  # (drop_last, shuffle block, seed) of the first iteration
        self._convert: Callable[[dict], Any] = _numpy

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs (after a restart, the checkpoint's)."""
        return self._loader.epoch if self._loader is not None else self._session.restored_position.epoch

    def iter_torch_batches(self, *, batch_size: Optional[int] = None, dtypes=None, device: Any = "auto",
                           collate_fn: Optional[Callable[[dict], Any]] = None, drop_last: bool = False,
                           local_shuffle_buffer_size: Optional[int] = None, local_shuffle_seed: Optional[int] = None,
                           prefetch_batches: int = 1) -> Iterator[Any]:
        """One epoch (the rest of it) of this rank's shares as dicts of tensors on this
        rank's device; ``collate_fn`` takes each share's dict of numpy arrays instead.

        ``batch_size`` is per worker, as in Ray Train: each rank takes its share of
        ``HeteroConfig.global_batch_size`` instead, and rank 0 says what that means.
        ``local_shuffle_buffer_size`` shuffles the rows within blocks of that many
        positions, anew each epoch (seeded with ``local_shuffle_seed``, default
        ``HeteroConfig.seed``)."""
        move = self._device_moves(device)
        if collate_fn is not None and dtypes is not None:
            raise UserError("iter_torch_batches(collate_fn=..., dtypes=...): the collate_fn makes the tensors; "
                            "set their dtypes there")
        convert = collate_fn if collate_fn is not None else (lambda columns: _tensors(columns, dtypes))
        return self._epoch(convert, move, batch_size, drop_last, local_shuffle_buffer_size, local_shuffle_seed,
                           prefetch_batches)

    def iter_batches(self, *, batch_size: Optional[int] = None, batch_format: str = "default",
                     drop_last: bool = False, local_shuffle_buffer_size: Optional[int] = None,
                     local_shuffle_seed: Optional[int] = None, prefetch_batches: int = 1) -> Iterator[Any]:
        """As :meth:`iter_torch_batches`, as numpy arrays (``batch_format="numpy"`` or
        ``"default"``) or a pandas DataFrame (``"pandas"``), left on the CPU."""
        if batch_format not in ("default", "numpy", "pandas"):
            raise UserError(f"iter_batches(batch_format={batch_format!r}): 'default', 'numpy' or 'pandas'")
        convert = _pandas if batch_format == "pandas" else _numpy
        return self._epoch(convert, False, batch_size, drop_last, local_shuffle_buffer_size, local_shuffle_seed,
                           prefetch_batches)

    def iter_rows(self, *args, **kwargs):
        raise UserError("get_dataset_shard('train').iter_rows(): the training dataset comes in each rank's share of "
                        "every global step; use iter_torch_batches() or iter_batches()")

    def _epoch(self, convert, move: bool, batch_size, drop_last, shuffle_block, shuffle_seed,
               prefetch_batches) -> Iterator[Any]:
        _check_positive("batch_size", batch_size, allow_none=True)
        _check_positive("local_shuffle_buffer_size", shuffle_block, allow_none=True)
        if isinstance(prefetch_batches, bool) or not isinstance(prefetch_batches, int) or prefetch_batches < 0:
            raise UserError(f"prefetch_batches must be a non-negative integer, got {prefetch_batches!r}")
        loader = self._loader_for(drop_last, shuffle_block, shuffle_seed)
        if batch_size is not None:
            say_batch_size(self._session, batch_size, f"get_dataset_shard({self._name!r}): the")
        self._convert = convert
        loader.move_to_device = move
        return iter(loader)

    def _loader_for(self, drop_last: bool, shuffle_block: Optional[int], shuffle_seed: Optional[int]):
        session = self._session
        seed = session.settings.seed if shuffle_seed is None else shuffle_seed
        order = (bool(drop_last), shuffle_block, seed)
        if self._loader is None:
            from hetero_ray.training.data.loader import make_loader

            rows = FeedRows(self._feed, self._name, session, shuffle_block, seed)
            self._loader = make_loader(session, rows, num_workers=0, prefetch_factor=None, shuffle=False,
                                       drop_last=drop_last, collate_fn=self._collate, move_to_device=True,
                                       order_facts={"dataset": self._name, "local_shuffle_buffer_size": shuffle_block,
                                                    "local_shuffle_seed": seed},
                                       data_source=RAY_DATA_SOURCE_PREFIX + self._name)
            rows.epoch_of = lambda: self._loader.epoch
            self._order = order
        elif order != self._order:
            raise UserError(f"get_dataset_shard({self._name!r}): drop_last, local_shuffle_buffer_size and "
                            f"local_shuffle_seed fix the epoch's order and must stay as the first iteration set them "
                            f"({self._order} then {order})")
        return self._loader

    def _collate(self, columns: dict) -> Any:
        return self._convert(columns)

    def _device_moves(self, device) -> bool:
        own = self._session.identity.device
        if device in (None, "auto"):
            return True
        asked = torch.device(device)
        if asked.type == own.type and asked.index in (None, own.index):
            return True
        raise UserError(f"iter_torch_batches(device={device!r}): this rank trains on {own}; leave device='auto'")


class FeedRows:
    """The training dataset as the loader sees it: ``len`` rows, picked by position in
    the epoch's order (contiguous: the loader does not shuffle them)."""

    def __init__(self, feed, name: str, session: WorkerSession, shuffle_block: Optional[int], seed: int):
        self._feed, self._name = feed, name
        identity = session.identity
        self._rank, self._num_workers = identity.rank, identity.num_workers
        self._shuffle_block, self._seed = shuffle_block, seed
        self._window = session.settings.global_batch_size  # step s reads [s·B, (s+1)·B): GlobalSampler.window
        self._count = int(answer(feed.num_rows.remote(), _FEED_TIMEOUT_S))
        self.epoch_of: Callable[[], int] = lambda: 0

    def __len__(self) -> int:
        return self._count

    def __getitems__(self, positions: list[int]) -> dict:
        start, stop = positions[0], positions[-1] + 1
        if stop - start != len(positions):
            raise RuntimeError(f"rows of {self._name!r} asked out of order: {positions[:5]}…")
        return answer(self._feed.rows.remote(self.epoch_of(), start, stop, rank=self._rank,
                                             num_workers=self._num_workers, shuffle_block=self._shuffle_block,
                                             seed=self._seed, window_start=start - start % self._window),
                      _FEED_TIMEOUT_S)

    def __getitem__(self, position: int) -> dict:
        return {k: v[0] for k, v in self.__getitems__([position]).items()}


class EvaluationShard:
    """Ray Train's shard of an evaluation dataset; a rank left out receives rank 0's state
    before it reads (a collective: every rank reads its shard at the same point)."""

    def __init__(self, session: WorkerSession, shard):
        self._session = session
        self._shard = shard

    def iter_torch_batches(self, **kwargs):
        self._session.parts.copy_state_to_left_out_ranks()
        return self._shard.iter_torch_batches(**kwargs)

    def iter_batches(self, **kwargs):
        self._session.parts.copy_state_to_left_out_ranks()
        return self._shard.iter_batches(**kwargs)

    def __getattr__(self, name: str):
        return getattr(self._shard, name)


def _check_positive(what: str, value, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{what} must be a positive integer, got {value!r}")


def _numpy(columns: dict) -> dict:
    return columns


def _pandas(columns: dict):
    import pandas

    return pandas.DataFrame({k: list(v) if v.ndim > 1 else v for k, v in columns.items()})


def _tensors(columns: dict, dtypes) -> dict:
    out = {}
    for name, values in columns.items():
        dtype = dtypes.get(name) if isinstance(dtypes, dict) else dtypes
        if values.dtype == object or values.dtype.kind in "USO":
            raise UserError(f"column {name!r} holds {values.dtype} values, which make no tensor; drop it or pass "
                            "iter_torch_batches(collate_fn=...) that makes tensors of what you need")
        out[name] = torch.as_tensor(np.require(values, requirements=["C", "W"]), dtype=dtype)  # Ray's are read-only
    return out
