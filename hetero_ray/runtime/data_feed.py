"""One Ray Dataset read once per epoch and handed out by position: the run's actor behind
``hetero_ray.train.get_dataset_shard("train")``.

Ray Data cannot cut a stream into unequal pieces that follow a plan (``streaming_split``
gives equal or first-come splits), so the training dataset is not split: the feed reads each
epoch in a fixed order (``preserve_order``) and answers ``rows(epoch, start, stop)``, the
pieces of each step's window that the global sampler (:mod:`hetero_ray.sampler`) cuts; the
pipeline's ``map_batches`` runs once per row, not per rank. Position is the whole state: a
request for rows already dropped (a restarted worker group or feed) reads the epoch again and
skips to them. Rows stay until every rank has asked for a later position. Every reading
yields the same rows; the feed applies the epoch's shuffle (``local_shuffle_buffer_size``:
each block of positions, seeded by seed, epoch and block), so the reading it begins
four-fifths through an epoch (:data:`READ_AHEAD_AT`) serves whichever epoch comes next.
Use: docs/api.md#ray-data-datasets-and-get_dataset_shard; why, and figures: docs/benchmarks.md#ray-data
"""

from __future__ import annotations

import threading
from typing import Iterator, Optional

import numpy as np

Batch = dict[str, np.ndarray]

READ_AHEAD_AT = 0.8  # the fraction of an epoch the ranks have asked for when the next reading begins
# Ray Data 2.60 refreshes an execution's resource limits once a second, and its first
# answer is zero (the autoscaling coordinator has not replied yet): a short execution runs
# one map task at a time through its first second, a whole small epoch serial.
RESOURCE_LIMITS_REFRESH_S = 0.1


def _refresh_resource_limits_sooner() -> None:
    """The feed's executions ask for their resource limits every
    :data:`RESOURCE_LIMITS_REFRESH_S` (a class attribute of Ray Data's, set in the feed's
    process; a Ray without it is left as it is)."""
    try:
        from ray.data._internal.execution.resource_manager import ResourceManager
    except ImportError:
        return
    interval = getattr(ResourceManager, "GLOBAL_LIMITS_UPDATE_INTERVAL_S", None)
    if isinstance(interval, (int, float)) and interval > RESOURCE_LIMITS_REFRESH_S:
        ResourceManager.GLOBAL_LIMITS_UPDATE_INTERVAL_S = RESOURCE_LIMITS_REFRESH_S


