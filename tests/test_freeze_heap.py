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
