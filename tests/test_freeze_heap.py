"""The loader takes what is alive at an epoch's start out of Python's later collections
(training/rank/heap.py ``freeze_heap``): a full collection then walks only what the steps
made, instead of stalling one rank for a quarter of a second at a step of its own; and
the whole heap is walked only every FULL_WALK_EVERY-th epoch start, which frees what was
frozen alive and died since."""

from __future__ import annotations

import gc
import itertools
import weakref

import pytest

from hetero_ray.training.rank import heap
from hetero_ray.training.rank.heap import FULL_WALK_EVERY, freeze_heap


class _Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture(autouse=True)
def first_call():
    """Each test starts at a first call (a full walk), and leaves nothing frozen."""
    heap._calls = itertools.count()
    yield
    gc.unfreeze()


def test_garbage_is_collected_first_and_what_is_alive_is_frozen():
    kept = _Node()
    for call in range(FULL_WALK_EVERY + 1):  # full walks and young collections alike
        garbage = weakref.ref(_Node())  # unreachable already, held only by its own cycle
        freeze_heap()
        assert garbage() is None, f"call {call}: collected before the freeze, not frozen for good"
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())  # out of every generation's walk
        made_later = _Node()
        assert any(o is made_later for o in gc.get_objects())  # the steps' objects are still collected


def test_a_cycle_frozen_alive_and_dropped_later_is_freed_at_the_next_full_walk():
    """Per-epoch objects (an epoch's iterator, its batches' bookkeeping) are alive at the
    freeze and dead one epoch later: frozen for good, their cycles would never be freed."""
    epoch_object = _Node()
    dropped = weakref.ref(epoch_object)
    freeze_heap()  # the epoch starts with it alive
    del epoch_object  # ... and drops it
    for _ in range(FULL_WALK_EVERY - 1):
        freeze_heap()  # the epoch starts that walk only what is not frozen
    assert dropped() is not None, "every epoch start walked the whole heap"
    freeze_heap()  # the next full walk
    assert dropped() is None


def test_what_stays_frozen_is_bounded_by_what_is_alive_not_by_the_epochs_run():
    per_epoch, epochs = 2000, 3 * FULL_WALK_EVERY  # cycles alive at each epoch's start, dropped during it
    frozen = []
    for _ in range(epochs):
        alive = [_Node() for _ in range(per_epoch)]
        freeze_heap()
        frozen.append(gc.get_freeze_count())
        del alive
    # At most FULL_WALK_EVERY epochs' cycles are held frozen at once (frozen for good, the
    # count would grow by an epoch's worth every epoch: 46,000 over these 24).
    assert max(frozen) - min(frozen) <= per_epoch * FULL_WALK_EVERY, frozen
    assert frozen[FULL_WALK_EVERY] - frozen[0] < per_epoch, "a full walk frees the epochs' cycles"
