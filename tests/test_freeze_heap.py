"""The loader takes what is alive at an epoch's start out of Python's later collections
(training/loader.py ``freeze_heap``): a full collection then walks only what the steps
made, instead of stalling one rank for a quarter of a second at a step of its own."""

from __future__ import annotations

import gc
import weakref

from hetero_ray.training.loader import freeze_heap


class _Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


def test_garbage_is_collected_first_and_what_is_alive_is_frozen():
    garbage = weakref.ref(_Node())  # unreachable already, held only by its own cycle
    kept = _Node()
    try:
        freeze_heap()
        assert garbage() is None  # collected before the freeze, not frozen for good
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())  # out of every generation's walk
        made_later = _Node()
        assert any(o is made_later for o in gc.get_objects())  # the steps' objects are still collected
    finally:
        gc.unfreeze()


def test_a_cycle_alive_at_one_epoch_start_and_dropped_in_the_epoch_is_collected_at_the_next():
    """Per-epoch objects (an epoch's iterator, its batches' bookkeeping) are alive at the
    freeze and dead one epoch later: frozen for good, their cycles would never be freed."""
    epoch_object = _Node()
    dropped = weakref.ref(epoch_object)
    try:
        freeze_heap()  # the epoch starts with it alive
        del epoch_object  # ... and drops it
        freeze_heap()  # the next epoch's start
        assert dropped() is None
    finally:
        gc.unfreeze()


def test_what_stays_frozen_is_bounded_by_what_is_alive_not_by_the_epochs_run():
    per_epoch = 2000  # cycles alive at each epoch's start, dropped during the epoch
    frozen = []
    try:
        for _ in range(10):
            alive = [_Node() for _ in range(per_epoch)]
            freeze_heap()
            frozen.append(gc.get_freeze_count())
            del alive
        # Each epoch's cycles, frozen at its start, go at the next: the count does not grow
        # by an epoch's worth per epoch (frozen for good, it grew by 18,000 over these 10).
        assert max(frozen) - min(frozen) < per_epoch, frozen
    finally:
        gc.unfreeze()