class DataFeed:
    """The positions of one dataset's epochs, for every rank (the body of a Ray actor).

    Args:
        dataset: a ``ray.data.Dataset``; read with ``preserve_order`` on a copy.
        name: the dataset's name in ``HeteroTrainer(datasets=...)``, for messages.
        read_batch_size: rows per batch read from Ray Data (its unit of prefetching).
    """

    def __init__(self, dataset, name: str, read_batch_size: int = 256):
        dataset = dataset.copy(dataset)
        context = dataset.context
        context.execution_options.preserve_order = True
        # Read once per epoch in the actor, whose log nobody watches: no progress bars there.
        context.enable_progress_bars = context.print_on_execution_start = False
        _refresh_resource_limits_sooner()
        self._dataset = dataset
        self._name = name
        self._read_batch_size = read_batch_size
        self._count: Optional[int] = None
        self._lock = threading.Lock()
        self._epochs: dict[int, _EpochRows] = {}
        self._ahead: Optional[_ReadAhead] = None  # the next reading, begun (at most one)

    def num_rows(self) -> int:
        """The rows of one epoch (counted once: a pipeline with ``map_batches`` runs for it)."""
        with self._lock:
            if self._count is None:
                self._count = int(self._dataset.count())
            return self._count

    def rows(self, epoch: int, start: int, stop: int, *, rank: int, num_workers: int,
             shuffle_block: Optional[int] = None, seed: int = 0, window_start: Optional[int] = None) -> Batch:
        """Positions ``[start, stop)`` of ``epoch``'s order, as numpy columns.

        ``window_start``: the first position of the step's window that holds them. A reading
        begun for this request keeps the rows from there, so the other ranks' pieces of the
        same step, asked in any order, are served from it (else a rank asking for an earlier
        piece makes the feed read the whole epoch again).
        """
        count = self.num_rows()
        if not 0 <= start < stop <= count:
            raise IndexError(f"rows [{start}, {stop}) of dataset {self._name!r}, which has {count}")
        keep_from = start if window_start is None else min(window_start, start)
        with self._lock:
            rows = self._epochs.get(epoch)
            if rows is None or rows.settings != (shuffle_block, seed) or start < rows.first_kept:
                if rows is not None:
                    rows.close()
                rows = _EpochRows(self._read(), epoch, count, self._name, shuffle_block, seed, skip_to=keep_from)
                self._epochs[epoch] = rows
            for older in [e for e in self._epochs if e < epoch]:
                self._epochs[older].forget_rank(rank)
                if self._epochs[older].unused:
                    self._epochs.pop(older).close()
            out = rows.take(start, stop, rank, num_workers)
            # Not on an epoch's last step: the next epoch's first request comes right after it.
            if self._ahead is None and count * READ_AHEAD_AT <= stop < count:
                self._ahead = _ReadAhead(self._read())
            return out

    def close(self) -> None:
        """Stops every reading the feed holds, the one read ahead included (the run's end)."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
            if ahead is not None:
                ahead.close()
            while self._epochs:
                self._epochs.popitem()[1].close()

    def _read(self) -> Iterator[Batch]:
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            return ahead
        return iter(self._dataset.iter_batches(batch_size=self._read_batch_size, batch_format="numpy"))


class _ReadAhead:
    """A reading whose execution starts now, in a thread (its first batch is a wait of
    ~0.3 s), while the ranks train on the rows read before it."""

    def __init__(self, batches: Iterator[Batch]):
        self._batches = batches
        self._first: list[Batch] = []
        self._error: Optional[BaseException] = None
        self._started = threading.Thread(target=self._start, name="data-feed-read-ahead", daemon=True)
        self._started.start()

    def _start(self) -> None:
        try:
            self._first.append(next(self._batches))
        except StopIteration:
            pass
        except BaseException as e:  # noqa: BLE001 - raised where the reading is used
            self._error = e

    def __iter__(self) -> "_ReadAhead":
        return self

    def __next__(self) -> Batch:
        self._started.join()
        if self._error is not None:
            raise self._error
        return self._first.pop() if self._first else next(self._batches)

    def close(self) -> None:
        self._started.join()  # a generator running in another thread cannot be closed
        _close(self._batches)


class _EpochRows:
    """One reading of an epoch: its positions from ``first_kept`` on, read as far as asked."""

    def __init__(self, batches: Iterator[Batch], epoch: int, count: int, name: str,
                 shuffle_block: Optional[int], seed: int, skip_to: int):
        self.settings = (shuffle_block, seed)
        self._batches = batches
        self._epoch, self._count, self._name, self._seed = epoch, count, name, seed
        self._block = shuffle_block or 0
        start = skip_to - skip_to % self._block if self._block else skip_to  # a block is shuffled whole
        self.first_kept = self._end = start  # positions [first_kept, _end) are held in _chunks
        self._chunks: list[tuple[int, Batch]] = []  # (first position, columns), contiguous
        self._pending: list[Batch] = []  # rows read from Ray Data and not yet placed
        self._read = 0  # rows read from Ray Data
        self._exhausted = False
        self._asked: dict[int, int] = {}  # rank → the first position of its latest request
        self._skip(start)

    @property
    def unused(self) -> bool:
        return not self._asked

    def close(self) -> None:
        """Stops the reading's Ray Data execution now, not when the garbage collector finds it."""
        _close(self._batches)

    def forget_rank(self, rank: int) -> None:
        self._asked.pop(rank, None)

    def take(self, start: int, stop: int, rank: int, num_workers: int) -> Batch:
        self._asked[rank] = start
        self._fill(stop)
        out = _concat([_cut(columns, first, start, stop) for first, columns in self._chunks
                       if first < stop and first + _len(columns) > start])
        if len(self._asked) == num_workers:  # every rank is past the rows before its slowest one
            self._drop_before(min(self._asked.values()))
        return out

    def _skip(self, rows: int) -> None:
        """Reads past the first ``rows`` rows (a resume): only what follows them is kept."""
        while self._read < rows:
            batch = self._read_batch()
            if batch is None:
                self._mismatch()
            n = _len(batch)
            if self._read + n > rows:
                self._pending.append(_cut(batch, self._read, rows, self._read + n))
            self._read += n

    def _fill(self, stop: int) -> None:
        while self._end < stop:
            rows = _concat(self._pending)
            n = _len(rows)
            size = self._block or n
            if n and (n >= size or self._exhausted):
                size = min(size, n)
                head, tail = _cut(rows, 0, 0, size), _cut(rows, 0, size, n)
                if self._block:
                    order = np.random.default_rng([self._seed, self._epoch, self._end // self._block]).permutation(size)
                    head = {k: v[order] for k, v in head.items()}
                self._chunks.append((self._end, head))
                self._end += size
                self._pending = [tail] if _len(tail) else []
                continue
            batch = self._read_batch()
            if batch is None:
                if not n:
                    self._mismatch()
                continue
            self._read += _len(batch)
            self._pending.append(batch)

    def _read_batch(self) -> Optional[Batch]:
        if self._exhausted:
            return None
        try:
            return next(self._batches)
        except StopIteration:
            self._exhausted = True
            if self._read != self._count:
                self._mismatch()
            return None

    def _mismatch(self):
        raise RuntimeError(f"dataset {self._name!r} gave {self._read} rows in epoch {self._epoch}, but was counted "
                           f"at {self._count}: its pipeline must give the same rows in every reading (no random "
                           "filter or sampling in it)")

    def _drop_before(self, position: int) -> None:
        while self._chunks and self._chunks[0][0] + _len(self._chunks[0][1]) <= position:
            self._chunks.pop(0)
        self.first_kept = self._chunks[0][0] if self._chunks else self._end


def _close(batches: Iterator[Batch]) -> None:
    close = getattr(batches, "close", None)  # Ray Data's iterator is a generator: close() stops its execution
    if close is not None:
        close()


def _len(columns: Batch) -> int:
    return len(next(iter(columns.values()))) if columns else 0


def _cut(columns: Batch, first: int, start: int, stop: int) -> Batch:
    """Positions ``[start, stop)`` of columns whose first row is at position ``first``."""
    lo, hi = max(start - first, 0), min(stop - first, _len(columns))
    return {k: v[lo:hi] for k, v in columns.items()}


def _concat(parts: list[Batch]) -> Batch:
    parts = [p for p in parts if _len(p)]
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}
